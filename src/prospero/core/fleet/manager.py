"""FleetManager: the engine between a FleetProvider and the event path.

It keeps the workspace registry, polls each workspace's agents, diffs the result into
lifecycle events, runs one AgentDriver per active agent (whose events it sequences, stores and
publishes through the Emitter), and exposes the operations the API needs. It never supervises:
spawn, kill, respawn and rm go to the provider (caliband).

This module holds the registry (workspaces, their health and admin), the lookups and views the
API reads, and the lifecycle (start/stop). Parts: `polling.py` (the poll loop, its idle backoff,
and the diff of a listing into events), `supervision.py` (one driver per agent: build, run
under a lease, close), `sink.py` (the EventSink a driver writes to), `operations.py` (the agent
operations), `ending.py` (how a run ends: conclude, outcome, ACP worker release), `meta.py`
(the provider's record overlaid with Prospero's AgentMeta), `catchup.py` (first sight of an
agent; catch-up of agents that ended while nobody watched), `state.py` (the shared config,
slot and seams). What crosses the provider seam: `records.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time

from prospero.core.budgets_daily import DailyBudgets
from prospero.core.errors import (
    AgentNotFound,
    Conflict,
    ProsperoError,
    Unsupported,
    WorkspaceNotFound,
)
from prospero.core.fleet.catchup import CatchUpGate
from prospero.core.fleet.ending import RunEnding
from prospero.core.fleet.meta import agent_view
from prospero.core.fleet.operations import AgentOperations
from prospero.core.fleet.polling import Polling
from prospero.core.fleet.provider import FleetProvider, WorkspaceAdmin
from prospero.core.fleet.records import ListedAgent
from prospero.core.fleet.sink import AgentSink
from prospero.core.fleet.state import (
    AgentSlot,
    DecisionHooks,
    DriverFactory,
    EmitterLike,
    FleetConfig,
)
from prospero.core.fleet.supervision import DriverSupervision
from prospero.core.metrics import Metrics
from prospero.core.ownership import Ownership, SelfOwnsAll
from prospero.core.provider_env import config_warnings, validate_config
from prospero.core.relay.routing import OwnerRouting
from prospero.core.sources import discover_sources, validate_root
from prospero.core.store.base import AgentMetaStore, ConfigStore, EventStore
from prospero.core.store.sqlite.agents import MemoryAgentMetaStore, SqliteAgentMetaStore
from prospero.core.store.sqlite.events import SqliteEventStore
from prospero.types.api import Readiness, WorkspaceSummary
from prospero.types.k8s import WorkspaceAccepted, WorkspaceConfig
from prospero.types.model import (
    Agent,
    AgentMeta,
    FleetSnapshot,
    Healthy,
    RegisteredWorkspace,
    RepoProviderConfig,
    RepoProviderConfigPatch,
    Source,
    Workspace,
    WorkspaceHealth,
    caliband_facing,
)

__all__ = ["DriverFactory", "FleetConfig", "FleetManager", "default_driver_factories"]

log = logging.getLogger("prospero.core.fleet.manager")

_AgentSink = AgentSink  # its former name here (tests import it)


def agent_from_record(workspace: str, rec: ListedAgent, meta: AgentMeta | None = None) -> Agent:
    """The agent as the API shows it: the provider's record overlaid with Prospero's metadata."""
    return agent_view(workspace, rec, meta)


def default_meta_store(store: EventStore) -> AgentMetaStore:
    """Metadata beside the events when they live in a SQLite file, else in memory."""
    if isinstance(store, SqliteEventStore) and store.path and store.path != ":memory:":
        return SqliteAgentMetaStore(store.path)
    return MemoryAgentMetaStore()


class FleetManager(Polling, DriverSupervision, AgentOperations, RunEnding):
    def __init__(
        self,
        provider: FleetProvider,
        config_store: ConfigStore,
        store: EventStore,
        emitter: EmitterLike,
        metrics: Metrics,
        config: FleetConfig | None = None,
        *,
        driver_factories: dict[str, DriverFactory] | None = None,
        ownership: Ownership | None = None,
        routing: OwnerRouting | None = None,
        fenced_cursors: bool = False,
        decisions: DecisionHooks | None = None,
        agents: AgentMetaStore | None = None,
        workspace_admin: WorkspaceAdmin | None = None,
    ) -> None:
        self.provider = provider
        # Set (k8s: the Workspace CRs): the registry lives there, not in the config store.
        self.workspace_admin = workspace_admin
        self.config_store = config_store
        self.store = store
        self.emitter = emitter
        self.metrics = metrics
        self.config = config or FleetConfig()
        self.driver_factories = dict(driver_factories or {})
        self.ownership = ownership or SelfOwnsAll()
        self.routing = routing
        self.fenced_cursors = fenced_cursors
        self.decisions = decisions
        self._owns_agents = agents is None
        self.agents: AgentMetaStore = agents if agents is not None else default_meta_store(store)
        self._catchup = CatchUpGate()
        self.daily_budgets = DailyBudgets(store, emitter.flush)
        self._daily_stopped: set[str] = set()
        self._workspaces: dict[str, RegisteredWorkspace] = {}
        self._health: dict[str, WorkspaceHealth] = {}
        self._listed: dict[str, dict[str, ListedAgent]] = {}
        self._lifecycle_terms: dict[str, int] = {}  # polling.py: `_claim_lifecycle`
        self._health_terms: dict[str, int] = {}  # polling.py: `_rebase_health`
        self._slots: dict[str, AgentSlot] = {}
        self._registry_lock = asyncio.Lock()
        self._poll_locks: dict[str, asyncio.Lock] = {}
        self._poll_task: asyncio.Task[None] | None = None
        # Poll scheduling per workspace (idle backoff, `FleetConfig.poll_idle_backoff`): when
        # it last changed or saw activity, and when the poll loop looks at it next.
        self._changed_at: dict[str, float] = {}
        self._due: dict[str, float] = {}
        self._pushed: set[str] = set()  # the provider saw them change (`on_changed`)
        self._wake = asyncio.Event()  # a backed-off workspace became busy: reschedule now
        self._registry_due = 0.0  # when the poll loop re-reads the registry at the latest
        self._closing_tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._started = time.monotonic()

    # ------------------------------------------------------------------ lifecycle

    async def start(self, *, poll: bool = True) -> None:
        await self._reload_registry()
        if poll:
            # A backend with push (k8s: the CalibanTask watch) wakes the loop for a workspace
            # whose agents changed; the timer stays the fallback.
            self.provider.on_changed(self._pushed_change)
            self._poll_task = asyncio.create_task(self._poll_loop(), name="fleet-poll")

    async def stop(self) -> None:
        self._stopping = True
        if self._poll_task is not None:
            self.provider.on_changed(None)
            self._poll_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll_task
        slots = [s for s in self._slots.values() if s.driver is not None]
        await asyncio.gather(*(s.driver.close() for s in slots if s.driver), return_exceptions=True)
        tasks = [s.task for s in slots if s.task is not None]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=5.0)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self.provider.close()
        if self._owns_agents:
            with contextlib.suppress(Exception):
                await self.agents.close()

    def lease_lost(self, key: str) -> None:
        """A lease this replica held is gone (clustered: another replica took it over, or it
        expired unrenewed): stop driving that agent now. Its writes are fenced already; the
        next poll tries to take the lease again. A workspace's lifecycle lease needs nothing:
        its events are only written while it is held."""
        slot = self._slots.get(key)
        if slot is None or slot.task is None or slot.task.done() or self._stopping:
            return
        log.warning("agent %s: its lease is lost (another replica drives it now)", key)
        task = asyncio.create_task(self._drop_driver(key), name=f"lease-lost-{key}")
        self._closing_tasks.add(task)
        task.add_done_callback(self._closing_tasks.discard)

    async def _drop_driver(self, agent_id: str) -> None:
        """Close the agent's driver and forget it: if this replica takes the agent over again
        later, a new driver starts from the stored state (what the other owner wrote since),
        never the closed one."""
        slot = self._slots.get(agent_id)
        driver = slot.driver if slot is not None else None
        await self._close_driver(agent_id)
        if slot is not None and driver is not None and slot.driver is driver:
            slot.driver = None

    async def _reload_registry(self) -> None:
        async with self._registry_lock:
            if self.workspace_admin is None:
                listed = await self.config_store.list_workspaces()
            else:
                try:
                    listed = await self.workspace_admin.list_workspaces()
                except ProsperoError as e:  # the API server is away: keep what was listed
                    log.warning("workspace registry not re-read (kept as it was): %s", e)
                    return
            stored = {w.name: w for w in listed}
            for name in list(self._workspaces):
                if name not in stored:
                    self._drop_workspace_state(name)
            for name, ws in stored.items():
                self._workspaces[name] = ws
                self._health.setdefault(name, Healthy())
                self._listed.setdefault(name, {})

    # ------------------------------------------------------------------ lookups

    def _ws(self, name: str) -> RegisteredWorkspace:
        ws = self._workspaces.get(name)
        if ws is None:
            raise WorkspaceNotFound(name)
        return ws

    def _slot(self, agent_id: str) -> tuple[RegisteredWorkspace, AgentSlot]:
        slot = self._slots.get(agent_id)
        if slot is None or slot.record is None or slot.workspace not in self._workspaces:
            raise AgentNotFound(agent_id)
        return self._workspaces[slot.workspace], slot

    def get_agent(self, agent_id: str) -> Agent:
        ws, slot = self._slot(agent_id)
        assert slot.record is not None
        return agent_view(ws.name, slot.record, slot.meta)

    def knows_agent(self, agent_id: str) -> bool:
        return agent_id in self._slots

    def list_agents(self, workspace: str) -> list[Agent]:
        self._ws(workspace)
        return [
            agent_view(workspace, s.record, s.meta)
            for s in self._slots.values()
            if s.workspace == workspace and s.record is not None
        ]

    def snapshot(self) -> FleetSnapshot:
        out: list[Workspace] = []
        for name in sorted(self._workspaces):
            ws = self._workspaces[name]
            agents = sorted(self.list_agents(name), key=lambda a: a.started_at)
            out.append(
                Workspace(
                    name=name,
                    root=ws.root,
                    sources=self._sources(ws),
                    health=self._health.get(name, Healthy()),
                    config=ws.config,
                    agents=agents,
                )
            )
        return FleetSnapshot(host=self.config.host, workspaces=out)

    def _sources(self, ws: RegisteredWorkspace) -> list[Source]:
        if self.workspace_admin is not None:
            return self.workspace_admin.sources(ws.name)
        return discover_sources(ws.root)

    def agent_ids(self) -> list[str]:
        """The ids of the agents `snapshot()` lists, in its order (workspaces by name, each
        one's agents by start time), without building the views (the dashboard summary)."""
        by_ws: dict[str, list[ListedAgent]] = {name: [] for name in self._workspaces}
        for s in self._slots.values():
            recs = by_ws.get(s.workspace)
            if recs is not None and s.record is not None:
                recs.append(s.record)
        out: list[str] = []
        for name in sorted(by_ws):
            out += [r.id for r in sorted(by_ws[name], key=lambda r: r.started_at)]
        return out

    def list_workspaces(self) -> list[WorkspaceSummary]:
        return [
            WorkspaceSummary(
                name=w.name,
                root=w.root,
                sources=w.sources,
                health=w.health,
                agent_count=len(w.agents),
                config=w.config,
                warnings=self._config_warnings(w.config),
            )
            for w in self.snapshot().workspaces
        ]

    def _config_warnings(self, config: RepoProviderConfig) -> list[str]:
        """What will refuse the workspace's spawns although its config was accepted (the
        spawn's own check, `check_spawnable`, said ahead), where the keys are prosperod's."""
        if not self.config.provider_keys_here:
            return []
        return config_warnings(config, self.config.default_env, os.environ)

    def workspace_summary(self, name: str) -> WorkspaceSummary:
        """One registered workspace as `GET /api/workspaces` lists it (after a write: its
        health as the write's poll found it)."""
        self._ws(name)
        return next(w for w in self.list_workspaces() if w.name == name)

    async def readiness(self) -> Readiness:
        writable = await self.store.writable()
        healthy = sum(1 for n in self._workspaces if isinstance(self._health.get(n), Healthy))
        total = len(self._workspaces)
        return Readiness(
            ready=writable,
            store_writable=writable,
            workspaces_total=total,
            workspaces_healthy=healthy,
            workspaces_unreachable=total - healthy,
        )

    # ------------------------------------------------------------------ workspace admin

    async def add_workspace(
        self, name: str, root: str, config: RepoProviderConfig | None = None
    ) -> bool:
        """Register a workspace. Returns False when the same name+root already existed."""
        self._local_registry()
        cfg = config or RepoProviderConfig()
        validate_config(cfg)
        canon = validate_root(root)  # InvalidConfig (400) before anything is registered
        async with self._registry_lock:
            existing = {w.name: w for w in await self.config_store.list_workspaces()}
            if name in existing:
                if existing[name].root == canon:
                    return False
                raise Conflict(f"workspace '{name}' is already registered at {existing[name].root}")
            for w in existing.values():
                if w.root == canon:
                    raise Conflict(f"root {canon} is already registered as workspace '{w.name}'")
            ws = RegisteredWorkspace(name=name, root=canon, config=cfg)
            await self.config_store.upsert_workspace(ws)
            self._workspaces[name] = ws
            self._health[name] = Healthy()
            self._listed[name] = {}
        await self.poll_workspace(name)
        return True

    async def remove_workspace(self, name: str) -> None:
        self._local_registry()
        async with self._registry_lock:
            if name not in self._workspaces:
                raise WorkspaceNotFound(name)
            await self.config_store.delete_workspace(name)
            self._drop_workspace_state(name)
        await self.provider.forget(name)

    def _drop_workspace_state(self, name: str) -> None:
        self._workspaces.pop(name, None)
        self._health.pop(name, None)
        self._listed.pop(name, None)
        self._due.pop(name, None)
        self._changed_at.pop(name, None)
        for agent_id, slot in list(self._slots.items()):
            if slot.workspace == name:
                slot.record = None
                if slot.driver is not None:
                    asyncio.get_running_loop().create_task(self._close_driver(agent_id))

    async def set_workspace_config(self, name: str, config: RepoProviderConfig) -> None:
        """Replace the workspace's config wholesale (its caliband restarted)."""
        self._local_registry()
        validate_config(config)
        async with self._registry_lock:
            ws = self._ws(name)
            new = RegisteredWorkspace(name=name, root=ws.root, config=config)
            await self.config_store.upsert_workspace(new)
            self._workspaces[name] = new
        if caliband_facing(config) != caliband_facing(ws.config):
            await self.provider.restart(new)
        await self.poll_workspace(name)

    async def patch_workspace_config(self, name: str, patch: RepoProviderConfigPatch) -> bool:
        """Change only the fields `patch` gives (read, patched and stored under the registry
        lock, so two patches never lose each other's fields). Returns False when the config
        came out as it was: then nothing is stored and its caliband is not restarted."""
        self._local_registry()
        async with self._registry_lock:
            ws = self._ws(name)
            config = patch.apply(ws.config)
            validate_config(config)  # before anything is stored
            if config == ws.config:
                return False
            new = RegisteredWorkspace(name=name, root=ws.root, config=config)
            await self.config_store.upsert_workspace(new)
            self._workspaces[name] = new
        # A daily cap is Prospero's own: its caliband (and its running agents) are left alone.
        if caliband_facing(config) != caliband_facing(ws.config):
            await self.provider.restart(new)
        await self.poll_workspace(name)
        return True

    # ------------------------------------------------------------------ workspace admin (k8s)

    def _local_registry(self) -> None:
        if self.workspace_admin is not None:
            raise Unsupported(
                "this backend's workspaces are defined by its workspace admin (k8s: Workspace "
                "CRs), not registered in prosperod's store"
            )

    def _admin(self) -> WorkspaceAdmin:
        if self.workspace_admin is None:
            raise Unsupported("this backend has no asynchronous workspace admin")
        return self.workspace_admin

    async def apply_workspace(
        self, name: str, config: WorkspaceConfig, *, create: bool
    ) -> WorkspaceAccepted:
        """Create (`create`) or replace the workspace's definition; the registry follows it."""
        accepted = await self._admin().apply(name, config, create=create)
        await self._reload_registry()
        if name in self._workspaces:
            await self.poll_workspace(name)
        return accepted

    async def delete_workspace(self, name: str) -> None:
        """Delete the workspace's definition (idempotent below; WorkspaceNotFound here when
        there was none). Its agents are the backend's to end (k8s: the operator)."""
        existed = await self._admin().delete(name)
        await self._reload_registry()
        await self.provider.forget(name)
        if not existed:
            raise WorkspaceNotFound(name)

    async def workspace_summaries(self) -> list[WorkspaceSummary]:
        """`GET /api/workspaces`: the registry (local), or every definition the admin lists
        with its reconciliation status and the agents counted per workspace (k8s)."""
        if self.workspace_admin is None:
            return self.list_workspaces()
        views = await self.workspace_admin.views()
        counts: dict[str, int] = {}
        for s in self._slots.values():
            if s.record is not None:
                counts[s.workspace] = counts.get(s.workspace, 0) + 1
        return [
            WorkspaceSummary(
                name=v.name,
                root="",
                sources=[Source(name=s.name, path=s.path) for s in v.sources],
                health=self._health.get(v.name, Healthy()),
                agent_count=counts.get(v.name, 0),
                config=v.config(),
                display_name=v.display_name,
                source_specs=v.sources,
                providers=v.providers,
                default_provider=v.default_provider,
                isolation=v.isolation,
                status=v.status,
            )
            for v in views
        ]


def default_driver_factories() -> dict[str, DriverFactory]:
    """NDJSON always; ACP (spawns still gated by `FleetConfig.allow_acp`)."""
    from prospero.core.drivers.acp import AcpDriver
    from prospero.core.drivers.ndjson import NdjsonDriver

    factories: dict[str, DriverFactory] = {"ndjson": NdjsonDriver, "acp": AcpDriver}
    return factories
