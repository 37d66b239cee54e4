"""The real in-process stack for the fault suite: a fake caliband (per-spawn script + fault
plan), LocalFleet, FleetManager with the real NdjsonDriver, Emitter and SQLite store."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from prospero.core.discovery import socket_path_for
from prospero.core.drivers.base import AgentDriver, DriverOptions, DriverTarget, EventSink
from prospero.core.fleet.manager import FleetConfig, default_driver_factories
from prospero.core.metrics import Metrics
from prospero.core.sources import canonical_root
from prospero.testkit import scripts
from prospero.testkit.fake_agent import FakeAgentWorker
from prospero.testkit.fake_caliband import FakeCaliband
from prospero.testkit.faults import FaultPlan
from prospero.types.api import SpawnRequest
from prospero.types.events import FleetEvent
from tests.core.fleet_fixtures import ManagedStores, make_git_repo
from tests.support import short_tmpdir, wait_until

CONFIG = FleetConfig(poll_interval=0.1, backoff_base=0.02, backoff_cap=0.2, terminal_grace=1.0)
REMOTE_ROOT = "/nonexistent-remote-host/caliban/agents"


class _RemoteTarget(DriverTarget):
    """A target whose session dir is a path on another host (a remote caliband): the agent's
    transcript is never readable here, whatever is filled in later."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "session_dir":
            value = f"{REMOTE_ROOT}/{self.agent_id}"
        super().__setattr__(name, value)


@dataclasses.dataclass
class Case:
    """One spawned agent of the suite: its script and fault plan, by its prompt keyword."""

    key: str
    script: scripts.Script
    plan: FaultPlan | None = None
    remote: bool = False
    agent_id: str = ""


class FaultStack(ManagedStores):
    def __init__(self, monkeypatch: pytest.MonkeyPatch, config: FleetConfig = CONFIG) -> None:
        self.monkeypatch = monkeypatch
        self.config = config
        self.cases: dict[str, Case] = {}
        self.remote_ids: set[str] = set()
        self.metrics = Metrics()

    # --- what the fake caliband plays, per spawn -----------------------------------------------

    def _case(self, prompt: str) -> Case:
        return self.cases[prompt.split(maxsplit=1)[0]]

    def _factory(
        self,
        target: DriverTarget,
        sink: EventSink,
        options: DriverOptions,
        metrics: Metrics,
        cursor_store: Any,
    ) -> AgentDriver:
        from prospero.core.drivers.ndjson import NdjsonDriver

        case = self._case(target.prompt) if target.prompt else None
        if target.agent_id in self.remote_ids or (case is not None and case.remote):
            target = _RemoteTarget(
                **{f.name: getattr(target, f.name) for f in dataclasses.fields(target)}
            )
        return NdjsonDriver(target, sink, options, metrics, cursor_store)

    async def start(self) -> None:
        self.runtime_dir = short_tmpdir()
        self.monkeypatch.setenv("CALIBAN_DAEMON_RUNTIME_DIR", self.runtime_dir)
        self.work = Path(short_tmpdir())
        root = make_git_repo(self.work / "app")
        self.root = canonical_root(str(root))
        sock = socket_path_for(self.root)
        Path(sock).parent.mkdir(parents=True, exist_ok=True)
        self.fake = await FakeCaliband.start_unix(
            sock,
            root=self.root,
            script_for=lambda spec: self._case(spec.initial_prompt).script,
            fault_plan_for=lambda spec: self._case(spec.initial_prompt).plan,
            start_paused=True,
        )
        self.db = self.work / "events.db"
        await self.open_stores()
        factories = default_driver_factories()
        factories["ndjson"] = self._factory
        self.manager = self.new_manager(self.config, factories)
        await self.manager.start(poll=True)
        await self.manager.add_workspace("app", self.root)

    async def stop(self) -> None:
        await self.close_stores(self.manager)
        await self.fake.stop()
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)

    # --- driving one case ----------------------------------------------------------------------

    async def spawn(self, case: Case) -> FakeAgentWorker:
        """Spawn the case's agent; its worker starts playing once a reader is connected (so
        the run never begins before Prospero attached, as right after a real spawn)."""
        self.cases[case.key] = case
        resp = await self.manager.spawn(
            "app", SpawnRequest(prompt=f"{case.key} go", isolation="shared")
        )
        case.agent_id = resp.agent_id
        if case.remote:
            self.remote_ids.add(resp.agent_id)
        w = self.fake.workers[resp.agent_id]
        await wait_until(lambda: w.connections_total > 0, 30, interval=0.005, what="first dial")
        w.resume()
        return w

    async def history(self, agent_id: str) -> list[FleetEvent]:
        return await self.events(agent_id)

    async def settle(
        self,
        case: Case,
        w: FakeAgentWorker,
        timeout: float = 40.0,
        done: Callable[[list[FleetEvent]], bool] | None = None,
    ) -> list[FleetEvent]:
        """Wait for the run to end and its history to be complete (agent_finished stored and
        the driver run over); returns the history as stored, or as it stands at `timeout`."""

        async def complete() -> bool:
            if not w.finished:
                return False
            await self.emitter.flush()
            if done is not None:
                return done(await self.store.replay(case.agent_id))
            return bool(await self.store.replay(case.agent_id, kinds=["agent_finished"]))

        try:
            await wait_until(complete, timeout, interval=0.05, what=f"{case.key} finished")
            await self.manager.wait_driver(case.agent_id, 10)
        except (AssertionError, TimeoutError):
            pass
        return await self.history(case.agent_id)


@pytest.fixture
async def stack(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FaultStack]:
    """A started FaultStack, stopped after the test (import it into a test module to use it)."""
    s = FaultStack(monkeypatch)
    await s.start()
    yield s
    await s.stop()
