"""FleetManager + AcpDriver end to end: fake caliband in ACP mode (scripted ACP peers on the
per-agent endpoints), Emitter, SQLite store, over real sockets."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from acp.connection import StreamEvent

from prospero.core import metrics as m
from prospero.core.discovery import socket_path_for
from prospero.core.drivers.acp import AcpDriver, AcpResumeState, acp_driver_factory
from prospero.core.drivers.base import DriverExit
from prospero.core.errors import Conflict
from prospero.core.fleet.manager import (
    DriverFactory,
    FleetConfig,
    FleetManager,
    default_driver_factories,
)
from prospero.core.metrics import Metrics
from prospero.core.ownership import Lease, Ownership
from prospero.core.sources import canonical_root
from prospero.core.wire.control import SpawnSpec
from prospero.testkit import acp_scripts as S
from prospero.testkit.fake_caliband import FakeCaliband
from prospero.types.api import SpawnRequest
from prospero.types.events import (
    AgentFinished,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnLost,
)
from prospero.types.model import AgentStatus
from tests.conformance.agent_driver import SESSION
from tests.core.acp_support import session_turn
from tests.core.fleet_fixtures import ManagedStores, make_git_repo
from tests.support import short_tmpdir, wait_until

T = 15.0


def acp_script_by_prompt(spec: SpawnSpec) -> S.AcpScript:
    p = spec.initial_prompt
    if p.startswith("session"):
        return S.AcpScript(turns=[session_turn()])
    if p.startswith("hang"):
        return S.AcpScript(
            turns=[
                [
                    S.text("working"),
                    S.tool_call("t1", "Sleep", "execute", raw_input={"secs": 3600}),
                    S.sleep(3600),
                ]
            ]
        )
    if p.startswith("crash"):
        return S.AcpScript(
            turns=[
                [S.text("oops"), S.tool_call("t1", "Read", "read", raw_input={"p": 1}), S.exit_(1)]
            ]
        )
    if p.startswith("chat"):
        return S.AcpScript(turns=[[S.text("What next?")]])
    return S.simple_script("ok")


class Wire:
    """Raw observer on every driver's connection."""

    def __init__(self) -> None:
        self.outgoing: list[dict[str, Any]] = []

    def __call__(self, ev: StreamEvent) -> None:
        if ev.direction.value == "outgoing":
            self.outgoing.append(ev.message)

    def methods(self) -> list[str]:
        return [msg["method"] for msg in self.outgoing if "method" in msg]


class Refuse:
    shared = True  # another replica holds every lease

    async def try_acquire(self, key: str) -> Lease | None:
        return None

    async def release(self, key: str) -> None:
        return None

    def owns(self, key: str) -> bool:
        return False


class Env(ManagedStores):
    def __init__(self, root: str, sock: str, fake: FakeCaliband, db: Path) -> None:
        self.root, self.sock, self.fake, self.db = root, sock, fake, db
        self.wire = Wire()
        self.metrics = Metrics()
        self.manager: FleetManager | None = None

    async def start(
        self,
        *,
        allow_acp: bool = True,
        factories: dict[str, DriverFactory] | None = None,
        ownership: Ownership | None = None,
    ) -> FleetManager:
        await self.open_stores()
        if factories is None:
            factories = default_driver_factories()
            factories["acp"] = acp_driver_factory(observers=[self.wire])
        self.manager = self.new_manager(
            FleetConfig(
                poll_interval=0.1,
                backoff_base=0.02,
                backoff_cap=0.1,
                max_failures=3,
                terminal_grace=0.2,
                allow_acp=allow_acp,
            ),
            factories,
            ownership=ownership,
        )
        await self.manager.start(poll=True)
        if "app" not in {w.name for w in self.manager.list_workspaces()}:
            await self.manager.add_workspace("app", self.root)
        return self.manager

    async def stop(self) -> None:
        if self.manager is None:
            return
        await self.close_stores(self.manager)
        self.manager = None

    async def has(self, key: str, kind: str) -> bool:
        return kind in await self.kinds(key)

    async def spawn(self, prompt: str, **kw: Any) -> str:
        assert self.manager is not None
        resp = await self.manager.spawn(
            "app", SpawnRequest(prompt=prompt, drive_protocol="acp", **kw)
        )
        assert resp.drive_protocol == "acp"
        return resp.agent_id

    async def status(self, agent_id: str) -> AgentStatus:
        assert self.manager is not None
        await self.manager.poll_workspace("app")
        return self.manager.get_agent(agent_id).status


@pytest.fixture
async def env(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Env]:
    runtime_dir = short_tmpdir()
    monkeypatch.setenv("CALIBAN_DAEMON_RUNTIME_DIR", runtime_dir)
    work = Path(short_tmpdir())
    root = canonical_root(str(make_git_repo(work / "app")))
    sock = socket_path_for(root)
    Path(sock).parent.mkdir(parents=True, exist_ok=True)
    fake = await FakeCaliband.start_unix(sock, root=root, acp_script_for=acp_script_by_prompt)
    e = Env(root, sock, fake, work / "events.db")
    try:
        yield e
    finally:
        await e.stop()
        await fake.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(runtime_dir, ignore_errors=True)


async def test_acp_spawn_streams_the_session_and_finishes(env: Env) -> None:
    await env.start()
    agent_id = await env.spawn("session please", model=SESSION["model"])
    assert env.fake.received_specs[-1].drive_protocol == "acp"
    await wait_until(lambda: env.has(agent_id, "agent_finished"), T, what="agent_finished")
    await wait_until(lambda: _status_is(env, agent_id, AgentStatus.done), T, what="done")
    evs = await env.events(agent_id)
    kinds = [e.kind.kind for e in evs]
    assert kinds[0] == "agent_spawned"
    assert [k for k in kinds if k not in ("agent_spawned", "status_changed")] == [
        "agent_init",
        "output",
        "output",
        "tool_started",
        "tool_finished",
        "tool_started",
        "tool_finished",
        "output",
        "turn_finished",
        "agent_finished",
    ]
    started = [e.kind for e in evs if isinstance(e.kind, ToolStarted)]
    assert [(s.name, s.input) for s in started] == [
        ("Read", {"path": "README.md"}),
        ("Bash", {"command": "false"}),
    ]
    fin = [e.kind for e in evs if isinstance(e.kind, ToolFinished)]
    assert [(f.ok, f.result.text if f.result else None) for f in fin] == [
        (True, SESSION["read"]["result"]),
        (False, SESSION["bash"]["result"]),
    ]
    end = evs[kinds.index("agent_finished")].kind
    assert isinstance(end, AgentFinished)
    assert (end.outcome, end.turns, end.model) == ("EndOfTurn", 1, SESSION["model"])
    assert end.cost_usd == pytest.approx(0.0123)
    listener = env.fake.acp_listeners[agent_id]
    assert listener.agent is not None
    session = next(iter(listener.agent.sessions.values()))
    assert session.cwd == env.fake.record(agent_id).working_dir  # cwd = the agent's dir
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1))
    assert env.wire.methods()[:3] == ["initialize", "session/new", "session/prompt"]


async def _status_is(env: Env, agent_id: str, status: AgentStatus) -> bool:
    return await env.status(agent_id) == status


async def test_acp_spawn_is_refused_unless_allowed(env: Env) -> None:
    await env.start(allow_acp=False)
    with pytest.raises(Conflict, match="allow-acp"):
        await env.spawn("session")
    assert env.fake.received_specs == []


async def test_kill_cancels_the_turn_then_kills(env: Env) -> None:
    manager = await env.start()
    agent_id = await env.spawn("hang on")
    await wait_until(lambda: env.has(agent_id, "tool_started"), T, what="turn running")
    await manager.kill(agent_id)
    assert "session/cancel" in env.wire.methods()  # cancel first ...
    assert manager.get_agent(agent_id).status == AgentStatus.killed  # ... then caliband kill
    kill_seen = [r for r in env.fake.requests if type(r).__name__ == "KillReq"]
    assert len(kill_seen) == 1

    async def turn_closed() -> bool:
        evs = await env.events(agent_id)
        return any(
            isinstance(e.kind, TurnLost)
            or (isinstance(e.kind, TurnFinished) and e.kind.stop_reason == "cancelled")
            for e in evs
        )

    await wait_until(turn_closed, T, what="turn cancelled or lost")
    evs = await env.events(agent_id)
    fin = [e.kind for e in evs if isinstance(e.kind, ToolFinished)]
    assert len(fin) == 1 and not fin[0].ok  # the open call was closed explicitly
    await wait_until(lambda: manager.wait_driver(agent_id, T), T)


async def test_crash_mid_turn_is_a_lost_turn_and_the_agent_fails(env: Env) -> None:
    manager = await env.start()
    agent_id = await env.spawn("crash now")
    await wait_until(lambda: env.has(agent_id, "turn_lost"), T, what="turn_lost")
    await wait_until(lambda: _status_is(env, agent_id, AgentStatus.failed), T, what="failed")
    evs = await env.events(agent_id)
    lost = next(e.kind for e in evs if isinstance(e.kind, TurnLost))
    assert lost.turn == 0 and "lost mid-turn" in lost.reason
    fin = next(e.kind for e in evs if isinstance(e.kind, ToolFinished))
    assert not fin.ok and fin.result is not None and fin.result.text.startswith("abandoned")
    kinds = [e.kind.kind for e in evs]
    assert kinds.index("tool_finished") < kinds.index("turn_lost")
    changes = [(e.kind.from_, e.kind.to) for e in evs if e.kind.kind == "status_changed"]
    assert changes[-1][1] == AgentStatus.failed
    # The worker is gone without ending its run: the driver concludes it by itself (issue 9
    # contract 4) — one agent_finished{crashed}, promptly, instead of spending its budget.
    exit_ = await manager.wait_driver(agent_id, T)
    assert exit_ is DriverExit.finished
    evs = await env.events(agent_id)
    ends = [e.kind for e in evs if isinstance(e.kind, AgentFinished)]
    assert len(ends) == 1 and ends[0].outcome == "crashed" and ends[0].detail
    kinds = [e.kind.kind for e in evs]
    assert kinds.index("turn_lost") < kinds.index("agent_finished")


async def test_steering_an_interactive_acp_agent(env: Env) -> None:
    manager = await env.start()
    agent_id = await env.spawn("chat with me", interactive=True)

    async def outputs() -> list[str]:
        return [e.kind.chunk for e in await env.events(agent_id) if e.kind.kind == "output"]

    await wait_until(lambda: _eq(outputs, ["What next?"]), T, what="first turn")
    await manager.send_input(agent_id, "update the changelog")
    await wait_until(
        lambda: _eq(outputs, ["What next?", "echo: update the changelog"]), T, what="reply"
    )

    async def two_turns() -> bool:
        return (await env.kinds(agent_id)).count("turn_finished") == 2

    await wait_until(two_turns, T, what="second turn finished")
    await manager.cancel_turn(agent_id)  # no turn in flight: a no-op, not an error
    await manager.end_input(agent_id)
    await wait_until(lambda: env.has(agent_id, "agent_finished"), T, what="finished")
    await wait_until(lambda: _status_is(env, agent_id, AgentStatus.done), T, what="done")
    evs = await env.events(agent_id)
    turns = [(e.kind.turn, e.kind.stop_reason) for e in evs if isinstance(e.kind, TurnFinished)]
    assert turns == [(0, "end_turn"), (1, "end_turn")]
    assert "session/close" in env.wire.methods()


async def _eq(fn: Any, expected: list[str]) -> bool:
    return bool(await fn() == expected)


async def test_cancel_turn_through_the_manager(env: Env) -> None:
    manager = await env.start()
    agent_id = await env.spawn("hang in there")
    await wait_until(lambda: env.has(agent_id, "tool_started"), T, what="turn running")
    await manager.cancel_turn(agent_id)
    await wait_until(lambda: env.has(agent_id, "agent_finished"), T, what="finished")
    evs = await env.events(agent_id)
    turns = [(e.kind.turn, e.kind.stop_reason) for e in evs if isinstance(e.kind, TurnFinished)]
    assert turns == [(0, "cancelled")]
    end = next(e.kind for e in evs if isinstance(e.kind, AgentFinished))
    assert end.outcome == "Cancelled"


async def test_restarted_prosperod_rejoins_the_session(env: Env) -> None:
    manager = await env.start()
    agent_id = await env.spawn("chat again", interactive=True)
    await wait_until(lambda: env.has(agent_id, "turn_finished"), T, what="first turn")
    await env.stop()  # prosperod stops; caliband and the agent keep running
    listener = env.fake.acp_listeners[agent_id]
    assert listener.agent is not None and listener.agent.loads == []

    manager = await env.start()
    await wait_until(lambda: listener.agent is not None and len(listener.agent.loads) == 1, T)
    await manager.send_input(agent_id, "still there?")

    async def replied() -> bool:
        evs = await env.events(agent_id)
        return any(e.kind.kind == "output" and e.kind.chunk == "echo: still there?" for e in evs)

    await wait_until(replied, T, what="reply after rejoin")
    evs = await env.events(agent_id)
    outputs = [e.kind.chunk for e in evs if e.kind.kind == "output"]
    assert outputs == ["What next?", "echo: still there?"]  # history not replayed twice
    assert [e.kind.kind for e in evs].count("agent_init") == 1
    turns = [e.kind.turn for e in evs if isinstance(e.kind, TurnFinished)]
    assert turns == [0, 1]


async def test_a_refused_lease_opens_no_acp_session(env: Env) -> None:
    await env.start(ownership=Refuse())
    agent_id = await env.spawn("session")
    await wait_until(lambda: env.metrics.get(m.REPOS_POLLED) >= 5, T, what="polls")
    assert env.fake.acp_listeners[agent_id].connections_total == 0
    assert env.wire.methods() == []


class _CrashingDriver:
    protocol = "acp"

    def __init__(self, *args: Any) -> None:
        self.turn_in_flight = 2

    async def run(self) -> DriverExit:
        raise RuntimeError("driver bug")

    async def conclude(self, outcome: str, detail: str) -> None: ...

    async def send_input(self, text: str) -> None: ...

    async def end_input(self) -> None: ...

    async def cancel_turn(self) -> None: ...

    async def close(self) -> None: ...

    def nudge(self) -> None: ...

    @property
    def finished(self) -> bool:
        return False


async def test_a_driver_dying_mid_turn_gets_its_turn_recorded_lost(env: Env) -> None:
    factories = default_driver_factories()
    factories["acp"] = _CrashingDriver  # type: ignore[assignment]
    await env.start(factories=factories)
    agent_id = await env.spawn("session")
    await wait_until(lambda: env.has(agent_id, "turn_lost"), T, what="turn_lost")
    lost = next(e.kind for e in await env.events(agent_id) if isinstance(e.kind, TurnLost))
    assert (lost.turn, lost.reason) == (2, "the driver crashed mid-turn")


def test_default_factories_register_acp() -> None:
    assert default_driver_factories()["acp"] is AcpDriver


async def test_prosperod_stop_mid_turn_records_the_lost_turn_then_rejoins(env: Env) -> None:
    await env.start()
    agent_id = await env.spawn("hang around", interactive=True)
    await wait_until(lambda: env.has(agent_id, "tool_started"), T, what="turn running")
    await env.stop()  # prosperod stops while turn 0 is in flight
    listener = env.fake.acp_listeners[agent_id]
    assert listener.agent is not None
    await wait_until(lambda: listener.agent is not None and len(listener.agent.cancels) == 1, T)

    manager = await env.start()
    await wait_until(lambda: listener.agent is not None and len(listener.agent.loads) == 1, T)
    await manager.send_input(agent_id, "are you back?")

    async def replied() -> bool:
        evs = await env.events(agent_id)
        return any(isinstance(e.kind, TurnFinished) and e.kind.turn == 1 for e in evs)

    await wait_until(replied, T, what="turn 1 after rejoin")
    evs = await env.events(agent_id)
    lost = [e.kind for e in evs if isinstance(e.kind, TurnLost)]
    assert len(lost) == 1 and lost[0].turn == 0 and "prosperod stopping" in lost[0].reason
    kinds = [e.kind.kind for e in evs]
    assert kinds.index("tool_finished") < kinds.index("turn_lost")  # open call closed first
    outputs = [e.kind.chunk for e in evs if e.kind.kind == "output"]
    assert outputs == ["working", "echo: are you back?"]


async def test_a_fresh_store_never_reprompts_a_running_acp_agent(env: Env) -> None:
    """Issue 9 item 9: a prosperod with a fresh store (or a second one on the same caliband)
    lists the agent but does not drive it: no session, no second spawn prompt."""
    await env.start()
    agent_id = await env.spawn("chat with me", interactive=True)
    await wait_until(lambda: env.has(agent_id, "turn_finished"), T, what="first turn")
    listener = env.fake.acp_listeners[agent_id]
    assert listener.agent is not None and listener.agent.prompts == ["chat with me"]
    await env.stop()
    sessions = len(listener.agent.sessions)

    env.db = env.db.with_name("fresh.db")  # another prosperod, its own empty store
    env.wire.outgoing.clear()
    manager = await env.start()
    await manager.poll_workspace("app")
    assert agent_id in {a.id for a in manager.list_agents("app")}
    await manager.poll_workspace("app")  # a second poll: still nothing driven
    assert listener.agent.prompts == ["chat with me"]
    assert len(listener.agent.sessions) == sessions and listener.agent.loads == []
    assert "session/prompt" not in env.wire.methods()


async def test_kill_mid_turn_finishes_killed_with_the_call_closed(env: Env) -> None:
    manager = await env.start()
    agent_id = await env.spawn("hang on")
    await wait_until(lambda: env.has(agent_id, "tool_started"), T, what="turn running")
    await manager.kill(agent_id)

    async def finished() -> bool:
        return await env.has(agent_id, "agent_finished")

    await wait_until(finished, T, what="agent_finished")
    evs = await env.events(agent_id)
    ends = [e.kind for e in evs if isinstance(e.kind, AgentFinished)]
    assert len(ends) == 1
    # killed; Cancelled only if the agent answered the kill's session/cancel (and so ended
    # its one-shot session) before caliband's kill landed.
    assert ends[0].outcome in ("killed", "Cancelled")
    lost = [e.kind for e in evs if isinstance(e.kind, TurnLost)]
    assert all("connection to the agent was lost" not in t.reason for t in lost)
    fin = [e.kind for e in evs if isinstance(e.kind, ToolFinished)]
    assert len(fin) == 1 and not fin[0].ok


async def test_an_agent_requiring_authentication_finishes_at_once_without_respawns(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 9 item 10: session/new → -32000 used to loop forever with no event. Now one
    connection, `agent_finished{auth_required}` naming the methods, nothing redialled."""
    from prospero.testkit import fake_acp

    class NeedsAuth(fake_acp.FakeAcpAgent):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(
                *a,
                auth_methods=[{"id": "chatgpt", "name": "Login with ChatGPT"}],
                require_auth=True,
                **kw,
            )

    monkeypatch.setattr(fake_acp, "FakeAcpAgent", NeedsAuth)
    manager = await env.start()
    agent_id = await env.spawn("say hi")
    await wait_until(lambda: env.has(agent_id, "agent_finished"), T, what="agent_finished")
    assert await manager.wait_driver(agent_id, T) is DriverExit.finished
    evs = await env.events(agent_id)
    (end,) = [e.kind for e in evs if isinstance(e.kind, AgentFinished)]
    assert end.outcome == "auth_required" and end.detail is not None
    assert "chatgpt" in end.detail
    await manager.poll_workspace("app")
    await manager.poll_workspace("app")
    listener = env.fake.acp_listeners.get(agent_id)
    if listener is not None:  # (the finished agent's worker may be released already)
        assert listener.connections_total == 1
        assert listener.agent is not None and listener.agent.prompts == []
    assert "session/prompt" not in env.wire.methods()
    assert env.wire.methods().count("initialize") == 1


async def test_the_resume_state_is_committed_with_the_events_it_covers(env: Env) -> None:
    """Contract 1: the FleetManager's sink takes `cursor=`; the stored state after a run is the
    fold of the stored history (turns, no turn in flight, outcome)."""
    await env.start()
    agent_id = await env.spawn("session please")
    await wait_until(lambda: env.has(agent_id, "agent_finished"), T, what="agent_finished")
    await env.emitter.flush()
    state = AcpResumeState.load(await env.store.load_cursor(agent_id))
    assert state is not None and state.terminal and state.outcome == "EndOfTurn"
    assert state.turns == 1 and state.initial_prompt_sent and state.in_flight is None
    assert state.open_tools == [] and state.cost_total == 0.0123
    evs = await env.events(agent_id)
    assert state.session_id == next(e.kind.session_id for e in evs if e.kind.kind == "agent_init")
