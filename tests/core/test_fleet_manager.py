"""FleetManager end to end over real sockets: fake caliband, NdjsonDriver, Emitter, SQLite."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from prospero.core import metrics as m
from prospero.core.bus import InProcessBus
from prospero.core.emitter import Emitter
from prospero.core.errors import (
    AgentNotFound,
    Conflict,
    InvalidState,
    ProviderMisconfigured,
    WorkspaceNotFound,
)
from prospero.core.fleet.manager import FleetConfig, FleetManager, default_driver_factories
from prospero.core.metrics import Metrics
from prospero.core.store.sqlite import SqliteConfigStore, SqliteEventStore
from prospero.testkit import scripts
from prospero.types.api import SpawnRequest
from prospero.types.events import FleetEvent
from prospero.types.model import AgentStatus, RepoProviderConfig
from tests.core.fleet_fixtures import FleetEnv, fleet_env, local_fleet
from tests.support import short_tmpdir, wait_until

__all__ = ["fleet_env"]


FAST = FleetConfig(poll_interval=0.1, backoff_base=0.02, backoff_cap=0.1, terminal_grace=0.2)


class Stack:
    def __init__(
        self, env: FleetEnv, db: Path, poll: bool = False, config: FleetConfig = FAST
    ) -> None:
        self.env = env
        self.db = db
        self.poll = poll
        self.config = config
        self.metrics = Metrics()

    async def start(self) -> FleetManager:
        self.store = SqliteEventStore(self.db)
        await self.store.open()
        self.config_store = SqliteConfigStore(self.db)
        await self.config_store.open()
        self.bus = InProcessBus()
        self.emitter = Emitter(self.store, self.bus, self.metrics)
        await self.emitter.start()
        self.manager = FleetManager(
            local_fleet(),
            self.config_store,
            self.store,
            self.emitter,
            self.metrics,
            self.config,
            driver_factories=default_driver_factories(),
        )
        await self.manager.start(poll=self.poll)
        return self.manager

    async def stop(self) -> None:
        await self.manager.stop()
        await self.emitter.close()
        await self.config_store.close()
        await self.store.close()

    async def events(self, key: str) -> list[FleetEvent]:
        await self.emitter.flush()
        return await self.store.replay(key)

    async def kinds(self, key: str) -> list[str]:
        return [e.kind.kind for e in await self.events(key)]


@pytest.fixture
async def stack(fleet_env: FleetEnv) -> AsyncIterator[Stack]:
    s = Stack(fleet_env, Path(short_tmpdir()) / "events.db", poll=True)
    await s.start()
    await s.manager.add_workspace("app", str(fleet_env.root))
    yield s
    await s.stop()


async def finished(stack: Stack, agent_id: str) -> bool:
    return "agent_finished" in await stack.kinds(agent_id)


async def test_spawn_streams_rich_events_and_finishes(stack: Stack) -> None:
    resp = await stack.manager.spawn("app", SpawnRequest(prompt="tool run please"))
    assert resp.isolated is True and resp.workspace == "app"
    assert stack.env.fake.received_specs[-1].isolation_worktree is True
    await wait_until(lambda: finished(stack, resp.agent_id), 15, what="agent_finished")

    async def done() -> bool:
        await stack.manager.poll_workspace("app")
        return stack.manager.get_agent(resp.agent_id).status == AgentStatus.done

    await wait_until(done, 10, what="status done")
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
