"""FleetManager end to end over real sockets: fake caliband, NdjsonDriver, Emitter, SQLite."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from prospero.core import metrics as m
from prospero.core.drivers.base import DriverExit, DriverTarget
from prospero.core.errors import (
    AgentNotFound,
    Conflict,
    InvalidState,
    ProviderMisconfigured,
    WorkspaceNotFound,
)
from prospero.core.fleet.manager import FleetConfig, FleetManager, default_driver_factories
from prospero.core.metrics import Metrics
from prospero.core.store.sqlite.events import SqliteEventStore
from prospero.core.wire.control import SpawnSpec
from prospero.testkit import scripts
from prospero.testkit.fake_caliband import FakeCaliband
from prospero.types.api import SpawnRequest
from prospero.types.events import AgentFinished, FleetEvent
from prospero.types.model import AgentStatus, RepoProviderConfig
from tests.core.fleet_fixtures import FleetEnv, ManagedStores, fleet_env, local_fleet
from tests.support import short_tmpdir, wait_until

__all__ = ["fleet_env"]


FAST = FleetConfig(poll_interval=0.1, backoff_base=0.02, backoff_cap=0.1, terminal_grace=0.2)


class Stack(ManagedStores):
    def __init__(
        self, env: FleetEnv, db: Path, poll: bool = False, config: FleetConfig = FAST
    ) -> None:
        self.env = env
        self.db = db
        self.poll = poll
        self.config = config
        self.metrics = Metrics()

    async def start(self) -> FleetManager:
        await self.open_stores()
        self.manager = self.new_manager(self.config, default_driver_factories())
        await self.manager.start(poll=self.poll)
        return self.manager

    async def stop(self) -> None:
        await self.close_stores(self.manager)


@pytest.fixture
async def stack(fleet_env: FleetEnv) -> AsyncIterator[Stack]:
    s = Stack(fleet_env, Path(short_tmpdir()) / "events.db", poll=True)
    await s.start()
    await s.manager.add_workspace("app", str(fleet_env.root))
    yield s
    await s.stop()


async def finished(stack: Stack, agent_id: str) -> bool:
    return "agent_finished" in await stack.kinds(agent_id)


async def wait_status_done(stack: Stack, agent_id: str) -> None:
    """Poll the workspace until the manager lists the agent as done."""

    async def done() -> bool:
        await stack.manager.poll_workspace("app")
        return stack.manager.get_agent(agent_id).status == AgentStatus.done

    await wait_until(done, 10, what="status done")


async def test_spawn_streams_rich_events_and_finishes(stack: Stack) -> None:
    resp = await stack.manager.spawn("app", SpawnRequest(prompt="tool run please"))
    assert resp.isolated is True and resp.workspace == "app"
    assert stack.env.fake.received_specs[-1].isolation_worktree is True
    await wait_until(lambda: finished(stack, resp.agent_id), 15, what="agent_finished")
    await wait_status_done(stack, resp.agent_id)
    evs = await stack.events(resp.agent_id)
    kinds = [e.kind.kind for e in evs]
    assert kinds[0] == "agent_spawned"
    assert "tool_started" in kinds and "tool_finished" in kinds
    started = next(e.kind for e in evs if e.kind.kind == "tool_started")
    assert started.input is not None  # real input, not upstream's null
    fin = next(e.kind for e in evs if e.kind.kind == "tool_finished")
    assert fin.name and fin.result is not None
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1))
    assert kinds.count("agent_finished") == 1
    changes = [e.kind for e in evs if e.kind.kind == "status_changed"]
    assert all(c.from_ != c.to for c in changes)


async def test_shared_tree_opt_out(stack: Stack) -> None:
    resp = await stack.manager.spawn("app", SpawnRequest(prompt="hi", isolation="shared"))
    assert resp.isolated is False
    assert stack.env.fake.received_specs[-1].isolation_worktree is False


async def test_discovers_pre_existing_agents_and_status_changes(stack: Stack) -> None:
    rec = await stack.env.fake.add_agent(script=[scripts.turn_start(0), scripts.sleep(3600)])
    await wait_until(lambda: stack.manager.knows_agent(rec.id), 10, what="discovered")
    assert (await stack.kinds(rec.id))[0] == "agent_discovered"
    stack.env.fake.set_status(rec.id, AgentStatus.idle)

    async def changed() -> bool:
        return "status_changed" in await stack.kinds(rec.id)

    await wait_until(changed, 10, what="status_changed")
    ev = next(e for e in await stack.events(rec.id) if e.kind.kind == "status_changed")
    assert (ev.kind.from_, ev.kind.to) == (AgentStatus.running, AgentStatus.idle)
    stack.env.fake.remove_agent(rec.id)

    async def gone() -> bool:
        return "agent_gone" in await stack.kinds(rec.id)

    await wait_until(gone, 10, what="agent_gone")
    with pytest.raises(AgentNotFound):
        stack.manager.get_agent(rec.id)
    # history outlives registry presence
    assert len(await stack.events(rec.id)) >= 3


async def test_unreachable_caliband_degrades_and_recovers(stack: Stack) -> None:
    await stack.env.fake.stop()

    async def health(state: str) -> bool:
        evs = await stack.events("repo:app")
        return bool(evs) and evs[-1].kind.state.state == state

    await wait_until(lambda: health("unreachable"), 10, what="unreachable")
    snap = stack.manager.snapshot()
    assert snap.workspaces[0].health.state == "unreachable"
    await stack.env.restart_fake()
    await wait_until(lambda: health("healthy"), 10, what="healthy again")
    kinds = [e.kind.state.state for e in await stack.events("repo:app")]
    assert kinds == ["unreachable", "healthy"]  # transitions only, no repeats


async def test_steering_interactive_agent(stack: Stack) -> None:
    resp = await stack.manager.spawn("app", SpawnRequest(prompt="chat with me", interactive=True))
    worker = stack.env.fake.workers[resp.agent_id]
    await wait_until(lambda: stack.env.fake.status_of(resp.agent_id) == AgentStatus.idle, 10)
    await stack.manager.poll_workspace("app")
    await stack.manager.send_input(resp.agent_id, "also update the changelog")
    await wait_until(lambda: any(f.get("type") == "UserMessage" for f in worker.inbound), 10)
    await wait_until(lambda: stack.env.fake.status_of(resp.agent_id) == AgentStatus.idle, 10)
    await stack.manager.end_input(resp.agent_id)
    await wait_until(lambda: finished(stack, resp.agent_id), 15, what="finished after end-input")
    outputs = [e.kind.chunk for e in await stack.events(resp.agent_id) if e.kind.kind == "output"]
    assert any("also update the changelog" in c for c in outputs)


async def test_steering_refused_for_non_interactive_and_unknown(stack: Stack) -> None:
    resp = await stack.manager.spawn("app", SpawnRequest(prompt="long job"))
    with pytest.raises(InvalidState):
        await stack.manager.send_input(resp.agent_id, "hi")
    with pytest.raises(InvalidState):
        await stack.manager.cancel_turn(resp.agent_id)  # NDJSON cannot cancel a turn
    with pytest.raises(AgentNotFound):
        await stack.manager.send_input("nope", "hi")
    with pytest.raises(WorkspaceNotFound):
        await stack.manager.spawn("nope", SpawnRequest(prompt="x"))


async def test_kill_respawn_remove(stack: Stack) -> None:
    resp = await stack.manager.spawn("app", SpawnRequest(prompt="long job"))
    await stack.manager.kill(resp.agent_id)
    assert stack.manager.get_agent(resp.agent_id).status == AgentStatus.killed
    new_id = await stack.manager.respawn(resp.agent_id)
    assert new_id != resp.agent_id
    assert stack.manager.get_agent(new_id).status in (AgentStatus.running, AgentStatus.spawning)
    with pytest.raises(InvalidState):
        await stack.manager.remove(new_id)
    await stack.manager.remove(new_id, force=True)
    with pytest.raises(AgentNotFound):
        stack.manager.get_agent(new_id)
    assert (await stack.kinds(new_id))[-1] == "agent_gone"


async def test_drain_ends_input_then_kills_on_timeout(stack: Stack) -> None:
    resp = await stack.manager.spawn("app", SpawnRequest(prompt="long job"))
    await stack.manager.drain(resp.agent_id, timeout=0.3)
    assert stack.manager.get_agent(resp.agent_id).status == AgentStatus.killed


async def test_provider_key_and_acp_gate(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    await stack.manager.set_workspace_config(
        "app", RepoProviderConfig(provider="anthropic", api_key_from_env="MY_KEY")
    )
    # Applying a config shuts the workspace's caliband down (autostart would bring it back
    # with the new environment); here the test plays autostart.
    assert stack.env.fake.shutdown_count == 1
    await stack.env.fake.stop()
    await stack.env.restart_fake()
    monkeypatch.delenv("MY_KEY", raising=False)
    with pytest.raises(ProviderMisconfigured, match="MY_KEY"):
        await stack.manager.spawn("app", SpawnRequest(prompt="x"))
    monkeypatch.setenv("MY_KEY", "sk-test")
    ok = await stack.manager.spawn("app", SpawnRequest(prompt="x"))
    assert stack.env.fake.received_specs[-1].provider == "anthropic"
    assert ok.agent_id
    with pytest.raises(Conflict, match="allow-acp"):
        await stack.manager.spawn("app", SpawnRequest(prompt="x", drive_protocol="acp"))


async def test_workspace_registry_rules(stack: Stack) -> None:
    assert await stack.manager.add_workspace("app", str(stack.env.root)) is False  # idempotent
    with pytest.raises(Conflict):
        await stack.manager.add_workspace("other", str(stack.env.root))  # same root
    with pytest.raises(Conflict):
        await stack.manager.add_workspace("app", "/tmp")  # same name, other root
    await stack.manager.remove_workspace("app")
    assert stack.manager.snapshot().workspaces == []
    with pytest.raises(WorkspaceNotFound):
        await stack.manager.remove_workspace("app")


async def test_restart_resumes_exactly_from_the_stored_cursor(fleet_env: FleetEnv) -> None:
    """prosperod stops mid-run, the agent keeps going (its ring scrolls past line 1024), a new
    prosperod re-attaches: every output exactly once, no gap, seq contiguous."""
    db = Path(short_tmpdir()) / "events.db"
    long = scripts.long_script(1500)
    rec = await fleet_env.fake.add_agent(script=long, interactive=True, start=False)
    worker = fleet_env.fake.workers[rec.id]
    n_out = sum(1 for e in long if isinstance(e, dict) and e.get("type") == "AssistantTextDelta")

    async def outputs(s: Stack) -> int:
        return sum(1 for e in await s.events(rec.id) if e.kind.kind == "output")

    first = Stack(fleet_env, db, poll=True)
    await first.start()
    await first.manager.add_workspace("app", str(fleet_env.root))
    await wait_until(lambda: first.manager.metrics.get("active_attaches") >= 1, 10)
    worker.start()
    await wait_until(lambda: worker.lines_emitted >= 850, 20, what="850 lines")
    worker.pause()
    seen_out = sum(1 for ln in worker.history if b"AssistantTextDelta" in ln)
    await wait_until(lambda: _ge(outputs(first), seen_out), 20, what="first run caught up")
    assert worker.lines_dropped == 0
    await first.stop()  # flushes the store and saves the driver cursor
    worker.resume()  # the agent goes on while nobody watches
    await wait_until(lambda: worker.lines_emitted >= len(long) - 1, 20, what="agent done emitting")
    second = Stack(fleet_env, db, poll=True)
    await second.start()
    await wait_until(lambda: _ge(outputs(second), n_out), 20, what="all outputs after restart")
    await second.manager.end_input(rec.id)
    await wait_until(lambda: finished(second, rec.id), 20, what="finished after restart")
    assert await outputs(second) == n_out
    evs = await second.events(rec.id)
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1))
    assert not any(e.kind.kind == "stream_gap" for e in evs)
    chunks = [e.kind.chunk for e in evs if e.kind.kind == "output"]
    assert len(set(chunks)) == len(chunks) == n_out
    await second.stop()


async def _ge(a: object, b: int) -> bool:
    return (await a) >= b  # type: ignore[misc,operator]


async def test_a_status_change_ends_a_reconnect_backoff(fleet_env: FleetEnv) -> None:
    """A driver whose first dial found no worker waits out a long backoff; when the poll sees
    the agent finish, the driver looks again at once and recovers the run from its
    transcript, well before the backoff (15-30 s here) or the terminal grace would end."""
    slow = FleetConfig(poll_interval=0.1, backoff_base=30.0, backoff_cap=60.0, terminal_grace=20.0)
    s = Stack(fleet_env, Path(short_tmpdir()) / "events.db", poll=True, config=slow)
    await s.start()
    try:
        await s.manager.add_workspace("app", str(fleet_env.root))
        rec = await fleet_env.fake.add_agent(serve=False, status=AgentStatus.running)
        await wait_until(
            lambda: s.metrics.get(m.ATTACH_RECONNECTS) >= 1, 10, what="driver in its backoff"
        )
        # the worker ran and exited meanwhile, leaving its transcript
        lines = [json.dumps(e) for e in scripts.default_script() if not scripts.is_directive(e)]
        (Path(rec.session_dir) / "stdout.ndjson").write_text("\n".join(lines) + "\n")
        fleet_env.fake.set_status(rec.id, AgentStatus.done)
        await wait_until(lambda: finished(s, rec.id), 10, what="run recovered after the nudge")
        assert s.metrics.get(m.TRANSCRIPT_RECOVERIES) == 1
        assert s.metrics.get(m.ATTACH_RECONNECTS) == 1
    finally:
        await s.stop()


# --- Prospero's own agent metadata, discovery, catch-up, kill and adopt (issue 9) -------------

ACP = FleetConfig(
    poll_interval=0.1, backoff_base=0.02, backoff_cap=0.1, terminal_grace=0.2, allow_acp=True
)


def _count(kinds: list[str], kind: str) -> int:
    return sum(1 for k in kinds if k == kind)


async def test_posture_and_protocol_live_in_prosperos_store_not_in_the_echo(
    fleet_env: FleetEnv,
) -> None:
    """caliband drops the spec keys it does not know: the posture never travels on the wire
    and is never read back from `listed`; it survives a restart through AgentMeta."""
    db = Path(short_tmpdir()) / "events.db"
    first = Stack(fleet_env, db, poll=True)
    await first.start()
    await first.manager.add_workspace("app", str(fleet_env.root))
    resp = await first.manager.spawn("app", SpawnRequest(prompt="hi", posture="supervised"))
    assert "permission_posture" not in fleet_env.fake.received_spec_keys[-1]
    listed = await local_fleet().list_agents(fleet_env.workspace)
    (rec,) = [r for r in listed if r.id == resp.agent_id]
    assert rec.spec.posture is None  # caliband's echo carries none
    agent = first.manager.get_agent(resp.agent_id)
    assert (agent.posture, agent.spawned_here) == ("supervised", True)
    assert agent.drive_protocol == "ndjson"
    await wait_until(lambda: finished(first, resp.agent_id), 15, what="agent_finished")
    await first.stop()

    second = Stack(fleet_env, db, poll=True)
    await second.start()
    try:
        await wait_until(lambda: second.manager.knows_agent(resp.agent_id), 10, what="listed")
        again = second.manager.get_agent(resp.agent_id)
        assert (again.posture, again.spawned_here) == ("supervised", True)
        assert again.outcome == "EndOfTurn" and again.status == AgentStatus.done
        # a restart does not re-announce an agent this store already knows
        kinds = await second.kinds(resp.agent_id)
        assert _count(kinds, "agent_discovered") == 0 and _count(kinds, "agent_finished") == 1
    finally:
        await second.stop()


async def test_agent_discovered_once_per_store(fleet_env: FleetEnv) -> None:
    rec = await fleet_env.fake.add_agent(script=[scripts.turn_start(0), scripts.sleep(3600)])
    db = Path(short_tmpdir()) / "events.db"
    for _ in range(3):  # three prosperod lives on one store
        s = Stack(fleet_env, db, poll=True)
        await s.start()
        if not s.manager.list_workspaces():
            await s.manager.add_workspace("app", str(fleet_env.root))
        await wait_until(lambda s=s: s.manager.knows_agent(rec.id), 10, what="listed")
        await wait_until(lambda s=s: _ge(_n_events(s, rec.id), 1), 10, what="something stored")
        await s.stop()
    kinds = [e.kind.kind for e in await _replay(db, rec.id)]
    assert _count(kinds, "agent_discovered") == 1
    # a fresh store has never seen it: discovered again, there
    fresh = Stack(fleet_env, Path(short_tmpdir()) / "events.db", poll=True)
    await fresh.start()
    try:
        await fresh.manager.add_workspace("app", str(fleet_env.root))
        assert (await fresh.kinds(rec.id))[:1] == ["agent_discovered"]
    finally:
        await fresh.stop()


async def _n_events(s: Stack, key: str) -> int:
    return len(await s.events(key))


async def _replay(db: Path, key: str) -> list[FleetEvent]:
    store = SqliteEventStore(db)
    await store.open()
    try:
        return await store.replay(key)
    finally:
        await store.close()


async def test_agents_that_finished_while_prosperod_was_down_are_caught_up(
    fleet_env: FleetEnv,
) -> None:
    """One agent was half-read when prosperod stopped, five were never seen at all: all six
    end while nobody watches. On restart each gets one (bounded) catch-up run: its whole
    history, `agent_finished` once, no duplicates, no gap."""
    db = Path(short_tmpdir()) / "events.db"
    long = scripts.long_script(400)
    n_out = sum(1 for e in long if isinstance(e, dict) and e.get("type") == "AssistantTextDelta")
    # paced, so that the pause below lands mid-run (unpaced, the run can end before it)
    rec = await fleet_env.fake.add_agent(script=long, start=False, line_delay=0.002)
    worker = fleet_env.fake.workers[rec.id]
    first = Stack(fleet_env, db, poll=True)
    await first.start()
    await first.manager.add_workspace("app", str(fleet_env.root))
    await wait_until(lambda: first.metrics.get("active_attaches") >= 1, 10, what="attached")
    worker.start()
    await wait_until(lambda: worker.lines_emitted >= 150, 20, what="150 lines")
    worker.pause()
    assert worker.lines_emitted < len(long) - 10  # stopped mid-run
    seen = sum(1 for ln in worker.history if b"AssistantTextDelta" in ln)

    async def outputs(s: Stack, key: str) -> int:
        return sum(1 for e in await s.events(key) if e.kind.kind == "output")

    await wait_until(lambda: _ge(outputs(first, rec.id), seen), 20, what="first run caught up")
    await first.stop()
    worker.resume()
    unseen = [await fleet_env.fake.add_agent(script=long) for _ in range(5)]
    everyone = [rec, *unseen]
    for r in everyone:
        w = fleet_env.fake.workers[r.id]
        await w.wait_finished(20)
        await wait_until(lambda r=r: fleet_env.fake.status_of(r.id) == AgentStatus.done, 10)

    second = Stack(fleet_env, db, poll=True)
    await second.start()
    try:
        for r in everyone:
            await wait_until(lambda r=r: finished(second, r.id), 30, what=f"{r.id} caught up")
        assert second.manager._catchup.total == 6
        for r in everyone:
            evs = await second.events(r.id)
            kinds = [e.kind.kind for e in evs]
            assert _count(kinds, "agent_finished") == 1 and "stream_gap" not in kinds
            assert await outputs(second, r.id) == n_out
            chunks = [e.kind.chunk for e in evs if e.kind.kind == "output"]
            assert len(set(chunks)) == n_out
            assert [e.seq for e in evs] == list(range(1, len(evs) + 1))
    finally:
        await second.stop()


async def test_kill_of_a_finished_agent_is_refused_and_changes_nothing(stack: Stack) -> None:
    resp = await stack.manager.spawn("app", SpawnRequest(prompt="hi"))
    await wait_until(lambda: finished(stack, resp.agent_id), 15, what="agent_finished")
    await wait_status_done(stack, resp.agent_id)
    before = await stack.kinds(resp.agent_id)
    with pytest.raises(InvalidState, match="already finished"):
        await stack.manager.kill(resp.agent_id)
    assert not any(type(r).__name__ == "KillReq" for r in stack.env.fake.requests)
    assert stack.env.fake.status_of(resp.agent_id) == AgentStatus.done
    assert stack.manager.get_agent(resp.agent_id).status == AgentStatus.done
    assert await stack.kinds(resp.agent_id) == before


async def test_kill_of_a_running_agent_ends_with_agent_finished_killed(stack: Stack) -> None:
    resp = await stack.manager.spawn("app", SpawnRequest(prompt="long job"))
    worker = stack.env.fake.workers[resp.agent_id]
    await wait_until(lambda: worker.lines_emitted >= 1, 10, what="the run is going")
    await stack.manager.kill(resp.agent_id)
    await wait_until(lambda: finished(stack, resp.agent_id), 10, what="agent_finished")
    evs = await stack.events(resp.agent_id)
    fins = [e.kind for e in evs if e.kind.kind == "agent_finished"]
    assert len(fins) == 1 and fins[0].outcome == "killed"
    assert stack.manager.get_agent(resp.agent_id).status == AgentStatus.killed
    with pytest.raises(InvalidState):
        await stack.manager.kill(resp.agent_id)  # now it is finished


async def _has(s: Stack, key: str, kind: str) -> bool:
    return kind in await s.kinds(key)


async def test_an_acp_agent_spawned_elsewhere_is_listed_never_driven_until_adopted(
    fleet_env: FleetEnv,
) -> None:
    rec = await fleet_env.fake.add_agent(
        spec=SpawnSpec(initial_prompt="someone else's task", drive_protocol="acp"),
        interactive=True,
    )
    listener = fleet_env.fake.acp_listeners[rec.id]
    s = Stack(fleet_env, Path(short_tmpdir()) / "events.db", poll=True, config=ACP)
    await s.start()
    try:
        await s.manager.add_workspace("app", str(fleet_env.root))
        polled = s.metrics.get(m.REPOS_POLLED)
        await wait_until(lambda: s.metrics.get(m.REPOS_POLLED) >= polled + 5, 10, what="polls")
        agent = s.manager.get_agent(rec.id)
        assert agent.drive_protocol == "acp" and not agent.spawned_here and not agent.adopted
        assert listener.connections_total == 0  # listed, never prompted
        with pytest.raises(InvalidState, match="adopt"):
            await s.manager.send_input(rec.id, "hello?")
        adopted = await s.manager.adopt(rec.id)
        assert adopted.adopted and adopted.drive_protocol == "acp"
        await wait_until(lambda: listener.connections_total >= 1, 10, what="driven after adopt")
        meta = await s.manager.agents.get_meta(rec.id)
        assert meta is not None and meta.adopted and not meta.spawned_here
        assert (await s.manager.adopt(rec.id)).adopted  # idempotent
    finally:
        await s.stop()


async def test_a_second_prosperod_on_a_fresh_store_never_drives_the_first_ones_acp_agent(
    fleet_env: FleetEnv,
) -> None:
    first = Stack(fleet_env, Path(short_tmpdir()) / "events.db", poll=True, config=ACP)
    await first.start()
    second = Stack(fleet_env, Path(short_tmpdir()) / "events.db", poll=True, config=ACP)
    await second.start()
    try:
        await first.manager.add_workspace("app", str(fleet_env.root))
        resp = await first.manager.spawn(
            "app", SpawnRequest(prompt="chat", drive_protocol="acp", interactive=True)
        )
        listener = fleet_env.fake.acp_listeners[resp.agent_id]
        await wait_until(lambda: _has(first, resp.agent_id, "turn_finished"), 10, what="turn 0")
        await second.manager.add_workspace("app", str(fleet_env.root))
        polled = second.metrics.get(m.REPOS_POLLED)
        await wait_until(lambda: second.metrics.get(m.REPOS_POLLED) >= polled + 5, 10)
        assert listener.connections_total == 1  # only the first prosperod's session
        assert listener.agent is not None and len(listener.agent.prompts) == 1
        assert not second.manager.get_agent(resp.agent_id).spawned_here
    finally:
        await second.stop()
        await first.stop()
    # the first prosperod comes back on a fresh store: it has no record of spawning it either
    third = Stack(fleet_env, Path(short_tmpdir()) / "events.db", poll=True, config=ACP)
    await third.start()
    try:
        await third.manager.add_workspace("app", str(fleet_env.root))
        polled = third.metrics.get(m.REPOS_POLLED)
        await wait_until(lambda: third.metrics.get(m.REPOS_POLLED) >= polled + 5, 10)
        assert listener.connections_total == 1 and len(listener.agent.prompts) == 1
    finally:
        await third.stop()


async def test_a_finished_acp_session_reads_finished_and_its_worker_is_released(
    fleet_env: FleetEnv,
) -> None:
    """An agent without `session/close` keeps its worker `running` in caliband after the
    session ended: Prospero shows its outcome, releases the worker (caliband kill) without
    rewriting that outcome, and refuses a user kill."""
    await fleet_env.fake.stop()
    fleet_env.fake = await FakeCaliband.start_unix(
        fleet_env.sock, root=fleet_env.root, acp_close_session=False
    )
    s = Stack(fleet_env, Path(short_tmpdir()) / "events.db", poll=True, config=ACP)
    await s.start()
    try:
        await s.manager.add_workspace("app", str(fleet_env.root))
        resp = await s.manager.spawn("app", SpawnRequest(prompt="do it", drive_protocol="acp"))
        await wait_until(lambda: finished(s, resp.agent_id), 15, what="agent_finished")
        await wait_until(
            lambda: fleet_env.fake.status_of(resp.agent_id) == AgentStatus.killed,
            10,
            what="worker released",
        )
        kills = [r for r in fleet_env.fake.requests if type(r).__name__ == "KillReq"]
        assert len(kills) == 1
        await s.manager.poll_workspace("app")
        agent = s.manager.get_agent(resp.agent_id)
        assert agent.status == AgentStatus.done and agent.outcome == "EndOfTurn"
        (listed,) = [a for a in s.manager.list_agents("app") if a.id == resp.agent_id]
        assert listed.status == AgentStatus.done
        evs = await s.events(resp.agent_id)
        changes = [(e.kind.from_, e.kind.to) for e in evs if e.kind.kind == "status_changed"]
        assert changes[-1][1] == AgentStatus.done
        assert all(to != AgentStatus.killed for _f, to in changes)
        with pytest.raises(InvalidState):
            await s.manager.kill(resp.agent_id)
        assert len([r for r in fleet_env.fake.requests if type(r).__name__ == "KillReq"]) == 1
    finally:
        await s.stop()


class _SilentDriver:
    """A driver that never sees its run end by itself (it only stops when closed): the
    manager's terminal-grace fallback must conclude it, once."""

    protocol = "ndjson"
    made: list[_SilentDriver] = []

    def __init__(self, target: DriverTarget, sink: Any, *_args: Any) -> None:
        self.target, self.sink = target, sink
        self.concluded: list[tuple[str, str]] = []
        self.statuses: list[AgentStatus | None] = []
        self._closed = asyncio.Event()
        self._finished = False
        _SilentDriver.made.append(self)

    async def run(self) -> DriverExit:
        self.statuses.append(self.target.status())
        await self._closed.wait()
        return DriverExit.closed

    async def conclude(self, outcome: str, detail: str) -> None:
        if self._finished:
            return
        self.concluded.append((outcome, detail))
        self._finished = True
        await self.sink(AgentFinished(outcome=outcome, detail=detail))

    async def send_input(self, text: str) -> None: ...

    async def end_input(self) -> None: ...

    async def cancel_turn(self) -> None: ...

    async def close(self) -> None:
        self._closed.set()

    def nudge(self) -> None:
        self.statuses.append(self.target.status())

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def turn_in_flight(self) -> int | None:
        return None


async def test_a_terminal_agent_whose_run_never_ended_is_concluded_once(
    fleet_env: FleetEnv,
) -> None:
    _SilentDriver.made.clear()
    s = Stack(fleet_env, Path(short_tmpdir()) / "events.db", poll=True)
    await s.start()
    s.manager.driver_factories["ndjson"] = _SilentDriver  # type: ignore[assignment]
    try:
        await s.manager.add_workspace("app", str(fleet_env.root))
        resp = await s.manager.spawn("app", SpawnRequest(prompt="long job"))
        (driver,) = _SilentDriver.made
        assert driver.target.session_dir  # filled in from caliband's record after the spawn
        await s.manager.kill(resp.agent_id)
        await wait_until(lambda: finished(s, resp.agent_id), 10, what="concluded")
        assert driver.statuses[-1] == AgentStatus.killed  # nudged, with caliband's status
        assert driver.concluded[0][0] == "killed" and len(driver.concluded) == 1
        polled = s.metrics.get(m.REPOS_POLLED)
        await wait_until(lambda: s.metrics.get(m.REPOS_POLLED) >= polled + 5, 10, what="polls")
        assert len(driver.concluded) == 1
        assert _count(await s.kinds(resp.agent_id), "agent_finished") == 1
        agent = s.manager.get_agent(resp.agent_id)
        assert (agent.status, agent.outcome) == (AgentStatus.killed, "killed")
    finally:
        await s.stop()


def test_a_quiet_workspace_backs_off_and_any_activity_resets_it() -> None:
    """Issue 11 (idle cost): the poll interval stays at `poll_interval` while the workspace
    changed within `poll_quiet_after`, then grows with the quiet time up to
    `poll_interval * poll_idle_backoff`; `_touch` (an event, an API action, a driver run
    ending) brings the next poll back within `poll_interval`."""
    import time

    config = FleetConfig(poll_interval=1.0, poll_idle_backoff=8.0, poll_quiet_after=10.0)
    manager = FleetManager.__new__(FleetManager)
    manager.config = config
    manager._slots = {}
    manager._changed_at = {"w": 100.0}
    manager._due = {}
    manager._wake = asyncio.Event()
    assert manager._interval("w", 105.0) == 1.0  # changed recently
    assert manager._interval("w", 112.0) == 6.0  # quiet for 12 s
    assert manager._interval("w", 200.0) == 8.0  # capped
    manager._due["w"] = time.monotonic() + 8.0
    manager._touch("w")
    assert manager._due["w"] <= time.monotonic() + 1.0 and manager._wake.is_set()
    assert manager._interval("w", time.monotonic()) == 1.0
    fixed = FleetConfig(poll_interval=1.0, poll_idle_backoff=1.0)
    manager.config = fixed
    assert manager._interval("w", 1e9) == 1.0  # 1.0 = the old fixed cadence
