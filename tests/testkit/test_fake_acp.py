"""The scripted ACP peer, its per-agent listener (Unix, TLS + token, stdio bridge) and the fake
caliband's ACP mode, driven with the SDK's own client side (acp.md §11, §13, §14)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from acp import connect_to_agent
from acp.client.connection import ClientSideConnection
from acp.connection import StreamDirection, StreamEvent
from acp.exceptions import RequestError
from pydantic import ValidationError

from prospero.core.caliband_client import CalibandClient
from prospero.core.transport import NetworkSecurity, open_endpoint
from prospero.core.wire.control import Endpoint, SpawnSpec, TcpEndpoint, UnixEndpoint
from prospero.testkit import acp_scripts as S
from prospero.testkit import peers
from prospero.testkit.certs import CertBundle, make_certs
from prospero.testkit.fake_acp import FakeAcpAgent
from prospero.testkit.fake_acp_listener import AcpAgentListener
from prospero.testkit.fake_caliband import FakeCaliband
from prospero.types.model import AgentStatus
from tests.support import short_tmpdir, wait_until

TOKEN = "acp-s3cr3t"
T = 15.0  # upper bound for one ACP exchange with a local fake peer
PEER_T = 30.0  # the TypeScript example agent pauses 1 s between steps


@pytest.fixture(scope="module")
def certs() -> CertBundle:
    return make_certs()


@pytest.fixture
def sockdir() -> Iterator[str]:
    d = short_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


# --- a minimal duck-typed ACP client ----------------------------------------------------------

Decide = Callable[[Any, list[Any]], Awaitable[dict[str, Any]] | dict[str, Any]]


def select(option_id: str) -> Decide:
    return lambda _tc, _opts: {"outcome": {"outcome": "selected", "optionId": option_id}}


class RecClient:
    """Records every update synchronously (acp.md pitfall 1) and answers permissions."""

    def __init__(self, decide: Decide | None = None) -> None:
        self.updates: list[dict[str, Any]] = []
        self.permission_requests: list[tuple[Any, list[Any]]] = []
        self.decide = decide or select("allow-once")

    async def session_update(self, session_id: str, update: Any, **meta: Any) -> None:
        self.updates.append(update.model_dump(mode="json", by_alias=True, exclude_none=True))

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **meta: Any
    ) -> dict[str, Any]:
        self.permission_requests.append((tool_call, options))
        res = self.decide(tool_call, options)
        if asyncio.iscoroutine(res):
            res = await res
        assert isinstance(res, dict)
        return res

    def kinds(self) -> list[str]:
        return [u["sessionUpdate"] for u in self.updates]

    def texts(self) -> list[str]:
        return [
            u["content"]["text"]
            for u in self.updates
            if u["sessionUpdate"] == "agent_message_chunk"
        ]


class Session:
    def __init__(
        self, conn: ClientSideConnection, client: RecClient, raw: list[StreamEvent]
    ) -> None:
        self.conn = conn
        self.client = client
        self.raw = raw

    def incoming(self) -> list[dict[str, Any]]:
        return [e.message for e in self.raw if e.direction == StreamDirection.INCOMING]

    def raw_updates(self) -> list[dict[str, Any]]:
        return [
            m["params"]["update"] for m in self.incoming() if m.get("method") == "session/update"
        ]

    async def start(self, cwd: str = "/tmp/work") -> str:
        init = await asyncio.wait_for(self.conn.initialize(protocol_version=1), T)
        assert init.protocol_version == 1
        res = await asyncio.wait_for(self.conn.new_session(cwd=cwd, mcp_servers=[]), T)
        return res.session_id

    async def prompt(self, sid: str, text: str, timeout: float = T) -> str:
        res = await asyncio.wait_for(
            self.conn.prompt(session_id=sid, prompt=[{"type": "text", "text": text}]), timeout
        )
        return str(res.stop_reason)


@asynccontextmanager
async def acp_session(
    ep: Endpoint, security: NetworkSecurity | None = None, client: RecClient | None = None
) -> AsyncIterator[Session]:
    reader, writer = await open_endpoint(ep, security)
    raw: list[StreamEvent] = []
    client = client or RecClient()
    conn = connect_to_agent(client, writer, reader, observers=[raw.append])
    try:
        yield Session(conn, client, raw)
    finally:
        await conn.close()
        writer.close()


@asynccontextmanager
async def scripted(
    sockdir: str,
    script: S.AcpScript,
    *,
    certs: CertBundle | None = None,
    **agent_kw: Any,
) -> AsyncIterator[tuple[AcpAgentListener, Endpoint, NetworkSecurity | None]]:
    exits: list[int] = []
    lst = AcpAgentListener(
        "a1", agent_factory=lambda: FakeAcpAgent(script, **agent_kw), on_exit=exits.append
    )
    if certs is None:
        ep: Endpoint = await lst.serve_unix(f"{sockdir}/a.sock")
        sec = None
    else:
        ep = await lst.serve_tcp("127.0.0.1", 0, certs.server_context(), TOKEN)
        sec = NetworkSecurity(ca_pem=certs.ca_pem, token=TOKEN)
    try:
        yield lst, ep, sec
    finally:
        await lst.stop()
    assert exits == [lst.exit_code]


def agent_of(lst: AcpAgentListener) -> FakeAcpAgent:
    assert lst.agent is not None
    return lst.agent


# --- the scripted peer ------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["unix", "tls"])
async def test_full_scripted_turn_in_wire_order(
    sockdir: str, certs: CertBundle, transport: str
) -> None:
    script = S.default_acp_script()
    async with (
        scripted(sockdir, script, certs=certs if transport == "tls" else None, model="m-1") as (
            lst,
            ep,
            sec,
        ),
        acp_session(ep, sec) as s,
    ):
        if transport == "tls":
            assert isinstance(ep, TcpEndpoint)
        init = await s.conn.initialize(protocol_version=1)
        assert init.agent_capabilities is not None and init.agent_capabilities.load_session
        assert init.agent_capabilities.session_capabilities is not None
        assert init.agent_capabilities.session_capabilities.close is not None
        new = await s.conn.new_session(cwd="/tmp/proj", mcp_servers=[])
        assert new.config_options and new.config_options[0].current_value == "m-1"  # type: ignore[union-attr]
        assert await s.prompt(new.session_id, "Summarise the README") == "end_turn"
        assert s.client.kinds() == [
            "agent_thought_chunk",
            "agent_message_chunk",
            "plan",
            "tool_call",
            "tool_call_update",
            "tool_call_update",
            "agent_message_chunk",
            "tool_call",
            "tool_call_update",
            "agent_message_chunk",
            "plan",
            "usage_update",
        ]
        assert s.client.kinds() == [u["sessionUpdate"] for u in s.raw_updates()]
        usage = s.client.updates[-1]
        assert usage["cost"] == {"amount": 0.0123, "currency": "USD"}
        finished = s.client.updates[5]
        assert finished["status"] == "completed" and finished["rawOutput"] == {
            "content": "# demo\nA tiny project.\n"
        }
        assert finished["content"][0]["content"]["text"] == "# demo\nA tiny project.\n"
        agent = agent_of(lst)
        assert agent.prompts == ["Summarise the README"]
        assert agent.sessions[new.session_id].cwd == "/tmp/proj"
        assert agent.permission_outcomes[0]["allow"] is True
        # later turns echo
        assert await s.prompt(new.session_id, "more") == "end_turn"
        assert s.client.texts()[-1] == "echo: more"
        assert lst.connections_total == 1 and lst.running


async def test_late_raw_input_is_absent_on_the_tool_call(sockdir: str) -> None:
    script = S.AcpScript(
        turns=[
            [
                S.tool_call("t1", "Run tests", "execute"),
                S.tool_update("t1", raw_input={"command": "pytest -q"}, status="in_progress"),
                S.tool_update("t1", status="completed", raw_output="3 passed", content="3 passed"),
            ]
        ]
    )
    async with scripted(sockdir, script) as (_lst, ep, sec), acp_session(ep, sec) as s:
        sid = await s.start()
        assert await s.prompt(sid, "go") == "end_turn"
        raw = s.raw_updates()
        assert raw[0]["sessionUpdate"] == "tool_call" and "rawInput" not in raw[0]
        assert raw[0]["title"] == "Run tests" and raw[0]["kind"] == "execute"
        assert raw[1] == {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "t1",
            "status": "in_progress",
            "rawInput": {"command": "pytest -q"},
        }
        assert raw[2]["rawOutput"] == "3 passed"


def permission_script() -> S.AcpScript:
    return S.AcpScript(
        turns=[
            [
                S.tool_call("e1", "Edit config", "edit", raw_input={"path": "/p/c.json"}),
                S.permission(
                    "e1",
                    title="Edit config",
                    kind="edit",
                    raw_input={"path": "/p/c.json"},
                    on_allow=[S.tool_update("e1", status="completed"), S.text("done")],
                    on_reject=[S.tool_update("e1", status="failed"), S.text("skipped")],
                ),
                S.text("bye"),
            ]
        ]
    )


@pytest.mark.parametrize(
    ("option", "allow", "after"),
    [
        ("allow-once", True, ["done", "bye"]),
        ("allow-always", True, ["done", "bye"]),
        ("reject-once", False, ["skipped", "bye"]),
        ("reject-always", False, ["skipped", "bye"]),
    ],
)
async def test_permission_branches(
    sockdir: str, option: str, allow: bool, after: list[str]
) -> None:
    client = RecClient(select(option))
    async with (
        scripted(sockdir, permission_script()) as (lst, ep, sec),
        acp_session(ep, sec, client) as s,
    ):
        sid = await s.start()
        assert await s.prompt(sid, "edit it") == "end_turn"
        tc, opts = client.permission_requests[0]
        assert tc.tool_call_id == "e1" and tc.raw_input == {"path": "/p/c.json"}
        assert [(o.option_id, o.kind) for o in opts] == [
            ("allow-once", "allow_once"),
            ("allow-always", "allow_always"),
            ("reject-once", "reject_once"),
            ("reject-always", "reject_always"),
        ]
        assert client.texts() == after
        assert client.updates[1]["status"] == ("completed" if allow else "failed")
        assert agent_of(lst).permission_outcomes == [
            {
                "session_id": sid,
                "tool_call_id": "e1",
                "outcome": "selected",
                "option_id": option,
                "allow": allow,
            }
        ]


async def test_permission_custom_options_and_cancelled_outcome(sockdir: str) -> None:
    script = S.AcpScript(
        turns=[
            [
                S.permission(
                    "x",
                    options=[
                        {"option_id": "ok", "name": "OK", "kind": "allow_once"},
                        {"option_id": "no", "name": "No", "kind": "reject_once"},
                    ],
                    on_allow=[S.text("allowed")],
                ),
                S.text("after"),
            ],
            [S.permission("y"), S.text("never")],
        ]
    )
    answers = iter(
        [
            {"outcome": {"outcome": "selected", "optionId": "ok"}},
            {"outcome": {"outcome": "cancelled"}},
        ]
    )
    client = RecClient(lambda _tc, _o: next(answers))
    async with scripted(sockdir, script) as (lst, ep, sec), acp_session(ep, sec, client) as s:
        sid = await s.start()
        assert await s.prompt(sid, "one") == "end_turn"
        assert [o.option_id for o in client.permission_requests[0][1]] == ["ok", "no"]
        assert await s.prompt(sid, "two") == "cancelled"
        assert client.texts() == ["allowed", "after"]
        assert [o["outcome"] for o in agent_of(lst).permission_outcomes] == [
            "selected",
            "cancelled",
        ]


async def test_cancel_during_sleep_stops_the_turn_promptly(sockdir: str) -> None:
    script = S.AcpScript(turns=[[S.text("working"), S.sleep(60), S.text("never")]])
    async with scripted(sockdir, script) as (lst, ep, sec), acp_session(ep, sec) as s:
        sid = await s.start()
        turn = asyncio.create_task(s.prompt(sid, "long job"))
        await wait_until(lambda: s.client.texts() == ["working"], T)
        await s.conn.cancel(session_id=sid)
        assert await asyncio.wait_for(turn, 5.0) == "cancelled"
        agent = agent_of(lst)
        assert agent.cancels == [sid] and agent.stop_reasons == ["cancelled"]
        assert s.client.texts() == ["working"]
        # the session stays usable
        assert await s.prompt(sid, "next") == "end_turn"
        assert s.client.texts()[-1] == "echo: next"


async def test_cancel_while_a_permission_is_pending(sockdir: str) -> None:
    asked = asyncio.Event()
    release = asyncio.Event()

    async def decide(_tc: Any, _opts: list[Any]) -> dict[str, Any]:
        asked.set()
        await release.wait()
        return {"outcome": {"outcome": "cancelled"}}  # what a client MUST answer after cancel

    client = RecClient(decide)
    async with (
        scripted(sockdir, permission_script()) as (lst, ep, sec),
        acp_session(ep, sec, client) as s,
    ):
        sid = await s.start()
        turn = asyncio.create_task(s.prompt(sid, "edit it"))
        await asyncio.wait_for(asked.wait(), T)
        await s.conn.cancel(session_id=sid)
        assert await asyncio.wait_for(turn, 5.0) == "cancelled"
        release.set()
        agent = agent_of(lst)
        await wait_until(lambda: len(agent.permission_outcomes) == 1, T)
        assert agent.permission_outcomes[0]["outcome"] == "abandoned"
        assert client.texts() == []
        # the late answer to the abandoned request is harmless; the session goes on
        assert await s.prompt(sid, "again") == "end_turn"


async def test_crash_mid_turn_drops_the_connection(sockdir: str) -> None:
    script = S.AcpScript(turns=[[S.text("about to crash"), S.crash(), S.text("never")]])
    async with scripted(sockdir, script) as (lst, ep, sec):
        async with acp_session(ep, sec) as s:
            sid = await s.start()
            with pytest.raises(ConnectionError):
                await s.prompt(sid, "go")
            assert s.client.texts() == ["about to crash"]
        # only the connection died: the agent and its session are still there
        assert lst.running and lst.exit_code is None
        async with acp_session(ep, sec) as s2:
            await s2.conn.initialize(protocol_version=1)
            await asyncio.wait_for(s2.conn.load_session(cwd="/tmp/work", session_id=sid), T)
            assert s2.client.kinds() == ["user_message_chunk", "agent_message_chunk"]
            assert await s2.prompt(sid, "after crash") == "end_turn"


async def test_unknown_update_kind_reaches_the_wire(sockdir: str) -> None:
    script = S.AcpScript(
        turns=[[S.text("a"), S.unknown_update("notice", message="heads up"), S.text("b")]]
    )
    async with scripted(sockdir, script) as (_lst, ep, sec), acp_session(ep, sec) as s:
        sid = await s.start()
        assert await s.prompt(sid, "go") == "end_turn"
        assert [u["sessionUpdate"] for u in s.raw_updates()] == [
            "agent_message_chunk",
            "notice",
            "agent_message_chunk",
        ]
        assert s.raw_updates()[1] == {"sessionUpdate": "notice", "message": "heads up"}
        # the SDK drops it before the handler (acp.md pitfall 3)
        assert s.client.texts() == ["a", "b"] and len(s.client.updates) == 2


async def test_default_unknown_update_kind(sockdir: str) -> None:
    script = S.AcpScript(turns=[[{"unknown_update": {"x": 1}}]])
    async with scripted(sockdir, script) as (_lst, ep, sec), acp_session(ep, sec) as s:
        sid = await s.start()
        assert await s.prompt(sid, "go") == "end_turn"
        assert s.raw_updates() == [{"sessionUpdate": S.UNKNOWN_UPDATE_KIND, "x": 1}]


async def test_session_load_replays_history_after_reconnect(sockdir: str) -> None:
    script = S.AcpScript(
        turns=[
            [
                S.thought("hmm"),
                S.text("one"),
                S.tool_call("t", "Read", "read", raw_input={"path": "a"}),
                S.tool_update("t", status="completed", raw_output="A"),
                S.usage(10, 100, cost=0.5),
            ]
        ]
    )
    async with scripted(sockdir, script) as (lst, ep, sec):
        async with acp_session(ep, sec) as s:
            sid = await s.start(cwd="/tmp/one")
            assert await s.prompt(sid, "first") == "end_turn"
            assert await s.prompt(sid, "second") == "end_turn"
            live = s.client.updates
        async with acp_session(ep, sec) as s2:
            await s2.conn.initialize(protocol_version=1)
            # a session this connection neither created nor loaded is unknown here
            with pytest.raises(RequestError) as ei:
                await s2.prompt(sid, "too early")
            assert ei.value.code == -32002
            await asyncio.wait_for(s2.conn.load_session(cwd="/tmp/two", session_id=sid), T)
            replay = s2.client.updates
            assert [u["sessionUpdate"] for u in replay] == [
                "user_message_chunk",
                "agent_thought_chunk",
                "agent_message_chunk",
                "tool_call",
                "tool_call_update",
                "usage_update",
                "user_message_chunk",
                "agent_message_chunk",
            ]
            assert [u for u in replay if u["sessionUpdate"] != "user_message_chunk"] == live
            assert replay[0]["content"]["text"] == "first"
            assert replay[6]["content"]["text"] == "second"
            assert await s2.prompt(sid, "third") == "end_turn"
            with pytest.raises(RequestError) as ei:
                await s2.conn.load_session(cwd="/tmp", session_id="nope")
            assert ei.value.code == -32002
        agent = agent_of(lst)
        assert agent.loads == [sid] and agent.sessions[sid].cwd == "/tmp/two"
        assert agent.prompts == ["first", "second", "third"]


async def test_without_load_session(sockdir: str) -> None:
    async with (
        scripted(sockdir, S.AcpScript(), load_session=False) as (_lst, ep, sec),
        acp_session(ep, sec) as s,
    ):
        init = await s.conn.initialize(protocol_version=1)
        assert init.agent_capabilities is not None
        assert init.agent_capabilities.load_session is False
        sid = (await s.conn.new_session(cwd="/tmp", mcp_servers=[])).session_id
        with pytest.raises(RequestError) as ei:
            await s.conn.load_session(cwd="/tmp", session_id=sid)
        assert ei.value.code == -32601


CODEX_LIKE_METHODS = [
    {"id": "chatgpt", "name": "Login with ChatGPT"},
    {"id": "openai-api-key", "name": "Use OPENAI_API_KEY"},
]


async def test_auth_required_until_authenticate(sockdir: str) -> None:
    async with (
        scripted(
            sockdir,
            S.simple_script("hi"),
            auth_methods=CODEX_LIKE_METHODS,
            require_auth=True,
            accept_methods=["openai-api-key"],
        ) as (lst, ep, sec),
        acp_session(ep, sec) as s,
    ):
        init = await s.conn.initialize(protocol_version=1)
        assert [m.id for m in init.auth_methods or []] == ["chatgpt", "openai-api-key"]
        with pytest.raises(RequestError) as ei:
            await s.conn.new_session(cwd="/tmp", mcp_servers=[])
        assert (ei.value.code, str(ei.value)) == (-32000, "Authentication required")
        with pytest.raises(RequestError) as ei:
            await s.conn.authenticate(method_id="nope")
        assert ei.value.code == -32602
        with pytest.raises(RequestError) as ei:
            await s.conn.authenticate(method_id="chatgpt")  # advertised, not accepted
        assert ei.value.code == -32000
        await s.conn.authenticate(method_id="openai-api-key")
        sid = (await s.conn.new_session(cwd="/tmp", mcp_servers=[])).session_id
        assert await s.prompt(sid, "go") == "end_turn"
        agent = agent_of(lst)
        assert agent.authentications == ["nope", "chatgpt", "openai-api-key"]
        assert agent.auth_refusals == 1 and agent.prompts == ["go"]


async def test_auth_survives_a_reconnect_for_session_load(sockdir: str) -> None:
    async with scripted(
        sockdir, S.simple_script("hi"), auth_methods=CODEX_LIKE_METHODS, require_auth=True
    ) as (lst, ep, sec):
        async with acp_session(ep, sec) as s:
            await s.conn.initialize(protocol_version=1)
            with pytest.raises(RequestError):
                await s.conn.load_session(cwd="/tmp", session_id="sess-0001")
            await s.conn.authenticate(method_id="chatgpt")
            sid = (await s.conn.new_session(cwd="/tmp", mcp_servers=[])).session_id
        async with acp_session(ep, sec) as s2:
            await s2.conn.initialize(protocol_version=1)
            await s2.conn.load_session(cwd="/tmp", session_id=sid)
        assert agent_of(lst).loads == [sid] and agent_of(lst).auth_refusals == 1


async def test_auth_required_on_prompt_like_claude_agent_acp(sockdir: str) -> None:
    methods = [{"id": "claude-login", "name": "Log in with Claude"}]
    async with (
        scripted(
            sockdir,
            S.simple_script("hi"),
            auth_methods=methods,
            require_auth=True,
            auth_on="prompt",
        ) as (lst, ep, sec),
        acp_session(ep, sec) as s,
    ):
        await s.conn.initialize(protocol_version=1)
        sid = (await s.conn.new_session(cwd="/tmp", mcp_servers=[])).session_id
        with pytest.raises(RequestError) as ei:
            await s.prompt(sid, "go")
        assert ei.value.code == -32000
        assert agent_of(lst).prompts == []  # refused before any work
        await s.conn.authenticate(method_id="claude-login")
        assert await s.prompt(sid, "go") == "end_turn"
        assert agent_of(lst).prompts == ["go"]
    with pytest.raises(ValueError):
        FakeAcpAgent(auth_on="elsewhere")


@pytest.mark.parametrize(
    "reason", ["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]
)
async def test_stop_reasons(sockdir: str, reason: str) -> None:
    script = S.AcpScript(turns=[[S.text("x"), S.stop(reason), S.text("ignored")]])
    async with scripted(sockdir, script) as (_lst, ep, sec), acp_session(ep, sec) as s:
        sid = await s.start()
        assert await s.prompt(sid, "go") == reason
        assert s.client.texts() == ["x"]


async def test_unknown_stop_reason_is_sent_verbatim(sockdir: str) -> None:
    script = S.AcpScript(turns=[[S.stop("bogus_reason")]])
    async with scripted(sockdir, script) as (_lst, ep, sec), acp_session(ep, sec) as s:
        sid = await s.start()
        with pytest.raises(ValidationError):  # acp.md pitfall 4
            await s.prompt(sid, "go")
        results = [m["result"] for m in s.incoming() if "result" in m and m.get("id") == 2]
        assert results == [{"stopReason": "bogus_reason"}]


async def test_second_prompt_while_running_is_refused(sockdir: str) -> None:
    script = S.AcpScript(turns=[[S.sleep(60)]])
    async with scripted(sockdir, script) as (lst, ep, sec), acp_session(ep, sec) as s:
        sid = await s.start()
        first = asyncio.create_task(s.prompt(sid, "one"))
        await wait_until(lambda: agent_of(lst).prompts == ["one"], T)
        with pytest.raises(RequestError) as ei:
            await s.prompt(sid, "two")
        assert ei.value.code == -32600
        await s.conn.cancel(session_id=sid)
        assert await first == "cancelled"


async def test_unserved_method_is_method_not_found(sockdir: str) -> None:
    async with scripted(sockdir, S.AcpScript()) as (_lst, ep, sec), acp_session(ep, sec) as s:
        sid = await s.start()
        with pytest.raises(RequestError) as ei:
            await s.conn.set_session_mode(session_id=sid, mode_id="x")
        assert ei.value.code == -32601
        with pytest.raises(RequestError) as ei:
            await s.conn.ext_method("vendor/thing", {})
        assert ei.value.code == -32601


async def test_wrong_token_is_dropped(sockdir: str, certs: CertBundle) -> None:
    async with scripted(sockdir, S.AcpScript(), certs=certs) as (lst, ep, _sec):
        bad = NetworkSecurity(ca_pem=certs.ca_pem, token="wrong")
        async with acp_session(ep, bad) as s:
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(s.conn.initialize(protocol_version=1), T)
        assert lst.auth_failures == 1 and lst.connections_total == 0 and lst.agent is None


async def test_exit_step_ends_the_listener(sockdir: str) -> None:
    script = S.AcpScript(turns=[[S.text("bye"), S.exit_(3), S.text("never")]])
    async with scripted(sockdir, script) as (lst, ep, sec):
        async with acp_session(ep, sec) as s:
            sid = await s.start()
            with pytest.raises(ConnectionError):
                await s.prompt(sid, "go")
        assert await lst.wait_finished(T) == 3
        assert not await asyncio.to_thread(Path(f"{sockdir}/a.sock").exists)


async def test_session_close_ends_the_agent_with_0(sockdir: str) -> None:
    async with scripted(sockdir, S.AcpScript()) as (lst, ep, sec), acp_session(ep, sec) as s:
        sid = await s.start()
        assert await s.prompt(sid, "hi") == "end_turn"
        await asyncio.wait_for(s.conn.close_session(session_id=sid), T)
        assert await lst.wait_finished(T) == 0
        assert agent_of(lst).closes == [sid]


async def test_stop_is_a_kill(sockdir: str) -> None:
    script = S.AcpScript(turns=[[S.sleep(60)]])
    async with scripted(sockdir, script) as (lst, ep, sec), acp_session(ep, sec) as s:
        sid = await s.start()
        turn = asyncio.create_task(s.prompt(sid, "go"))
        await wait_until(lambda: agent_of(lst).prompts == ["go"], T)
        await lst.stop()
        assert lst.exit_code == 143
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(turn, T)


async def test_agent_served_on_plain_streams_without_listener(sockdir: str) -> None:
    agent = FakeAcpAgent(S.simple_script("hello", "world"))
    server = await asyncio.start_unix_server(agent.serve, path=f"{sockdir}/p.sock")
    try:
        async with acp_session(UnixEndpoint(path=f"{sockdir}/p.sock")) as s:
            sid = await s.start()
            assert await s.prompt(sid, "x") == "end_turn"
            assert s.client.texts() == ["hello", "world"]
    finally:
        server.close()
        await agent.close_connections()


def test_script_json_round_trip(tmp_path: Path) -> None:
    script = S.default_acp_script()
    script.model = "m"
    script.dump(tmp_path / "s.json")
    assert S.AcpScript.load(tmp_path / "s.json") == script
    assert S.AcpScript.from_obj([[S.text("a")]]).turns == [[{"text": "a"}]]
    assert S.AcpScript().steps_for(0, "p") == S.echo_turn("p")
    with pytest.raises(ValueError):
        S.AcpScript.from_obj({"turns": 3})


# --- the fake caliband's ACP mode -------------------------------------------------------------


@asynccontextmanager
async def tls_caliband(
    certs: CertBundle, **kw: Any
) -> AsyncIterator[tuple[FakeCaliband, CalibandClient, NetworkSecurity]]:
    f = await FakeCaliband.start_tcp("127.0.0.1", 0, certs.cert_pem, certs.key_pem, TOKEN, **kw)
    sec = NetworkSecurity(ca_pem=certs.ca_pem, token=TOKEN)
    try:
        yield f, CalibandClient(f.endpoint, sec), sec
    finally:
        await f.stop()


def acp_spec(prompt: str = "do it", **kw: Any) -> SpawnSpec:
    return SpawnSpec(initial_prompt=prompt, drive_protocol="acp", **kw)


async def test_caliband_serves_the_default_acp_script_over_tls(certs: CertBundle) -> None:
    async with tls_caliband(certs) as (f, c, sec):
        a = await c.spawn(acp_spec(model="claude-x"))
        assert isinstance(a.endpoint, TcpEndpoint)
        assert f.status_of(a.id) == AgentStatus.running and a.id not in f.workers
        (rec,) = await c.list()
        assert rec.spec.drive_protocol == "acp" and rec.spec.model == "claude-x"
        assert rec.endpoint == a.endpoint
        async with acp_session(a.endpoint, sec) as s:
            init = await s.conn.initialize(protocol_version=1)
            assert init.agent_capabilities is not None and init.agent_capabilities.load_session
            new = await s.conn.new_session(cwd="/tmp", mcp_servers=[])
            assert new.config_options and new.config_options[0].current_value == "claude-x"  # type: ignore[union-attr]
            assert await s.prompt(new.session_id, "do it") == "end_turn"
            kinds = s.client.kinds()
            assert kinds[0] == "agent_thought_chunk" and kinds[-1] == "usage_update"
            assert "tool_call_update" in kinds and "plan" in kinds
            assert len(s.client.permission_requests) == 1
            assert f.status_of(a.id) == AgentStatus.running
            # the client ends the session: the agent finishes
            await s.conn.close_session(session_id=new.session_id)
            await wait_until(lambda: f.status_of(a.id) == AgentStatus.done, T)
        bad = NetworkSecurity(ca_pem=certs.ca_pem, token="nope")
        a2 = await c.spawn(acp_spec())
        async with acp_session(a2.endpoint, bad) as s:
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(s.conn.initialize(protocol_version=1), T)
        assert f.acp_listeners[a2.id].auth_failures == 1


async def test_caliband_acp_status_failed_and_killed(sockdir: str) -> None:
    scripts_by_prompt = {
        "fail": S.AcpScript(turns=[[S.text("oops"), S.exit_(1)]]),
        "hang": S.AcpScript(turns=[[S.sleep(60)]]),
    }
    f = await FakeCaliband.start_unix(
        f"{sockdir}/ctl.sock", acp_script_for=lambda spec: scripts_by_prompt[spec.initial_prompt]
    )
    try:
        c = CalibandClient(f.endpoint)
        failing = await c.spawn(acp_spec("fail"))
        hanging = await c.spawn(acp_spec("hang"))
        assert isinstance(failing.endpoint, UnixEndpoint)
        async with acp_session(failing.endpoint) as s:
            sid = await s.start()
            with pytest.raises(ConnectionError):
                await s.prompt(sid, "fail")
            # the status flips before the connection drops: a client seeing EOF finds it
            assert f.status_of(failing.id) == AgentStatus.failed
        async with acp_session(hanging.endpoint) as s:
            sid = await s.start()
            turn = asyncio.create_task(s.prompt(sid, "hang"))
            await wait_until(lambda: f.acp_listeners[hanging.id].agent is not None, T)
            await c.kill(hanging.id)
            assert f.status_of(hanging.id) == AgentStatus.killed
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(turn, T)
        assert f.acp_listeners[hanging.id].exit_code == 143
        assert f.status_of(hanging.id) == AgentStatus.killed
        # a pre-existing ACP agent registered by a test
        rec = await f.add_agent(spec=acp_spec("x"), acp_script=S.simple_script("pre"))
        async with acp_session(rec.endpoint) as s:
            sid = await s.start()
            assert await s.prompt(sid, "x") == "end_turn"
            assert s.client.texts() == ["pre"]
    finally:
        await f.stop()


# --- real third-party peers behind the bridge -------------------------------------------------


async def test_bridge_python_echo_agent_through_tls_listener(certs: CertBundle) -> None:
    async with tls_caliband(certs, acp_command=peers.python_echo_agent_command()) as (f, c, sec):
        a = await c.spawn(acp_spec())
        async with acp_session(a.endpoint, sec) as s:
            sid = await s.start()
            assert await s.prompt(sid, "hello peer", timeout=PEER_T) == "end_turn"
            assert s.client.texts() == ["hello peer"]
            assert f.status_of(a.id) == AgentStatus.running
        # the echo agent exits 0 on stdin EOF once the client is gone: the agent is done
        await wait_until(lambda: f.status_of(a.id) == AgentStatus.done, PEER_T)
        lst = f.acp_listeners[a.id]
        assert lst.process_exit_codes == [0] and lst.exit_code == 0


async def test_bridge_python_example_agent_and_kill(sockdir: str) -> None:
    f = await FakeCaliband.start_unix(
        f"{sockdir}/ctl.sock", acp_command=peers.python_example_agent_command()
    )
    try:
        c = CalibandClient(f.endpoint)
        a = await c.spawn(acp_spec())
        async with acp_session(a.endpoint) as s:
            sid = await s.start()
            assert await s.prompt(sid, "ping", timeout=PEER_T) == "end_turn"
            assert s.client.texts() == ["Client sent:", "ping"]
            await c.kill(a.id)
            assert f.status_of(a.id) == AgentStatus.killed
            lst = f.acp_listeners[a.id]
            assert lst.exit_code == 143
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(s.prompt(sid, "after kill"), T)
        assert lst.processes_started == 1 and not lst._procs
    finally:
        await f.stop()


async def test_bridge_typescript_example_agent_allow_and_reject(certs: CertBundle) -> None:
    cmd = peers.ts_example_agent_command()
    async with tls_caliband(certs, acp_command=cmd) as (f, c, sec):
        allow = await c.spawn(acp_spec("allow"))
        reject = await c.spawn(acp_spec("reject"))

        async def run(ep: Endpoint, option: str) -> RecClient:
            client = RecClient(select(option))
            async with acp_session(ep, sec, client) as s:
                sid = await s.start()
                assert await s.prompt(sid, "change the config", timeout=PEER_T) == "end_turn"
            return client

        ok, no = await asyncio.gather(run(allow.endpoint, "allow"), run(reject.endpoint, "reject"))
        for cl in (ok, no):
            assert cl.kinds()[:5] == [
                "agent_message_chunk",
                "tool_call",
                "tool_call_update",
                "agent_message_chunk",
                "tool_call",
            ]
            tc, opts = cl.permission_requests[0]
            assert tc.tool_call_id == "call_2" and [o.option_id for o in opts] == [
                "allow",
                "reject",
            ]
        assert ok.kinds()[5:] == ["tool_call_update", "agent_message_chunk"]
        assert ok.updates[5]["status"] == "completed"
        assert no.kinds()[5:] == ["agent_message_chunk"]
        assert "skip" in no.texts()[-1]
        # both node processes ended with their connections (node exits on stdin EOF)
        await wait_until(
            lambda: all(f.status_of(a.id) == AgentStatus.done for a in (allow, reject)), PEER_T
        )


async def test_bridge_typescript_cancel_while_permission_pending(certs: CertBundle) -> None:
    asked = asyncio.Event()

    async def decide(_tc: Any, _opts: list[Any]) -> dict[str, Any]:
        asked.set()
        await asyncio.sleep(0)  # answer only after the cancel below went out
        return {"outcome": {"outcome": "cancelled"}}

    async with tls_caliband(certs, acp_command=peers.ts_example_agent_command()) as (f, c, sec):
        a = await c.spawn(acp_spec())
        client = RecClient(decide)
        async with acp_session(a.endpoint, sec, client) as s:
            sid = await s.start()
            turn = asyncio.create_task(s.prompt(sid, "change the config", timeout=PEER_T))
            await asyncio.wait_for(asked.wait(), PEER_T)
            await s.conn.cancel(session_id=sid)
            # the TS example answers end_turn when the cancel lands on a pending permission
            # (acp.md §8); a driver reports such a turn as cancelled because it sent the cancel
            assert await turn in ("cancelled", "end_turn")
            # and it honours a plain cancel mid-turn
            second = asyncio.create_task(s.prompt(sid, "again", timeout=PEER_T))
            await wait_until(lambda: len(client.updates) >= 6, PEER_T)
            await s.conn.cancel(session_id=sid)
            assert await second == "cancelled"
        assert f.status_of(a.id) in (AgentStatus.running, AgentStatus.done)


async def test_fake_caliband_command_line_bridges_acp(sockdir: str) -> None:
    echo = " ".join(peers.python_echo_agent_command())
    sock = f"{sockdir}/ctl.sock"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prospero.testkit.fake_caliband",
        "--socket",
        sock,
        "--acp-command",
        echo,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), PEER_T)
        assert line.decode().startswith("ready ")
        c = CalibandClient(UnixEndpoint(path=sock))
        a = await c.spawn(acp_spec())
        async with acp_session(a.endpoint) as s:
            sid = await s.start()
            assert await s.prompt(sid, "via cli", timeout=PEER_T) == "end_turn"
            assert s.client.texts() == ["via cli"]
        await c.shutdown()
        assert await asyncio.wait_for(proc.wait(), PEER_T) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_missing_peer_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PROSPERO_PEERS_DIR", str(tmp_path))
    with pytest.raises(peers.PeerNotInstalled, match=r"install\.sh"):
        peers.ts_example_agent_command()
    with pytest.raises(peers.PeerNotInstalled, match=r"install\.sh"):
        peers.python_echo_agent_command()


# --- the demo's ACP sessions ------------------------------------------------------------------


def without_sleeps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for st in steps:
        if "sleep" in st:
            continue
        if "permission" in st:
            st = {
                **st,
                "on_allow": without_sleeps(st["on_allow"]),
                "on_reject": without_sleeps(st["on_reject"]),
            }
        out.append(st)
    return out


def fast(script: S.AcpScript) -> S.AcpScript:
    return S.AcpScript(turns=[without_sleeps(t) for t in script.turns], model=script.model)


@pytest.mark.parametrize(
    ("prompt", "expect"),
    [
        ("Make refunds reject unsupported currencies", "end_turn"),
        ("Add a health endpoint", "end_turn"),
        ("Upgrade httpx slowly", "end_turn"),
        ("Please refuse this", "refusal"),
        ("Crash the migration", "crash"),
    ],
)
async def test_demo_acp_sessions_play(sockdir: str, prompt: str, expect: str) -> None:
    from prospero.testkit.demo_scripts import DEMO_ACP_FLEET, acp_script_for

    assert DEMO_ACP_FLEET[0].drive_protocol == "acp"
    script = acp_script_for(SpawnSpec(initial_prompt=prompt, drive_protocol="acp"))
    client = RecClient(select("reject-once"))  # prosperod's default policy denies
    async with (
        scripted(sockdir, fast(script)) as (lst, ep, sec),
        acp_session(ep, sec, client) as s,
    ):
        sid = await s.start()
        assert agent_of(lst).model == "claude-sonnet-4-6"  # reported in configOptions
        if expect == "crash":
            with pytest.raises(ConnectionError):
                await s.prompt(sid, prompt)
            assert await lst.wait_finished(T) == 1
            return
        assert await s.prompt(sid, prompt) == expect
        if expect == "refusal":
            return
        ups = client.updates
        started = {u["toolCallId"]: u for u in ups if u["sessionUpdate"] == "tool_call"}
        assert started
        for tid in started:
            merged: dict[str, Any] = {}
            for u in ups:
                if u.get("toolCallId") == tid:
                    merged.update(u)
            assert merged.get("rawInput"), f"{tid} never got its input"
            assert merged["status"] in ("completed", "failed")
        assert ups[-1]["sessionUpdate"] == "usage_update" and ups[-1]["cost"]["amount"] > 0
        if "health" in prompt:  # the generic session asks permission; denied -> failed edit
            assert client.permission_requests and "not permitted" in "".join(client.texts())
        assert await s.prompt(sid, "thanks") == "end_turn"
        assert client.texts()[-1] == "echo: thanks"
