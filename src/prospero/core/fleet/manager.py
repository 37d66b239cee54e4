"""FleetManager: the engine between a FleetProvider and the event path.

It keeps the workspace registry, polls each workspace's agents, diffs the result into
lifecycle events, runs one AgentDriver per active agent (whose events it sequences, stores and
publishes through the Emitter), and exposes the operations the API needs. It never supervises:
spawn, kill, respawn and rm go to the provider (caliband).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Protocol

from prospero.core import metrics as m
from prospero.core.aio import wait_for
from prospero.core.drivers.base import (
    AgentDriver,
    DriverExit,
    DriverOptions,
    DriverTarget,
    EventSink,
)
from prospero.core.errors import (
    AgentNotFound,
    CalibandUnreachable,
    Conflict,
    InvalidState,
    ProsperoError,
    ProtocolError,
    TransportError,
    Unsupported,
    WorkspaceNotFound,
)
from prospero.core.fleet.provider import FleetProvider
from prospero.core.metrics import Metrics
from prospero.core.ownership import Ownership, SelfOwnsAll
from prospero.core.provider_env import check_spawnable, validate_config
from prospero.core.ratecard import RateCard
from prospero.core.sources import canonical_root, discover_sources
from prospero.core.store.base import ConfigStore, EventStore
from prospero.core.wire.control import AgentRecord, Endpoint, SpawnSpec
from prospero.types.api import Readiness, SpawnedResponse, SpawnRequest, WorkspaceSummary
from prospero.types.events import (
    AgentDiscovered,
    AgentGone,
    AgentSpawned,
    CompactKind,
    EventKind,
    FleetEvent,
    RepoHealth,
    StatusChanged,
    TurnLost,
    expand_kind,
    now_ts,
    stream_key_for,
)
from prospero.types.model import (
    Agent,
    AgentStatus,
    FleetSnapshot,
    Healthy,
    Posture,
    RegisteredWorkspace,
    RepoProviderConfig,
    Unreachable,
    Workspace,
    WorkspaceHealth,
)

log = logging.getLogger(__name__)


class EmitterLike(Protocol):
    async def emit(self, repo: str, agent_id: str, kind: EventKind) -> FleetEvent: ...

    async def flush(self) -> None:
        """Wait until everything emitted so far is committed (or given up on)."""
        ...


class CursorStoreLike(Protocol):
    async def save_cursor(self, key: str, data: bytes) -> None: ...

    async def load_cursor(self, key: str) -> bytes | None: ...


class DecisionHooks(Protocol):
    """The pending-decision surface (prospero.core.decisions.DecisionService): the manager
    resolves an agent's pending permission asks when it kills, cancels, removes or sees the
    agent end, and stamps a workspace's default posture on spawns that choose none."""

    async def cancel_agent(self, agent_id: str, reason: str) -> int: ...

    async def default_posture(self, workspace: str) -> Posture | None: ...


class DriverFactory(Protocol):
    def __call__(
        self,
        target: DriverTarget,
        sink: EventSink,
        options: DriverOptions,
        metrics: Metrics,
        cursor_store: CursorStoreLike | None,
    ) -> AgentDriver: ...


@dataclass
class FleetConfig:
    host: str = "local"
    poll_interval: float = 2.0
    include_thinking: bool = True
    rate_card: RateCard = field(default_factory=RateCard)
    backoff_base: float = 0.2
    backoff_cap: float = 10.0
    max_failures: int = 8
    allow_acp: bool = False
    default_env: dict[str, str] = field(default_factory=dict)
    # How long a driver may keep reading after the agent turned terminal, to collect the
    # stream's last lines, before it is closed.
    terminal_grace: float = 3.0

    def driver_options(self) -> DriverOptions:
        return DriverOptions(
            include_thinking=self.include_thinking,
            rate_card=self.rate_card,
            backoff_base=self.backoff_base,
            backoff_cap=self.backoff_cap,
            max_failures=self.max_failures,
        )


@dataclass
class _AgentSlot:
    """What the manager tracks per agent it has ever seen in this process."""

    workspace: str
    record: AgentRecord | None = None
    driver: AgentDriver | None = None
    task: asyncio.Task[DriverExit] | None = None
    terminal_since: float | None = None


class _AgentSink:
    """A driver's EventSink for one agent; `emit_batch` is the optional batch path drivers
    use when present (one emitter call, one timestamp, for a whole read of the stream)."""

    __slots__ = ("agent_id", "emitter", "repo")

    def __init__(self, emitter: EmitterLike, repo: str, agent_id: str) -> None:
        self.emitter = emitter
        self.repo = repo
        self.agent_id = agent_id

    async def __call__(self, kind: EventKind) -> None:
        await self.emitter.emit(self.repo, self.agent_id, kind)

    async def emit_batch(self, kinds: list[CompactKind]) -> None:
        emit_many = getattr(self.emitter, "emit_many", None)
        if emit_many is not None:
            await emit_many(self.repo, self.agent_id, kinds)
            return
        for kind in kinds:
            await self.emitter.emit(self.repo, self.agent_id, expand_kind(kind))


def agent_from_record(workspace: str, rec: AgentRecord) -> Agent:
    return Agent(
        id=rec.id,
        name=rec.name,
        workspace=workspace,
        status=rec.status,
        started_at=rec.started_at,
        isolated=rec.spec.isolation_worktree,
        interactive=rec.spec.interactive,
        session_dir=rec.session_dir,
        drive_protocol=rec.spec.drive_protocol,
        posture=rec.spec.permission_posture,
        model=rec.spec.model,
        label=rec.spec.label,
    )


class FleetManager:
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
        self._workspaces: dict[str, RegisteredWorkspace] = {}
        self._health: dict[str, WorkspaceHealth] = {}
        self._listed: dict[str, dict[str, AgentRecord]] = {}
        self._slots: dict[str, _AgentSlot] = {}
        self._registry_lock = asyncio.Lock()
        self._poll_locks: dict[str, asyncio.Lock] = {}
        self._poll_task: asyncio.Task[None] | None = None
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

    async def _poll_loop(self) -> None:
        while not self._stopping:
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a poll cycle must never kill the loop
                log.exception("poll cycle failed")
            await asyncio.sleep(self.config.poll_interval)

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
        ws = self._workspaces.get(name)
        if ws is None:
            return
        lock = self._poll_locks.setdefault(name, asyncio.Lock())
        async with lock:
            self.metrics.inc(m.REPOS_POLLED)
            try:
                records = await self.provider.list_agents(ws)
            except (CalibandUnreachable, TransportError, ProtocolError) as e:
                self.metrics.inc(m.POLL_FAILURES)
                await self._set_health(name, Unreachable(reason=str(e)))
                return
            except ProsperoError as e:
                self.metrics.inc(m.POLL_FAILURES)
                await self._set_health(name, Unreachable(reason=str(e)))
                return
            await self._set_health(name, Healthy())
            await self._reconcile(ws, records)

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
        # each agent's driver only starts after its turn).
        prepare = getattr(self.emitter, "prepare", None)
        new_ids = [r.id for r in records if r.id not in self._slots]
        if new_ids and prepare is not None:
            await prepare([stream_key_for(ws.name, agent_id) for agent_id in new_ids])
        for rec in records:
            slot = self._slots.get(rec.id)
            before = prev.get(rec.id)
            if slot is None:
                slot = self._slots[rec.id] = _AgentSlot(workspace=ws.name)
                await self.emitter.emit(ws.name, rec.id, AgentDiscovered())
            old_status = before.status if before is not None else (
                slot.record.status if slot.record is not None else None
            )
            slot.record = rec
            slot.workspace = ws.name
            if old_status is not None and old_status != rec.status:
                await self.emitter.emit(
                    ws.name, rec.id, StatusChanged.model_validate({"from": old_status, "to": rec.status})
                )
                if slot.driver is not None and slot.task is not None and not slot.task.done():
                    # A driver waiting out a reconnect backoff looks again now: the worker may
                    # be listening, or gone with its transcript complete (before the terminal
                    # grace below closes the driver).
                    slot.driver.nudge()
            if rec.status.terminal:
                if slot.terminal_since is None:
                    slot.terminal_since = time.monotonic()
                    await self._cancel_asks(rec.id, f"the agent is {rec.status.value}")
            else:
                slot.terminal_since = None
                self._ensure_driver(ws, rec)
        for gone_id in set(prev) - set(current):
            slot = self._slots.get(gone_id)
            if slot is not None and slot.record is not None and slot.workspace == ws.name:
                slot.record = None
                await self.emitter.emit(ws.name, gone_id, AgentGone())
                await self._cancel_asks(gone_id, "the agent is gone")
                await self._close_driver(gone_id)

    def _close_stale_drivers(self) -> None:
        """Close drivers of agents that turned terminal a while ago and never finished
        (killed or crashed workers: their stream will not come back)."""
        now = time.monotonic()
        for agent_id, slot in self._slots.items():
            if (
                slot.terminal_since is not None
                and now - slot.terminal_since >= self.config.terminal_grace
                and slot.task is not None
                and not slot.task.done()
            ):
                task = asyncio.create_task(self._close_driver(agent_id))
                self._closing_tasks.add(task)
                task.add_done_callback(self._closing_tasks.discard)

    # ------------------------------------------------------------------ drivers

    def _make_driver(self, ws: RegisteredWorkspace, rec: AgentRecord) -> AgentDriver:
        protocol = rec.spec.drive_protocol
        factory = self.driver_factories.get(protocol)
        if factory is None:
            raise Unsupported(f"no driver for drive protocol '{protocol}'")
        agent_id = rec.id

        async def resolve() -> Endpoint:
            return await self.provider.attach(ws, agent_id)

        sink = _AgentSink(self.emitter, ws.name, agent_id)

        target = DriverTarget(
            agent_id=agent_id,
            workspace=ws.name,
            resolve_endpoint=resolve,
            security=self.provider.security(ws),
            interactive=rec.spec.interactive,
            spec=rec.spec,
            working_dir=rec.working_dir,
            session_dir=rec.session_dir,
        )
        cursor_store: CursorStoreLike | None = self.store  # EventStore carries cursors
        return factory(target, sink, self.config.driver_options(), self.metrics, cursor_store)

    def _ensure_driver(self, ws: RegisteredWorkspace, rec: AgentRecord) -> None:
        if self._stopping:
            return
        slot = self._slots.setdefault(rec.id, _AgentSlot(workspace=ws.name, record=rec))
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
        task = asyncio.create_task(self._run_driver(rec.id, driver), name=f"driver-{rec.id}")
        slot.task = task

    async def _run_driver(self, agent_id: str, driver: AgentDriver) -> DriverExit:
        lease = await self.ownership.try_acquire(agent_id)
        if lease is None:
            self.metrics.add_gauge(m.ACTIVE_ATTACHES, -1)
            return DriverExit.closed
        try:
            return await driver.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("driver for %s crashed", agent_id)
            await self._record_lost_turn(agent_id, driver, "the driver crashed mid-turn")
            return DriverExit.gave_up
        finally:
            self.metrics.add_gauge(m.ACTIVE_ATTACHES, -1)

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

    async def _close_driver(self, agent_id: str) -> None:
        slot = self._slots.get(agent_id)
        if slot is None or slot.driver is None:
            return
        await slot.driver.close()
        if slot.task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await wait_for(asyncio.shield(slot.task), 5.0)
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

    def _slot(self, agent_id: str) -> tuple[RegisteredWorkspace, _AgentSlot]:
        slot = self._slots.get(agent_id)
        if slot is None or slot.record is None or slot.workspace not in self._workspaces:
            raise AgentNotFound(agent_id)
        return self._workspaces[slot.workspace], slot

    def get_agent(self, agent_id: str) -> Agent:
        ws, slot = self._slot(agent_id)
        assert slot.record is not None
        return agent_from_record(ws.name, slot.record)

    def knows_agent(self, agent_id: str) -> bool:
        return agent_id in self._slots

    def list_agents(self, workspace: str) -> list[Agent]:
        self._ws(workspace)
        return [
            agent_from_record(workspace, s.record)
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
        canon = canonical_root(root)
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

    # ------------------------------------------------------------------ agent operations

    async def spawn(self, workspace: str, req: SpawnRequest) -> SpawnedResponse:
        ws = self._ws(workspace)
        if req.drive_protocol != "ndjson":
            if not self.config.allow_acp:
                raise Conflict(
                    f"drive protocol '{req.drive_protocol}' is disabled on this daemon "
                    "(start prosperod with --allow-acp or PROSPERO_ALLOW_ACP=1)"
                )
            if req.drive_protocol not in self.driver_factories:
                raise Conflict(f"this build has no '{req.drive_protocol}' driver")
        check_spawnable(ws.config, self.config.default_env, os.environ)
        posture = req.posture
        if posture is None and self.decisions is not None:
            posture = await self.decisions.default_posture(ws.name)
        spec = SpawnSpec(
            label=req.label,
            frontmatter_path=req.frontmatter_path,
            initial_prompt=req.prompt,
            model=req.model,
            provider=ws.config.provider,
            tool_allowlist=req.tool_allowlist,
            isolation_worktree=req.isolated,
            inherit_hooks=True,
            interactive=req.interactive,
            drive_protocol=req.drive_protocol,
            permission_posture=posture,
        )
        reply = await self.provider.spawn(ws, spec)
        slot = self._slots.setdefault(reply.id, _AgentSlot(workspace=ws.name))
        slot.workspace = ws.name
        if slot.record is None:
            # Provisional record until the next poll (so kill/rm right after spawn work).
            slot.record = AgentRecord(
                id=reply.id,
                name=req.label or f"agent-{reply.id}",
                status=AgentStatus.spawning,
                started_at=now_ts(),
                endpoint=reply.endpoint,
                spec=spec,
            )
        await self.emitter.emit(ws.name, reply.id, AgentSpawned())
        if spec.drive_protocol == "ndjson":
            # NDJSON attaches at once (the worker runs by itself). An ACP agent does nothing
            # until its driver prompts it: the poll below starts that driver from caliband's
            # full record (the session's cwd is the record's working_dir).
            self._ensure_driver(ws, slot.record)
        await self.poll_workspace(ws.name)
        return SpawnedResponse(
            agent_id=reply.id,
            workspace=ws.name,
            isolated=req.isolated,
            created=True,
            drive_protocol=req.drive_protocol,
        )

    async def kill(self, agent_id: str) -> None:
        ws, slot = self._slot(agent_id)
        await self._cancel_asks(agent_id, "the agent was killed")
        if slot.driver is not None and slot.record is not None:
            if slot.record.spec.drive_protocol != "ndjson":
                with contextlib.suppress(ProsperoError):
                    await slot.driver.cancel_turn()
        await self.provider.kill(ws, agent_id)
        await self.poll_workspace(ws.name)

    async def respawn(self, agent_id: str) -> str:
        ws, _slot = self._slot(agent_id)
        new_id = await self.provider.respawn(ws, agent_id)
        new_slot = self._slots.setdefault(new_id, _AgentSlot(workspace=ws.name))
        new_slot.workspace = ws.name
        await self.emitter.emit(ws.name, new_id, AgentSpawned())
        await self.poll_workspace(ws.name)
        return new_id

    async def remove(self, agent_id: str, force: bool = False) -> None:
        ws, slot = self._slot(agent_id)
        await self.provider.remove(ws, agent_id, force)
        await self._cancel_asks(agent_id, "the agent was removed")
        slot.record = None
        self._listed.get(ws.name, {}).pop(agent_id, None)
        await self.emitter.emit(ws.name, agent_id, AgentGone())
        await self._close_driver(agent_id)
        # The registry has forgotten the agent: from now on only its stored history answers
        # for it, so that history is committed before the caller hears "removed".
        await self.emitter.flush()

    def _steerable(self, op: str, agent_id: str) -> tuple[RegisteredWorkspace, _AgentSlot]:
        ws, slot = self._slot(agent_id)
        rec = slot.record
        assert rec is not None
        if rec.status.terminal:
            raise InvalidState(op, agent_id, rec.status.value, "the agent has finished")
        if rec.spec.drive_protocol == "ndjson" and not rec.spec.interactive:
            raise InvalidState(op, agent_id, rec.status.value, "the agent is not interactive")
        return ws, slot

    def _driver_for(self, ws: RegisteredWorkspace, slot: _AgentSlot) -> AgentDriver:
        assert slot.record is not None
        if slot.driver is None:
            slot.driver = self._make_driver(ws, slot.record)
        return slot.driver

    async def send_input(self, agent_id: str, text: str) -> None:
        ws, slot = self._steerable("send input to", agent_id)
        await self._driver_for(ws, slot).send_input(text)

    async def end_input(self, agent_id: str) -> None:
        ws, slot = self._steerable("end input of", agent_id)
        await self._driver_for(ws, slot).end_input()

    async def cancel_turn(self, agent_id: str) -> None:
        ws, slot = self._slot(agent_id)
        assert slot.record is not None
        if slot.record.status.terminal:
            raise InvalidState("cancel the turn of", agent_id, slot.record.status.value)
        await self._cancel_asks(agent_id, "the turn was cancelled")
        try:
            await self._driver_for(ws, slot).cancel_turn()
        except Unsupported as e:
            raise InvalidState("cancel the turn of", agent_id, slot.record.status.value, str(e)) from e

    async def drain(self, agent_id: str, timeout: float = 30.0) -> None:
        """End input (best effort), wait for a terminal status or removal, then kill."""
        ws, slot = self._slot(agent_id)
        with contextlib.suppress(ProsperoError):
            await self._driver_for(ws, slot).end_input()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            await self.poll_workspace(ws.name)
            rec = self._slots[agent_id].record
            if rec is None or rec.status.terminal:
                return
            await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))
        with contextlib.suppress(AgentNotFound):
            await self.provider.kill(ws, agent_id)
        await self.poll_workspace(ws.name)

    def driver_factory_names(self) -> list[str]:
        return sorted(self.driver_factories)


def default_driver_factories() -> dict[str, DriverFactory]:
    """NDJSON always; ACP (spawns still gated by `FleetConfig.allow_acp`)."""
    from prospero.core.drivers.acp import AcpDriver
    from prospero.core.drivers.ndjson import NdjsonDriver

    factories: dict[str, DriverFactory] = {"ndjson": NdjsonDriver, "acp": AcpDriver}
    return factories


