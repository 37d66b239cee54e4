"""AcpDriver against scripted ACP peers on real sockets (Unix, TLS + bearer token)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from acp import RequestError
from acp.agent.connection import AgentSideConnection
from acp.connection import StreamDirection, StreamEvent
from acp.schema import InitializeResponse, NewSessionResponse, PromptResponse
from acp.schema import Usage as AcpUsage

from prospero.core.drivers import acp as acp_mod
from prospero.core.drivers.acp import (
    ACP_IGNORED_UPDATES,
    ACP_LATE_TOOL_INPUT,
    ACP_PERMISSION_REQUESTS,
    ACP_TURNS_LOST,
    ACP_UNKNOWN_STOP_REASONS,
    ACP_UNKNOWN_UPDATES,
    ACP_UNSERVED_REQUESTS,
    NOT_RESUMABLE_DETAIL,
    AcpDriver,
    DriverConflict,
    active_driver,
    render_content,
)
from prospero.core.drivers.base import DriverExit, DriverOptions, DriverTarget
from prospero.core.errors import InvalidState
from prospero.core.ownership import Lease
from prospero.core.wire.control import Endpoint, UnixEndpoint
from prospero.testkit import acp_scripts as S
from prospero.testkit.certs import make_certs
from prospero.types.events import (
    AgentFinished,
    AgentInit,
    Output,
    StreamGap,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnLost,
    Usage,
)
from tests.conformance.agent_driver import Recorder
from tests.core.acp_support import OPTS, MemoryCursorStore, Rig, ScriptedBroker, new_agent_id, rig
from tests.support import wait_until

__all__ = ["rig"]  # the shared fixture

T = 15.0


def turns_of(rec: Recorder) -> list[tuple[int, str | None]]:
    return [(e.turn, e.stop_reason) for e in rec.events if isinstance(e, TurnFinished)]


def tools_of(rec: Recorder) -> list[tuple[str, str, Any]]:
    out: list[tuple[str, str, Any]] = []
    for e in rec.events:
        if isinstance(e, ToolStarted):
            out.append(("start", e.id, e.input))
        elif isinstance(e, ToolFinished):
            out.append(("finish", e.id, (e.ok, e.result.text if e.result else None)))
    return out


class WireLog:
    """A raw observer (`observers=`): every JSON-RPC message, both directions."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, ev: StreamEvent) -> None:
        self.messages.append((ev.direction.value, ev.message))

    def incoming_updates(self) -> list[str]:
        return [
            m["params"]["update"].get("sessionUpdate")
            for d, m in self.messages
            if d == StreamDirection.INCOMING.value and m.get("method") == "session/update"
        ]

    def outgoing_results(self) -> list[Any]:
        return [
            m.get("result")
            for d, m in self.messages
            if d == StreamDirection.OUTGOING.value and "method" not in m
        ]


# ---- the full turn ----------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["unix", "tls"])
async def test_full_turn_mapping_in_wire_order(rig: Rig, transport: str) -> None:
    peer = await rig.peer(
        S.default_acp_script(), tls=make_certs() if transport == "tls" else None, model="m-1"
    )
    rec = Recorder()
    driver = rig.driver(rig.target(peer, prompt="Tidy the docs"), rec)
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    assert rec.kinds() == [
        "agent_init",
        "output",  # thinking
        "output",
        "tool_started",
        "tool_finished",
        "output",
        "tool_started",
        "tool_finished",
        "output",
        "turn_finished",
        "agent_finished",
    ]
    init = rec.events[0]
    assert isinstance(init, AgentInit)
    assert init.session_id == driver.session_id and init.model == "m-1" and init.tools == []
    assert rec.thinking() == ["Check the README before changing anything."]
    assert rec.stdout() == [
        "Let me read the README first.",
        " The README describes a tiny project.",
        " Skipped the changelog edit.",
    ]
    # rawInput arrived late (in an update): tool_started carries it, in wire position.
    assert tools_of(rec) == [
        ("start", "call_read", {"path": "README.md"}),
        ("finish", "call_read", (True, '{"content": "# demo\\nA tiny project.\\n"}')),
        ("start", "call_edit", {"path": "CHANGELOG.md", "content": "## Unreleased\n- docs\n"}),
        ("finish", "call_edit", (False, "User refused permission")),  # default deny
    ]
    assert [e.name for e in rec.events if isinstance(e, ToolStarted)] == [
        "Read README.md",
        "Edit CHANGELOG.md",
    ]
    turn = rec.events[-2]
    assert isinstance(turn, TurnFinished)
    assert (turn.turn, turn.stop_reason, turn.model) == (0, "end_turn", "m-1")
    assert turn.usage is None  # ACP reported no tokens: null, never 0
    assert turn.cost_usd == pytest.approx(0.0123)
    end = rec.events[-1]
    assert isinstance(end, AgentFinished)
    assert (end.outcome, end.turns, end.usage, end.model) == ("EndOfTurn", 1, None, "m-1")
    assert end.cost_usd == pytest.approx(0.0123)
    agent = peer.agent
    assert agent.prompts == ["Tidy the docs"]
    assert agent.inits[0]["client_info"]["name"] == "prospero"
    assert agent.sessions[driver.session_id or ""].cwd == rig.dir
    assert [o["option_id"] for o in agent.permission_outcomes] == ["reject-once"]
    assert agent.closes == [driver.session_id]  # session/close, advertised by the peer
    assert rig.metrics.get(ACP_PERMISSION_REQUESTS) == 1
    assert rig.metrics.get(ACP_IGNORED_UPDATES) == 2  # the two plans
    assert driver.finished and active_driver(driver.target.agent_id) is None


async def test_allowed_permission_reaches_the_agent(rig: Rig) -> None:
    peer = await rig.peer(S.default_acp_script())
    broker = ScriptedBroker("allow")
    rec = Recorder()
    target = rig.target(peer, posture="supervised")
    driver = rig.driver(target, rec, broker=broker)
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    assert tools_of(rec)[-1] == ("finish", "call_edit", (True, '{"success": true}'))
    assert rec.stdout()[-1] == " Updated the changelog."
    (req,) = broker.requests
    assert (req.agent_id, req.session_id, req.posture, req.turn) == (
        target.agent_id,
        driver.session_id,
        "supervised",
        0,
    )
    assert (req.tool_call.id, req.tool_call.title, req.tool_call.kind) == (
        "call_edit",
        "Edit CHANGELOG.md",
        "edit",
    )
    assert req.tool_call.input == {"path": "CHANGELOG.md", "content": "## Unreleased\n- docs\n"}
    assert [(o.option_id, o.kind) for o in req.options][:2] == [
        ("allow-once", "allow_once"),
        ("allow-always", "allow_always"),
    ]
    assert peer.agent.permission_outcomes[0]["allow"] is True


async def test_default_deny_without_a_reject_option_answers_cancelled(rig: Rig) -> None:
    only_allow = [{"option_id": "yes", "name": "Yes", "kind": "allow_once"}]
    turn = [
        S.tool_call("t1", "Write", "edit", raw_input={"path": "x"}),
        S.permission("t1", options=only_allow, on_allow=[S.text("wrote")]),
        S.text("unreachable"),
    ]
    peer = await rig.peer(S.AcpScript(turns=[turn]))
    rec = Recorder()
    driver = rig.driver(rig.target(peer), rec)
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    assert peer.agent.permission_outcomes[0]["outcome"] == "cancelled"
    # The agent ended the turn `cancelled`; the call it left open is closed explicitly.
    assert turns_of(rec) == [(0, "cancelled")]
    assert tools_of(rec) == [
        ("start", "t1", {"path": "x"}),
        (
            "finish",
            "t1",
            (False, "cancelled: the turn was cancelled before the tool call completed"),
        ),
    ]
    end = rec.events[-1]
    assert isinstance(end, AgentFinished) and end.outcome == "Cancelled"


# ---- bad transport input ----------------------------------------------------------------


@pytest.mark.parametrize("failure", ["wrong_token", "wrong_ca"])
async def test_wrong_token_or_ca_gives_up_after_the_budget(
    rig: Rig, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    certs = make_certs()
    peer = await rig.peer(S.simple_script("never"), tls=certs)
    from prospero.core.transport import NetworkSecurity

    if failure == "wrong_token":
        sec = NetworkSecurity(ca_pem=certs.ca_pem, server_name="localhost", token="nope")
    else:
        sec = NetworkSecurity(
            ca_pem=make_certs().ca_pem, server_name="localhost", token="s3cret-acp"
        )
    opts = DriverOptions(backoff_base=0.005, backoff_cap=0.01, max_failures=3)
    rec = Recorder()
    driver = rig.driver(rig.target(peer, security=sec), rec, opts)
    caplog.set_level(logging.INFO, logger="prospero.core.drivers.acp")
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.gave_up
    assert rec.events == [] and peer.resolves == 3
    giving_up = [r.getMessage() for r in caplog.records if "giving up" in r.getMessage()]
    assert len(giving_up) == 1
    if failure == "wrong_token":
        assert "initialize: the connection closed (wrong token?)" in giving_up[0]
        await wait_until(lambda: peer.listener.auth_failures == 3, 5)
    else:
        assert "TLS failure" in giving_up[0]
    assert peer.listener.agent is None  # no session was ever opened


async def test_unreachable_endpoint_gives_up_and_close_interrupts_backoff(rig: Rig) -> None:
    peer = await rig.peer(S.simple_script("x"))
    peer.endpoint = UnixEndpoint(path=f"{rig.dir}/nobody.sock")
    opts = DriverOptions(backoff_base=0.005, backoff_cap=0.01, max_failures=3)
    driver = rig.driver(rig.target(peer), Recorder(), opts)
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.gave_up
    slow = DriverOptions(backoff_base=60, backoff_cap=60, max_failures=3)
    d2 = rig.driver(rig.target(peer), Recorder(), slow)
    task = asyncio.create_task(d2.run())
    await wait_until(lambda: peer.resolves >= 4, T)
    await asyncio.wait_for(d2.close(), T)
    assert await asyncio.wait_for(task, T) is DriverExit.closed


# ---- steering ---------------------------------------------------------------------------


async def test_send_input_is_queued_while_a_turn_runs(rig: Rig) -> None:
    turn0 = [
        S.text("working"),
        S.tool_call("w1", "Write", "edit", raw_input={"path": "a"}),
        S.permission("w1", on_reject=[S.text(" skipped")]),
    ]
    peer = await rig.peer(S.AcpScript(turns=[turn0]))
    broker = ScriptedBroker("hold")
    rec = Recorder()
    driver = rig.driver(rig.target(peer, interactive=True), rec, broker=broker)
    task = asyncio.create_task(driver.run())
    await wait_until(lambda: len(broker.requests) == 1, T, what="permission pending")
    await driver.send_input("first")
    await driver.send_input("second")
    assert peer.agent.prompts == ["do the thing"]  # queued, not sent: a turn is running
    broker.release()
    await wait_until(lambda: len(turns_of(rec)) == 3, T, what="three turns")
    assert peer.agent.prompts == ["do the thing", "first", "second"]
    assert rec.stdout() == ["working", " skipped", "echo: first", "echo: second"]
    assert turns_of(rec) == [(0, "end_turn"), (1, "end_turn"), (2, "end_turn")]
    assert not driver.finished
    await driver.end_input()
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    end = rec.events[-1]
    assert isinstance(end, AgentFinished) and (end.outcome, end.turns) == ("EndOfTurn", 3)
    assert peer.agent.closes == [driver.session_id]
    with pytest.raises(InvalidState):
        await driver.send_input("too late")


async def test_end_input_before_any_input_and_inputs_queued_before_it(rig: Rig) -> None:
    peer = await rig.peer(S.simple_script("hello"))
    rec = Recorder()
    driver = rig.driver(rig.target(peer, interactive=True), rec)
    await driver.send_input("queued before run")
    await driver.end_input()
    await driver.end_input()  # idempotent
    with pytest.raises(InvalidState):
        await driver.send_input("after end")
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    assert peer.agent.prompts == ["do the thing", "queued before run"]
    assert rec.stdout() == ["hello", "echo: queued before run"]
    assert turns_of(rec) == [(0, "end_turn"), (1, "end_turn")]


async def test_cancel_turn_sends_session_cancel_and_closes_open_calls(rig: Rig) -> None:
    turn0 = [
        S.text("start"),
        S.tool_call("t1", "Sleep", "execute", raw_input={"secs": 3600}),
        S.sleep(3600),
    ]
    peer = await rig.peer(S.AcpScript(turns=[turn0]))
    rec = Recorder()
    driver = rig.driver(rig.target(peer), rec)
    await driver.cancel_turn()  # nothing in flight yet: a no-op
    task = asyncio.create_task(driver.run())
    await wait_until(lambda: "tool_started" in rec.kinds(), T)
    assert driver.turn_in_flight == 0
    await driver.cancel_turn()
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    assert peer.agent.cancels == [driver.session_id]
    assert turns_of(rec) == [(0, "cancelled")]
    assert tools_of(rec)[-1] == (
        "finish",
        "t1",
        (False, "cancelled: the turn was cancelled before the tool call completed"),
    )
    end = rec.events[-1]
    assert isinstance(end, AgentFinished) and end.outcome == "Cancelled"


async def test_cancel_while_a_permission_is_pending(rig: Rig) -> None:
    turn0 = [
        S.tool_call("e1", "Edit", "edit", raw_input={"path": "f"}),
        S.permission("e1", on_allow=[S.text("edited")]),
    ]
    peer = await rig.peer(S.AcpScript(turns=[turn0]))
    broker = ScriptedBroker("hold")
    wire = WireLog()
    rec = Recorder()
    driver = rig.driver(rig.target(peer), rec, broker=broker, observers=[wire])
    task = asyncio.create_task(driver.run())
    await wait_until(lambda: len(broker.requests) == 1, T)
    await driver.cancel_turn()
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    # The pending request was answered `cancelled` (ACP requires it after session/cancel).
    assert {"outcome": {"outcome": "cancelled"}} in wire.outgoing_results()
    assert "edited" not in rec.stdout()
    assert turns_of(rec) == [(0, "cancelled")]
    assert peer.agent.permission_outcomes[0]["outcome"] in ("cancelled", "abandoned")


# ---- failures mid-session ----------------------------------------------------------------


async def test_crash_mid_turn_records_turn_lost_then_rejoins_without_replay(rig: Rig) -> None:
    turn0 = [
        S.text("before"),
        S.tool_call("t1", "Read", "read", raw_input={"path": "a"}),
        S.crash(),
    ]
    peer = await rig.peer(S.AcpScript(turns=[turn0]))
    rec = Recorder()
    driver = rig.driver(rig.target(peer), rec)
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    assert rec.kinds() == [
        "agent_init",
        "output",
        "tool_started",
        "tool_finished",
        "turn_lost",
        "agent_finished",
    ]
    fin = rec.events[3]
    assert isinstance(fin, ToolFinished) and not fin.ok and fin.result is not None
    assert fin.result.text.startswith("abandoned: the connection to the agent was lost mid-turn")
    lost = rec.events[4]
    assert isinstance(lost, TurnLost) and lost.turn == 0 and "lost mid-turn" in lost.reason
    end = rec.events[-1]
    assert isinstance(end, AgentFinished)
    assert (end.outcome, end.turns) == ("Error", 1)
    assert end.detail is not None and end.detail.startswith("turn 0 was lost")
    # Rejoined with session/load; the replayed history was not emitted again.
    assert peer.agent.loads == [driver.session_id] and driver.resumed == 1
    assert driver.replayed_updates >= 3 and rec.stdout() == ["before"]
    assert rig.metrics.get(ACP_TURNS_LOST) == 1


async def test_agent_exit_mid_turn_is_a_lost_turn_and_the_driver_gives_up(rig: Rig) -> None:
    peer = await rig.peer(S.AcpScript(turns=[[S.text("bye"), S.exit_(1)]]))
    rec = Recorder()
    opts = DriverOptions(backoff_base=0.005, backoff_cap=0.01, max_failures=3)
    driver = rig.driver(rig.target(peer), rec, opts)
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.gave_up
    assert rec.kinds() == ["agent_init", "output", "turn_lost"]
    assert peer.listener.exit_code == 1
    assert not driver.finished


async def test_unknown_update_and_stop_reason_are_recorded_not_fatal(rig: Rig) -> None:
    turn0 = [
        S.text("a"),
        S.unknown_update("notice", message="hello from the future"),
        S.text("b"),
        S.stop("bogus_reason"),
    ]
    peer = await rig.peer(S.AcpScript(turns=[turn0]))
    wire = WireLog()
    rec = Recorder()
    driver = rig.driver(rig.target(peer), rec, observers=[wire])
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    assert rec.stdout() == ["a", "b"]
    assert turns_of(rec) == [(0, "bogus_reason")]
    end = rec.events[-1]
    assert isinstance(end, AgentFinished) and end.outcome == "Unknown"
    assert end.detail == "agent stop reason 'bogus_reason'"
    assert rig.metrics.get(ACP_UNKNOWN_UPDATES) == 1
    assert rig.metrics.get(ACP_UNKNOWN_STOP_REASONS) == 1
    assert [u["what"] for u in driver.unrecognized] == ["update", "stop_reason"]
    assert driver.unrecognized[0]["raw"]["sessionUpdate"] == "notice"
    assert "notice" in wire.incoming_updates()  # the raw observer saw it too


# ---- agent -> client requests, tokens, prompt errors (a hand-written SDK agent) -----------


class CallbackAgent:
    """An ACP agent (SDK agent side) that calls back into the client on every prompt and
    reports token usage; the prompt "fail" is refused with -32000."""

    def __init__(self) -> None:
        self.conn: Any = None
        self.codes: dict[str, int | None] = {}

    def bind(self, conn: Any) -> CallbackAgent:
        self.conn = conn
        return self

    async def initialize(self, protocol_version: int, **kw: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=1)

    async def new_session(self, cwd: str, **kw: Any) -> NewSessionResponse:
        return NewSessionResponse(session_id="cb-1")

    async def prompt(self, session_id: str, prompt: list[Any], **kw: Any) -> PromptResponse:
        text = "".join(getattr(b, "text", "") for b in prompt)
        if text == "fail":
            raise RequestError.auth_required({"hint": "log in"})
        calls = {
            "fs/read_text_file": lambda: self.conn.read_text_file(session_id=session_id, path="/x"),
            "fs/write_text_file": lambda: self.conn.write_text_file(
                session_id=session_id, path="/x", content="y"
            ),
            "terminal/create": lambda: self.conn.create_terminal(
                session_id=session_id, command="ls"
            ),
            "terminal/output": lambda: self.conn.terminal_output(
                session_id=session_id, terminal_id="t"
            ),
            "terminal/release": lambda: self.conn.release_terminal(
                session_id=session_id, terminal_id="t"
            ),
            "_vendor/thing": lambda: self.conn.ext_method("vendor/thing", {}),
        }
        for name, call in calls.items():
            try:
                await call()
                self.codes[name] = None
            except RequestError as e:
                self.codes[name] = e.code
        return PromptResponse(
            stop_reason="end_turn",
            usage=AcpUsage(
                total_tokens=30, input_tokens=20, output_tokens=10, cached_read_tokens=5
            ),
        )


async def test_unserved_requests_get_method_not_found_and_tokens_are_kept(rig: Rig) -> None:
    agent = CallbackAgent()

    async def on_connect(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        asc = AgentSideConnection(agent.bind, w, r, listening=False)
        try:
            await asc.listen()
        finally:
            await asc.close()
            w.close()

    path = f"{rig.dir}/cb.sock"
    server = await asyncio.start_unix_server(on_connect, path=path)

    async def resolve() -> Endpoint:
        return UnixEndpoint(path=path)

    try:
        rec = Recorder()
        target = DriverTarget(new_agent_id(), "ws", resolve, interactive=True, working_dir="/tmp")
        driver = rig.driver(target, rec)
        await driver.send_input("go")
        await driver.send_input("fail")
        await driver.end_input()
        assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    finally:
        server.close()
    assert agent.codes == dict.fromkeys(agent.codes, -32601) and len(agent.codes) == 6
    assert rig.metrics.get(ACP_UNSERVED_REQUESTS) == 6
    assert turns_of(rec) == [(0, "end_turn"), (1, "error")]
    t0 = rec.events[1]
    assert isinstance(t0, TurnFinished)
    assert t0.usage == Usage(input_tokens=20, output_tokens=10, cache_read_input_tokens=5)
    assert t0.cost_usd is None  # no usage_update cost: not reported
    end = rec.events[-1]
    assert isinstance(end, AgentFinished)
    # -32000 on a prompt: no advertised method to authenticate with -> auth_required at once
    assert (end.outcome, end.turns) == ("auth_required", 2)
    assert end.detail is not None and "advertised methods: none" in end.detail
    assert end.usage == t0.usage and end.cost_usd is None
    assert isinstance(rec.events[0], AgentInit) and rec.events[0].model == ""


# ---- tool-call edge cases ------------------------------------------------------------------


async def test_late_input_after_the_hold_keeps_wire_order(rig: Rig) -> None:
    turn0 = [
        S.tool_call("t1", "Read", "read"),  # no rawInput yet
        S.text("meanwhile"),
        S.permission("t2", title="Run ls", kind="execute", raw_input={"cmd": "ls"}),
        S.tool_update("t1", raw_input={"path": "late"}, status="completed", raw_output="ok"),
    ]
    peer = await rig.peer(S.AcpScript(turns=[turn0]))
    broker = ScriptedBroker("hold")
    rec = Recorder()
    driver = rig.driver(rig.target(peer), rec, broker=broker, tool_input_hold=0.1)
    task = asyncio.create_task(driver.run())
    await wait_until(lambda: len(broker.requests) == 1, T)
    # The hold expired: t1 went out without input, before the text that followed it.
    await wait_until(lambda: rec.kinds().count("tool_started") == 2, T)
    assert rec.kinds()[1:4] == ["tool_started", "output", "tool_started"]
    assert tools_of(rec)[:2] == [("start", "t1", None), ("start", "t2", {"cmd": "ls"})]
    broker.release()
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    assert rig.metrics.get(ACP_LATE_TOOL_INPUT) == 1
    # t2 was announced only by its permission request (codex-acp does that); the agent left it
    # open after the reject, so it is closed at the turn's end.
    assert tools_of(rec)[2:] == [
        ("finish", "t1", (True, "ok")),
        (
            "finish",
            "t2",
            (False, "abandoned: the turn ended (end_turn) before the tool call completed"),
        ),
    ]


async def test_unannounced_update_synthesizes_a_start_and_open_calls_close(rig: Rig) -> None:
    turn0 = [
        S.tool_update("ghost", status="in_progress", title="Ghost", raw_input={"a": 1}),
        S.tool_call("t2", "Slow", "execute", raw_input={}),
        S.tool_call("t2", "Slow (renamed)"),  # a repeated tool_call is an upsert
        S.stop("max_tokens"),
    ]
    peer = await rig.peer(S.AcpScript(turns=[turn0]))
    rec = Recorder()
    driver = rig.driver(rig.target(peer), rec)
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    abandoned = "abandoned: the turn ended (max_tokens) before the tool call completed"
    assert tools_of(rec) == [
        ("start", "ghost", {"a": 1}),
        ("start", "t2", {}),
        ("finish", "ghost", (False, abandoned)),
        ("finish", "t2", (False, abandoned)),
    ]
    assert [e.name for e in rec.events if isinstance(e, ToolStarted)] == ["Ghost", "Slow (renamed)"]
    end = rec.events[-1]
    assert isinstance(end, AgentFinished) and end.outcome == "MaxTokensExhausted"


def test_render_content_flattens_text_diff_and_terminal() -> None:
    from acp.schema import ContentToolCallContent, FileEditToolCallContent, TerminalToolCallContent

    items = [
        ContentToolCallContent.model_validate(
            {"type": "content", "content": {"type": "text", "text": "hello"}}
        ),
        FileEditToolCallContent.model_validate(
            {"type": "diff", "path": "/a.txt", "oldText": "x\n", "newText": "y\n"}
        ),
        TerminalToolCallContent.model_validate({"type": "terminal", "terminalId": "term-1"}),
    ]
    text = render_content(items)
    assert text.splitlines()[0] == "hello"
    assert "-x" in text and "+y" in text and text.endswith("[terminal term-1]")


async def test_long_results_are_truncated(rig: Rig) -> None:
    big = "x" * 10_000
    turn0 = [
        S.tool_call("t", "Cat", "read", raw_input={"p": 1}),
        S.tool_update("t", status="completed", content=big),
    ]
    peer = await rig.peer(S.AcpScript(turns=[turn0]))
    rec = Recorder()
    assert await asyncio.wait_for(rig.driver(rig.target(peer), rec).run(), T) is DriverExit.finished
    fin = next(e for e in rec.events if isinstance(e, ToolFinished))
    assert fin.result is not None and fin.result.truncated and len(fin.result.text) == 8192


# ---- usage and cost --------------------------------------------------------------------------


async def test_cost_is_a_per_turn_delta_of_the_cumulative_usd_cost(rig: Rig) -> None:
    script = S.AcpScript(
        turns=[
            [S.text("a"), S.usage(100, 1000, cost=0.01)],
            [S.usage(200, 1000, cost=0.015), S.usage(300, 1000, cost=0.03)],
            [S.text("no usage this turn")],
        ]
    )
    peer = await rig.peer(script)
    rec = Recorder()
    driver = rig.driver(rig.target(peer, interactive=True), rec)
    await driver.send_input("two")
    await driver.send_input("three")
    await driver.end_input()
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    costs = [e.cost_usd for e in rec.events if isinstance(e, TurnFinished)]
    assert costs[0] == pytest.approx(0.01) and costs[1] == pytest.approx(0.02)
    assert costs[2] is None
    end = rec.events[-1]
    assert isinstance(end, AgentFinished) and end.cost_usd == pytest.approx(0.03)


async def test_prompt_response_usage_through_the_sdk(rig: Rig) -> None:
    """Tokens an agent reports on its prompt responses (unstable `PromptResponse.usage`,
    serialized by the SDK's agent side) become per-turn usage and the run's sum; a turn
    without them is null, not 0."""
    script = S.AcpScript(
        turns=[
            [S.text("a"), S.stop("end_turn", input_tokens=120, output_tokens=30)],
            [S.text("b")],
            [S.stop("end_turn", input_tokens=200, output_tokens=5, cached_read_tokens=100)],
        ]
    )
    peer = await rig.peer(script)
    rec = Recorder()
    driver = rig.driver(rig.target(peer, interactive=True), rec)
    await driver.send_input("two")
    await driver.send_input("three")
    await driver.end_input()
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    usages = [e.usage for e in rec.events if isinstance(e, TurnFinished)]
    assert usages == [
        Usage(input_tokens=120, output_tokens=30),
        None,
        Usage(input_tokens=200, output_tokens=5, cache_read_input_tokens=100),
    ]
    end = rec.events[-1]
    assert isinstance(end, AgentFinished)
    assert end.usage == Usage(input_tokens=320, output_tokens=35, cache_read_input_tokens=100)


async def test_cost_in_another_currency_stays_null(rig: Rig) -> None:
    peer = await rig.peer(S.AcpScript(turns=[[S.usage(1, 10, cost=1.5, currency="EUR")]]))
    rec = Recorder()
    assert await asyncio.wait_for(rig.driver(rig.target(peer), rec).run(), T) is DriverExit.finished
    turn, end = rec.events[-2], rec.events[-1]
    assert isinstance(turn, TurnFinished) and turn.cost_usd is None
    assert isinstance(end, AgentFinished) and end.cost_usd is None


# ---- single driver and ownership ----------------------------------------------------------------


async def test_one_driver_per_agent_in_a_process(rig: Rig) -> None:
    peer = await rig.peer(S.AcpScript(turns=[[S.text("x"), S.sleep(3600)]]))
    target = rig.target(peer)
    first = rig.driver(target, Recorder())
    assert active_driver(target.agent_id) is first
    with pytest.raises(DriverConflict) as err:
        AcpDriver(target, Recorder(), OPTS, rig.metrics)
    assert err.value.kind == "conflict" and target.agent_id in str(err.value)
    task = asyncio.create_task(first.run())
    await wait_until(lambda: first.turn_in_flight == 0, T)
    with pytest.raises(DriverConflict):
        await first.run()  # the same driver, twice at once
    await first.close()
    assert await asyncio.wait_for(task, T) is DriverExit.closed
    assert active_driver(target.agent_id) is None
    second = rig.driver(target, Recorder())  # released on close
    assert active_driver(target.agent_id) is second


async def test_a_refused_lease_opens_no_session(rig: Rig) -> None:
    class Refuse:
        shared = True  # another replica holds every lease

        def __init__(self) -> None:
            self.asked: list[str] = []

        async def try_acquire(self, key: str) -> Lease | None:
            self.asked.append(key)
            return None

        async def release(self, key: str) -> None:
            return None

        def owns(self, key: str) -> bool:
            return False

    peer = await rig.peer(S.simple_script("x"))
    own = Refuse()
    target = rig.target(peer)
    driver = rig.driver(target, Recorder(), ownership=own)
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.closed
    assert own.asked == [target.agent_id]
    assert peer.resolves == 0 and peer.listener.connections_total == 0


# ---- resume ----------------------------------------------------------------------------------------


async def test_restarted_driver_rejoins_with_session_load(rig: Rig) -> None:
    script = S.AcpScript(turns=[[S.text("first reply")], [S.text("x"), S.sleep(3600)]])
    peer = await rig.peer(script)
    store = MemoryCursorStore()
    target = rig.target(peer, interactive=True)
    rec1 = Recorder()
    d1 = rig.driver(target, rec1, cursor_store=store)
    t1 = asyncio.create_task(d1.run())
    await wait_until(lambda: turns_of(rec1) == [(0, "end_turn")], T)
    await d1.send_input("long one")
    await wait_until(lambda: rec1.stdout()[-1:] == ["x"], T)
    await d1.close()  # prosperod stops while turn 1 is in flight
    assert await asyncio.wait_for(t1, T) is DriverExit.closed
    lost = rec1.events[-1]
    assert isinstance(lost, TurnLost) and "prosperod stopping" in lost.reason
    assert peer.agent.cancels == [d1.session_id]  # the abandoned turn was cancelled
    sid = d1.session_id
    state = orjson.loads(store.data[target.agent_id])
    assert (state["session_id"], state["turns"], state["in_flight"]) == (sid, 2, None)

    rec2 = Recorder()
    d2 = rig.driver(target, rec2, cursor_store=store)  # a restarted prosperod
    t2 = asyncio.create_task(d2.run())
    await wait_until(lambda: peer.agent.loads == [sid], T)
    await d2.send_input("again")
    await wait_until(lambda: turns_of(rec2) == [(2, "end_turn")], T)
    await d2.end_input()
    assert await asyncio.wait_for(t2, T) is DriverExit.finished
    # Nothing replayed, no second agent_init: the history is in the store already.
    assert rec2.stdout() == ["echo: again"]
    assert rec2.kinds() == ["output", "turn_finished", "agent_finished"]
    assert d2.session_id == sid and d2.resumed == 1 and d2.replayed_updates > 0
    end = rec2.events[-1]
    assert isinstance(end, AgentFinished) and (end.outcome, end.turns) == ("EndOfTurn", 3)
    assert orjson.loads(store.data[target.agent_id])["terminal"] is True
    # A third driver over the finished state is finished at once and opens nothing.
    conns = peer.listener.connections_total
    d3 = rig.driver(target, Recorder(), cursor_store=store)
    assert await asyncio.wait_for(d3.run(), T) is DriverExit.finished
    assert peer.listener.connections_total == conns


async def test_agent_without_load_session_is_not_resumable(rig: Rig) -> None:
    peer = await rig.peer(S.simple_script("hi"), load_session=False)
    store = MemoryCursorStore()
    target = rig.target(peer, interactive=True)
    rec1 = Recorder()
    d1 = rig.driver(target, rec1, cursor_store=store)
    t1 = asyncio.create_task(d1.run())
    await wait_until(lambda: turns_of(rec1) == [(0, "end_turn")], T)
    await d1.close()
    assert await asyncio.wait_for(t1, T) is DriverExit.closed
    assert "turn_lost" not in rec1.kinds()  # idle when closed: nothing lost

    rec2 = Recorder()
    d2 = rig.driver(target, rec2, cursor_store=store)
    assert await asyncio.wait_for(d2.run(), T) is DriverExit.finished
    assert rec2.kinds() == ["stream_gap", "agent_finished"]
    gap, end = rec2.events
    assert isinstance(gap, StreamGap) and gap.detail == NOT_RESUMABLE_DETAIL
    assert isinstance(end, AgentFinished) and end.outcome == "NotResumable"
    assert end.turns == 1 and end.detail == NOT_RESUMABLE_DETAIL
    assert peer.agent.loads == [] and d2.finished


async def test_a_turn_in_flight_at_a_hard_stop_is_recorded_lost_on_restart(rig: Rig) -> None:
    peer = await rig.peer(S.simple_script("hi"))  # knows no session "gone-1"
    store = MemoryCursorStore()
    target = rig.target(peer)
    store.data[target.agent_id] = orjson.dumps(
        {"v": 1, "protocol": "acp", "session_id": "gone-1", "turns": 1, "in_flight": 0}
    )
    rec = Recorder()
    driver = rig.driver(target, rec, cursor_store=store)
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    assert rec.kinds() == ["turn_lost", "stream_gap", "agent_finished"]
    lost = rec.events[0]
    assert isinstance(lost, TurnLost) and lost.turn == 0
    assert lost.reason == "prosperod stopped while the turn was in flight"
    gap = rec.events[1]
    assert isinstance(gap, StreamGap) and "refused session/load" in gap.detail


async def test_unreadable_state_is_ignored(rig: Rig) -> None:
    peer = await rig.peer(S.simple_script("fresh"))
    store = MemoryCursorStore()
    target = rig.target(peer)
    store.data[target.agent_id] = b'{"v": 1, "protocol": "ndjson"}'
    rec = Recorder()
    driver = rig.driver(target, rec, cursor_store=store)
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    assert rec.stdout() == ["fresh"] and rec.kinds()[0] == "agent_init"


def test_outcome_vocabulary() -> None:
    assert acp_mod.outcome_for("end_turn") == ("EndOfTurn", None)
    assert acp_mod.outcome_for("max_turn_requests") == ("MaxTurnsReached", None)
    assert acp_mod.outcome_for("refusal") == ("Refusal", None)
    assert acp_mod.outcome_for("error") == ("Error", None)
    assert acp_mod.outcome_for(None) == ("EndOfTurn", None)
    assert acp_mod.outcome_for("paused") == ("Unknown", "agent stop reason 'paused'")


async def test_thinking_off_drops_thought_chunks(rig: Rig) -> None:
    peer = await rig.peer(S.AcpScript(turns=[[S.thought("hmm"), S.text("out")]]))
    rec = Recorder()
    opts = DriverOptions(include_thinking=False)
    assert await asyncio.wait_for(rig.driver(rig.target(peer), rec, opts).run(), T) is (
        DriverExit.finished
    )
    assert [e.stream for e in rec.events if isinstance(e, Output)] == ["stdout"]


async def test_a_cancel_before_the_prompt_left_follows_it_on_the_wire(rig: Rig) -> None:
    class GatedStore(MemoryCursorStore):
        """Blocks the save that opens turn 0 (the prompt is not on its way yet)."""

        def __init__(self) -> None:
            super().__init__()
            self.gate = asyncio.Event()
            self.blocked = False

        async def save_cursor(self, key: str, data: bytes) -> None:
            if orjson.loads(data).get("in_flight") == 0 and not self.gate.is_set():
                self.blocked = True
                await self.gate.wait()
            await super().save_cursor(key, data)

    peer = await rig.peer(S.AcpScript(turns=[[S.text("x"), S.sleep(3600)]]))
    store = GatedStore()
    wire = WireLog()
    rec = Recorder()
    driver = rig.driver(rig.target(peer), rec, cursor_store=store, observers=[wire])
    task = asyncio.create_task(driver.run())
    await wait_until(lambda: store.blocked, T)
    assert driver.turn_in_flight == 0
    await driver.cancel_turn()  # the turn is open, its prompt not sent yet
    store.gate.set()
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    sent = [m.get("method") for d, m in wire.messages if d == "outgoing" and "method" in m]
    assert sent.index("session/prompt") < sent.index("session/cancel")
    assert turns_of(rec) == [(0, "cancelled")]
    assert peer.agent.cancels == [driver.session_id]
