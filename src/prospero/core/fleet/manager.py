"""FleetManager: the engine between a FleetProvider and the event path.

It keeps the workspace registry, polls each workspace's agents, diffs the result into
lifecycle events, runs one AgentDriver per active agent (whose events it sequences, stores and
publishes through the Emitter), and exposes the operations the API needs. It never supervises:
spawn, kill, respawn and rm go to the provider (caliband).

Parts: `operations.py` (the agent operations), `ending.py` (how a run ends: conclude, outcome,
ACP worker release), `meta.py` (caliband's record overlaid with Prospero's AgentMeta),
`catchup.py` (first sight of an agent; catch-up of agents that ended while nobody watched),
`state.py` (the shared config, slot and seams).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from prospero.core import metrics as m
from prospero.core.aio import wait_for
from prospero.core.drivers.base import (
    AgentDriver,
    DriverExit,
    DriverTarget,
)
from prospero.core.errors import (
    AgentNotFound,
    CalibandUnreachable,
    Conflict,
    ProsperoError,
    ProtocolError,
    TransportError,
    Unsupported,
    WorkspaceNotFound,
)
from prospero.core.fleet.catchup import CatchUpGate, FirstSight, first_sight
from prospero.core.fleet.ending import RunEnding
from prospero.core.fleet.meta import agent_view, drivable, drive_protocol, effective_status
from prospero.core.fleet.operations import AgentOperations
from prospero.core.fleet.provider import FleetProvider
from prospero.core.fleet.state import (
    AgentSlot,
    CursorStoreLike,
    DecisionHooks,
    DriverFactory,
    EmitterLike,
    FleetConfig,
)
from prospero.core.metrics import Metrics
from prospero.core.ownership import Ownership, SelfOwnsAll
from prospero.core.provider_env import validate_config
from prospero.core.sources import discover_sources, validate_root
from prospero.core.store.agents_sqlite import MemoryAgentMetaStore, SqliteAgentMetaStore
from prospero.core.store.base import AgentMetaStore, ConfigStore, EventStore
from prospero.core.wire.control import AgentRecord, Endpoint
from prospero.types.api import Readiness, WorkspaceSummary
from prospero.types.events import (
    AgentDiscovered,
    AgentGone,
    CompactKind,
    EventKind,
    RepoHealth,
    StatusChanged,
    TurnLost,
    expand_kind,
    stream_key_for,
)
from prospero.types.model import (
    Agent,
    AgentMeta,
    AgentStatus,
    FleetSnapshot,
    Healthy,
    RegisteredWorkspace,
    RepoProviderConfig,
    Unreachable,
    Workspace,
    WorkspaceHealth,
)

log = logging.getLogger(__name__)

__all__ = ["DriverFactory", "FleetConfig", "FleetManager", "default_driver_factories"]


class _AgentSink:
    """A driver's EventSink for one agent; `emit_batch` is the optional batch path drivers
    use when present (one emitter call, one timestamp, for a whole read of the stream).

    `emit_batch(kinds, cursor)`: the driver's resume state after these events (`kinds` may be
    empty when only the cursor moved), committed in the same store transaction as them
    (`Emitter.emit_many`). With an emitter that has no batch path, the events are emitted one
    by one, flushed, and the cursor saved on its own afterwards (`cursor_store`)."""

    __slots__ = ("agent_id", "cursor_store", "emitter", "on_activity", "repo")

    def __init__(
        self,
        emitter: EmitterLike,
        repo: str,
        agent_id: str,
        cursor_store: CursorStoreLike | None = None,
        on_activity: Callable[[], None] | None = None,
    ) -> None:
        self.emitter = emitter
        self.repo = repo
        self.agent_id = agent_id
        self.cursor_store = cursor_store
        # Told of every event the driver hands over: the workspace is busy (poll it at the
        # configured interval, its agents' status may change any moment).
        self.on_activity = on_activity

    async def __call__(self, kind: EventKind) -> None:
        if self.on_activity is not None:
            self.on_activity()
        await self.emitter.emit(self.repo, self.agent_id, kind)

    async def flush(self) -> None:
        """Wait until what was handed over (events and cursors) is committed: the ACP
        driver commits a turn's begin before it sends that turn's prompt (at most once)."""
        await self.emitter.flush()

    async def emit_batch(self, kinds: list[CompactKind], cursor: bytes | None = None) -> None:
        if kinds and self.on_activity is not None:
            self.on_activity()
        emit_many = getattr(self.emitter, "emit_many", None)
        if emit_many is not None:
            if cursor is None:
                await emit_many(self.repo, self.agent_id, kinds)
            else:
                await emit_many(self.repo, self.agent_id, kinds, cursor)
            return
        for kind in kinds:
            await self.emitter.emit(self.repo, self.agent_id, expand_kind(kind))
        if cursor is not None and self.cursor_store is not None:
            # No transaction to share: the cursor only once its events are stored.
            await self.emitter.flush()
            await self.cursor_store.save_cursor(self.agent_id, cursor)


def agent_from_record(workspace: str, rec: AgentRecord, meta: AgentMeta | None = None) -> Agent:
    """The agent as the API shows it: caliband's record overlaid with Prospero's metadata."""
    return agent_view(workspace, rec, meta)


def default_meta_store(store: EventStore) -> AgentMetaStore:
    """Metadata beside the events when they live in a SQLite file, else in memory."""
    path = getattr(store, "path", None)
    if isinstance(path, str) and path and path != ":memory:":
        return SqliteAgentMetaStore(path)
    return MemoryAgentMetaStore()


class FleetManager(AgentOperations, RunEnding):
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
        decisions: DecisionHooks | None = None,
        agents: AgentMetaStore | None = None,
    ) -> None:
        self.provider = provider
        self.config_store = config_store
        self.store = store
        self.emitter = emitter
        self.metrics = metrics
        self.config = config or FleetConfig()
        self.driver_factories = dict(driver_factories or {})
        self.ownership = ownership or SelfOwnsAll()
        self.decisions = decisions
        self._owns_agents = agents is None
        self.agents: AgentMetaStore = agents if agents is not None else default_meta_store(store)
        self._catchup = CatchUpGate()
        self._workspaces: dict[str, RegisteredWorkspace] = {}
        self._health: dict[str, WorkspaceHealth] = {}
        self._listed: dict[str, dict[str, AgentRecord]] = {}
        self._slots: dict[str, AgentSlot] = {}
        self._registry_lock = asyncio.Lock()
        self._poll_locks: dict[str, asyncio.Lock] = {}
        self._poll_task: asyncio.Task[None] | None = None
        # Poll scheduling per workspace (idle backoff, `FleetConfig.poll_idle_backoff`): when
        # it last changed or saw activity, and when the poll loop looks at it next.
        self._changed_at: dict[str, float] = {}
        self._due: dict[str, float] = {}
        self._wake = asyncio.Event()  # a backed-off workspace became busy: reschedule now
        self._closing_tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._started = time.monotonic()

    # ------------------------------------------------------------------ lifecycle

    async def start(self, *, poll: bool = True) -> None:
        await self._reload_registry()
        if poll:
            self._poll_task = asyncio.create_task(self._poll_loop(), name="fleet-poll")

    async def stop(self) -> None:
        self._stopping = True
        if self._poll_task is not None:
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
        close = getattr(self.agents, "close", None)
        if self._owns_agents and close is not None:
            with contextlib.suppress(Exception):
                await close()

    async def _poll_loop(self) -> None:
        """Every `poll_interval`: reload the registry, poll the workspaces that are due, close
        stale drivers. A quiet workspace is due less often (`_interval`); one that becomes busy
        (`_touch`) is due again within `poll_interval`."""
        while not self._stopping:
            self._wake.clear()
            try:
                await self._poll_due()
            except asyncio.CancelledError:
                raise
            except Exception:  # a poll cycle must never kill the loop
                log.exception("poll cycle failed")
            now = time.monotonic()
            timeout = min([self.config.poll_interval, *(d - now for d in self._due.values())])
            with contextlib.suppress(TimeoutError):
                await wait_for(self._wake.wait(), max(0.0, timeout))

    async def _poll_due(self) -> None:
        await self._reload_registry()
        for name in list(self._workspaces):
            if self._stopping:
                return
            if self._due.get(name, 0.0) > time.monotonic():
                continue
            await self._poll(name)
            now = time.monotonic()
            self._due[name] = now + self._interval(name, now)
        self._close_stale_drivers()

    def _touch(self, name: str) -> None:
        """Something happened in the workspace (an agent event, an API action, a driver run
        ended): poll it at the configured interval again, starting now."""
        now = time.monotonic()
        self._changed_at[name] = now
        due = self._due.get(name)
        if due is not None and due > now + self.config.poll_interval:
            self._due[name] = now + self.config.poll_interval
            self._wake.set()

    def _interval(self, name: str, now: float) -> float:
        """The workspace's next poll interval: `poll_interval` while anything changed in the
        last `poll_quiet_after` seconds or a terminal grace is running; after that half the
        time it has been quiet, up to `poll_interval * poll_idle_backoff`."""
        base = self.config.poll_interval
        cap = base * self.config.poll_idle_backoff
        quiet = now - self._changed_at.setdefault(name, now)
        if cap <= base or quiet < self.config.poll_quiet_after or self._grace_running(name):
            return base
        return min(cap, max(base, quiet / 2))

    def _grace_running(self, name: str) -> bool:
        return any(
            s.workspace == name
            and s.terminal_since is not None
            and s.task is not None
            and not s.task.done()
            for s in self._slots.values()
        )

    async def _reload_registry(self) -> None:
        async with self._registry_lock:
            stored = {w.name: w for w in await self.config_store.list_workspaces()}
            for name in list(self._workspaces):
                if name not in stored:
                    self._drop_workspace_state(name)
            for name, ws in stored.items():
                self._workspaces[name] = ws
                self._health.setdefault(name, Healthy())
                self._listed.setdefault(name, {})

    async def poll_once(self) -> None:
        await self._reload_registry()
        for name in list(self._workspaces):
            if self._stopping:
                return
            await self.poll_workspace(name)
        self._close_stale_drivers()

    # ------------------------------------------------------------------ polling

    async def poll_workspace(self, name: str) -> None:
        """Poll the workspace now (after an API action: it is busy from now on)."""
        self._touch(name)
        await self._poll(name)

    async def _poll(self, name: str) -> None:
        ws = self._workspaces.get(name)
        if ws is None:
            return
        lock = self._poll_locks.setdefault(name, asyncio.Lock())
        async with lock:
            self.metrics.inc(m.REPOS_POLLED)
            health = self._health.get(name)
            try:
                records = await self.provider.list_agents(ws)
            except (CalibandUnreachable, TransportError, ProtocolError) as e:
                self.metrics.inc(m.POLL_FAILURES)
                await self._set_health(name, Unreachable(reason=str(e)))
                if not isinstance(health, Unreachable):
                    self._touch(name)
                return
            except ProsperoError as e:
                self.metrics.inc(m.POLL_FAILURES)
                await self._set_health(name, Unreachable(reason=str(e)))
                if not isinstance(health, Unreachable):
                    self._touch(name)
                return
            await self._set_health(name, Healthy())
            listed = self._listed.get(name)
            await self._reconcile(ws, records)
            if not isinstance(health, Healthy) or listed != self._listed.get(name):
                self._touch(name)

    async def _set_health(self, name: str, health: WorkspaceHealth) -> None:
        prev = self._health.get(name)
        self._health[name] = health
        if prev is not None and prev == health:
            return
        if prev is None and isinstance(health, Healthy):
            return
        if isinstance(prev, Unreachable) and isinstance(health, Unreachable):
            return  # still down; only transitions are events
        if self.ownership.owns(f"repo:{name}"):
            await self.emitter.emit(name, "", RepoHealth(state=health))

    async def _reconcile(self, ws: RegisteredWorkspace, records: list[AgentRecord]) -> None:
        prev = self._listed.get(ws.name, {})
        current = {r.id: r for r in records}
        self._listed[ws.name] = current
        # Seed the seq counters of every new agent's stream up front, all at once: emitting
        # to a new stream otherwise waits for one store round trip per agent, in series (and
        # each agent's driver only starts after its turn). The same goes for what the store
        # knows of them (metadata, history).
        prepare = getattr(self.emitter, "prepare", None)
        new_ids = [r.id for r in records if r.id not in self._slots]
        if new_ids and prepare is not None:
            await prepare([stream_key_for(ws.name, agent_id) for agent_id in new_ids])
        sights = await first_sight(self.store, self.agents, ws.name, new_ids) if new_ids else {}
        for rec in records:
            slot = self._slots.get(rec.id)
            sight = sights.get(rec.id)
            if slot is None:
                slot = self._slots[rec.id] = AgentSlot(workspace=ws.name)
                slot.meta = sight.meta if sight is not None else None
                if sight is None or not sight.seen_before:
                    await self.emitter.emit(ws.name, rec.id, AgentDiscovered())
            await self._apply_record(ws, slot, rec, prev.get(rec.id), sight)
        for gone_id in set(prev) - set(current):
            slot = self._slots.get(gone_id)
            if slot is not None and slot.record is not None and slot.workspace == ws.name:
                slot.record = None
                await self.emitter.emit(ws.name, gone_id, AgentGone())
                await self._cancel_asks(gone_id, "the agent is gone")
                await self._close_driver(gone_id)

    async def _apply_record(
        self,
        ws: RegisteredWorkspace,
        slot: AgentSlot,
        rec: AgentRecord,
        before: AgentRecord | None,
        sight: FirstSight | None,
    ) -> None:
        """One listed record: status diff (as the agent reads), driver start, terminal
        bookkeeping. `sight` is set the first time this process sees the agent."""
        old_status = slot.status
        if old_status is None:
            old = before or slot.record
            old_status = effective_status(old, slot.meta) if old is not None else None
        slot.record = rec
        slot.workspace = ws.name
        if slot.target is not None:
            # The provisional record at spawn has no session dir: drivers read it at use.
            slot.target.session_dir = slot.target.session_dir or rec.session_dir
            slot.target.working_dir = slot.target.working_dir or rec.working_dir
        status = effective_status(rec, slot.meta)
        slot.status = status
        if old_status is not None and old_status != status:
            await self.emitter.emit(
                ws.name, rec.id, StatusChanged.model_validate({"from": old_status, "to": status})
            )
            if slot.driver is not None and slot.task is not None and not slot.task.done():
                # A driver waiting out a reconnect backoff looks again now: the worker may
                # be listening, or gone with its transcript complete (before the terminal
                # grace below closes the driver).
                slot.driver.nudge()
        elif before is not None and before.status != rec.status:
            if slot.driver is not None and slot.task is not None and not slot.task.done():
                slot.driver.nudge()
        if status.terminal:
            if slot.terminal_since is None:
                slot.terminal_since = time.monotonic()
                await self._cancel_asks(rec.id, f"the agent is {status.value}")
                driver = slot.driver
                if (
                    driver is not None
                    and not driver.finished
                    and (slot.task is None or slot.task.done())
                    and drivable(rec, slot.meta)
                ):
                    # Its driver gave up (refused dials) before the run ended: one more run
                    # now recovers the tail from the transcript, or concludes the run.
                    slot.catchup = True
                    self._ensure_driver(ws, rec)
            if sight is not None and not sight.finished and drivable(rec, slot.meta):
                # Ended while no prosperod watched: one run recovers (or concludes) it.
                slot.catchup = True
                self._ensure_driver(ws, rec)
            if slot.meta is not None and slot.meta.outcome is not None:
                await self._release_worker(ws, slot)
        else:
            slot.terminal_since = None
            if drivable(rec, slot.meta):
                self._ensure_driver(ws, rec)

    def _close_stale_drivers(self) -> None:
        """Close drivers of agents that turned terminal a while ago and never finished
        (killed or crashed workers: their stream will not come back)."""
        now = time.monotonic()
        for agent_id, slot in self._slots.items():
            if slot.terminal_since is None or slot.task is None or slot.task.done():
                continue
            if slot.catchup:
                since, grace = slot.catchup_started, self.config.catchup_grace
            else:
                since, grace = slot.terminal_since, self.config.terminal_grace
            if since is not None and now - since >= grace:
                task = asyncio.create_task(self._close_driver(agent_id, conclude=True))
                self._closing_tasks.add(task)
                task.add_done_callback(self._closing_tasks.discard)

    # ------------------------------------------------------------------ drivers

    def _make_driver(self, ws: RegisteredWorkspace, rec: AgentRecord) -> AgentDriver:
        slot = self._slots.setdefault(rec.id, AgentSlot(workspace=ws.name, record=rec))
        protocol = drive_protocol(rec, slot.meta)
        factory = self.driver_factories.get(protocol)
        if factory is None:
            raise Unsupported(f"no driver for drive protocol '{protocol}'")
        agent_id = rec.id

        def status() -> AgentStatus | None:
            current = self._slots.get(agent_id)
            return current.record.status if current is not None and current.record else None

        async def resolve() -> Endpoint:
            return await self.provider.attach(ws, agent_id)

        workspace = ws.name
        sink = _AgentSink(
            self.emitter, ws.name, agent_id, self.store, on_activity=lambda: self._touch(workspace)
        )

        target = DriverTarget(
            agent_id=agent_id,
            workspace=ws.name,
            resolve_endpoint=resolve,
            security=self.provider.security(ws),
            interactive=rec.spec.interactive,
            spec=rec.spec,
            working_dir=rec.working_dir,
            session_dir=rec.session_dir,
            meta=slot.meta,
            status=status,
        )
        slot.target = target
        cursor_store: CursorStoreLike | None = self.store  # EventStore carries cursors
        return factory(target, sink, self.config.driver_options(), self.metrics, cursor_store)

    def _ensure_driver(self, ws: RegisteredWorkspace, rec: AgentRecord) -> None:
        if self._stopping:
            return
        slot = self._slots.setdefault(rec.id, AgentSlot(workspace=ws.name, record=rec))
        if slot.task is not None and not slot.task.done():
            return
        if slot.driver is not None and slot.driver.finished:
            return
        if slot.driver is None:
            try:
                slot.driver = self._make_driver(ws, rec)
            except ProsperoError as e:
                log.warning("cannot drive agent %s: %s", rec.id, e)
                return
        driver = slot.driver
        self.metrics.add_gauge(m.ACTIVE_ATTACHES, 1)
        run = self._run_catchup if slot.catchup else self._run_driver
        slot.task = asyncio.create_task(run(rec.id, driver), name=f"driver-{rec.id}")
        # A run that ends (finished, gave up, closed) changes what the next poll does.
        workspace = ws.name

        def ended(_task: asyncio.Task[DriverExit]) -> None:
            self._touch(workspace)

        slot.task.add_done_callback(ended)

    async def _run_catchup(self, agent_id: str, driver: AgentDriver) -> DriverExit:
        """A catch-up run waits for its turn (bounded concurrency); its grace starts then."""
        async with self._catchup:
            slot = self._slots.get(agent_id)
            if slot is not None:
                slot.catchup_started = time.monotonic()
            return await self._run_driver(agent_id, driver)

    async def _run_driver(self, agent_id: str, driver: AgentDriver) -> DriverExit:
        lease = await self.ownership.try_acquire(agent_id)
        if lease is None:
            self.metrics.add_gauge(m.ACTIVE_ATTACHES, -1)
            return DriverExit.closed
        try:
            exit_ = await driver.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("driver for %s crashed", agent_id)
            await self._record_lost_turn(agent_id, driver, "the driver crashed mid-turn")
            return DriverExit.gave_up
        finally:
            self.metrics.add_gauge(m.ACTIVE_ATTACHES, -1)
        if exit_ is DriverExit.finished:
            await self._on_finished(agent_id)
        return exit_

    async def _record_lost_turn(self, agent_id: str, driver: AgentDriver, reason: str) -> None:
        """A driver that died with a turn in flight (ACP: `turn_in_flight`) cannot record the
        loss itself: put the explicit `turn_lost` on the agent's stream for it."""
        turn = getattr(driver, "turn_in_flight", None)
        slot = self._slots.get(agent_id)
        if not isinstance(turn, int) or slot is None:
            return
        with contextlib.suppress(Exception):
            await self.emitter.emit(slot.workspace, agent_id, TurnLost(turn=turn, reason=reason))

    async def _cancel_asks(self, agent_id: str, reason: str) -> None:
        """Resolve the agent's pending permission decisions as cancelled (best effort)."""
        if self.decisions is None:
            return
        try:
            n = await self.decisions.cancel_agent(agent_id, reason)
        except Exception as e:
            log.warning("agent %s: cannot cancel its pending decisions: %s", agent_id, e)
            return
        if n:
            log.info("agent %s: %d pending decision(s) cancelled: %s", agent_id, n, reason)

    async def _close_driver(self, agent_id: str, *, conclude: bool = False) -> None:
        """Close the agent's driver. With `conclude` (a terminal agent whose run never ended
        in the stream), the driver records the end itself once closed (contract 4:
        `conclude` is a no-op for a driver that already finished)."""
        slot = self._slots.get(agent_id)
        if slot is None or slot.driver is None:
            return
        driver = slot.driver
        await driver.close()
        if slot.task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await wait_for(asyncio.shield(slot.task), 5.0)
        if conclude:
            await self._conclude(agent_id, driver)
        await self.ownership.release(agent_id)

    async def wait_driver(self, agent_id: str, timeout: float | None = None) -> DriverExit | None:
        """Test/ops helper: wait for the agent's current driver run to end."""
        slot = self._slots.get(agent_id)
        if slot is None or slot.task is None:
            return None
        return await wait_for(asyncio.shield(slot.task), timeout)

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
                    sources=discover_sources(ws.root),
                    health=self._health.get(name, Healthy()),
                    config=ws.config,
                    agents=agents,
                )
            )
        return FleetSnapshot(host=self.config.host, workspaces=out)

    def agent_ids(self) -> list[str]:
        """The ids of the agents `snapshot()` lists, in its order (workspaces by name, each
        one's agents by start time), without building the views (the dashboard summary)."""
        by_ws: dict[str, list[AgentRecord]] = {name: [] for name in self._workspaces}
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
            )
            for w in self.snapshot().workspaces
        ]

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
        cfg = config or RepoProviderConfig()
        validate_config(cfg)
        canon = validate_root(root)  # InvalidConfig (400) before anything is registered
        async with self._registry_lock:
            existing = {w.name: w for w in await self.config_store.list_workspaces()}
            if name in existing:
                if existing[name].root == canon:
                    return False
                raise Conflict(
                    f"workspace '{name}' is already registered at {existing[name].root}"
                )
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
        validate_config(config)
        async with self._registry_lock:
            ws = self._ws(name)
            new = RegisteredWorkspace(name=name, root=ws.root, config=config)
            await self.config_store.upsert_workspace(new)
            self._workspaces[name] = new
        await self.provider.restart(new)
        await self.poll_workspace(name)


def default_driver_factories() -> dict[str, DriverFactory]:
    """NDJSON always; ACP (spawns still gated by `FleetConfig.allow_acp`)."""
    from prospero.core.drivers.acp import AcpDriver
    from prospero.core.drivers.ndjson import NdjsonDriver

    factories: dict[str, DriverFactory] = {"ndjson": NdjsonDriver, "acp": AcpDriver}
    return factories
