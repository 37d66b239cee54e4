"""The FleetManager's driver supervision: one AgentDriver per driven agent, built from the
drive protocol's factory, run under an ownership lease (catch-up runs with bounded
concurrency), closed (and asked to conclude a run that never ended) when the agent turns
terminal or goes away."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from prospero.core import metrics as m
from prospero.core.aio import wait_for
from prospero.core.budgets import BUDGET_KINDS, BudgetGuard
from prospero.core.drivers.base import AgentDriver, DriverExit, DriverTarget
from prospero.core.emitter import Emitter
from prospero.core.errors import ProsperoError, Unsupported
from prospero.core.fleet.cursors import EmitterCursors
from prospero.core.fleet.meta import drive_protocol
from prospero.core.fleet.records import ListedAgent
from prospero.core.fleet.sink import AgentSink
from prospero.core.fleet.state import AgentSlot, CursorStoreLike, FleetState
from prospero.core.transport import Address
from prospero.types.events import FleetEvent, TurnLost, stream_key_for
from prospero.types.model import AgentStatus, RegisteredWorkspace

log = logging.getLogger("prospero.core.fleet.manager")  # as before the split


class DriverSupervision(FleetState):
    def _make_driver(self, ws: RegisteredWorkspace, rec: ListedAgent) -> AgentDriver:
        slot = self._slots.setdefault(rec.id, AgentSlot(workspace=ws.name, record=rec))
        protocol = drive_protocol(rec, slot.meta)
        factory = self.driver_factories.get(protocol)
        if factory is None:
            raise Unsupported(f"no driver for drive protocol '{protocol}'")
        agent_id = rec.id

        def status() -> AgentStatus | None:
            current = self._slots.get(agent_id)
            return current.record.status if current is not None and current.record else None

        async def resolve() -> Address:
            return await self.provider.attach(ws, agent_id)

        workspace = ws.name

        async def budget_history() -> list[FleetEvent]:
            await self.emitter.flush()
            key = stream_key_for(workspace, agent_id)
            return await self.store.replay(key, 0, None, kinds=BUDGET_KINDS)

        def exceeded(detail: str) -> None:
            self._spawn_stop(agent_id, detail)

        sink = AgentSink(
            self.emitter,
            ws.name,
            agent_id,
            on_activity=lambda: self._touch(workspace),
            budget=BudgetGuard.for_meta(slot.meta, budget_history, exceeded),
            after_turn=lambda: self._after_turn(workspace, agent_id),
        )

        target = DriverTarget(
            agent_id=agent_id,
            workspace=ws.name,
            resolve_endpoint=resolve,
            security=self.provider.security(ws),
            interactive=rec.spec.interactive,
            prompt=rec.spec.prompt,
            model=rec.spec.model,
            frontmatter_path=rec.spec.frontmatter_path,
            working_dir=rec.working_dir,
            session_dir=rec.session_dir,
            meta=slot.meta,
            status=status,
        )
        slot.target = target
        cursor_store: CursorStoreLike | None = self.store  # EventStore carries cursors
        if self.fenced_cursors and isinstance(self.emitter, Emitter):
            cursor_store = EmitterCursors(self.emitter, self.store, ws.name)  # fenced, in order
        return factory(target, sink, self.config.driver_options(), self.metrics, cursor_store)

    async def _after_turn(self, workspace: str, agent_id: str) -> None:
        """A turn of `agent_id` ended: check its workspace's daily cap (core/budgets_daily.py).
        Over it, every agent of the workspace this replica drives gets `budget_exceeded` and
        is stopped (each once)."""
        ws = self._workspaces.get(workspace)
        if ws is None:
            return
        verdict = await self.daily_budgets.check(workspace, ws.config)
        if verdict is None:
            return
        for warning in verdict.warnings:
            await self.emitter.emit(workspace, agent_id, warning)
        if verdict.exceeded is None:
            return
        for other, slot in list(self._slots.items()):
            if slot.workspace != workspace or other in self._daily_stopped:
                continue
            if slot.driver is None or slot.driver.finished:
                continue
            self._daily_stopped.add(other)
            await self.emitter.emit(workspace, other, verdict.exceeded)
            self._spawn_stop(other, verdict.detail)

    def _spawn_stop(self, agent_id: str, detail: str) -> None:
        """Stop an agent that crossed its budget, off the driver's own task (the stop closes
        that driver and waits for it)."""
        if self._stopping:
            return
        task = asyncio.create_task(
            self._stop_for_budget(agent_id, detail), name=f"budget-{agent_id}"
        )
        self._closing_tasks.add(task)
        task.add_done_callback(self._closing_tasks.discard)

    def _ensure_driver(self, ws: RegisteredWorkspace, rec: ListedAgent) -> None:
        if self._stopping:
            return
        slot = self._slots.get(rec.id)
        if slot is None:
            slot = self._slots[rec.id] = AgentSlot(workspace=ws.name, record=rec)
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
        slot = self._slots.get(agent_id)
        if slot is not None:
            slot.lease_refused = lease is None
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
        turn = driver.turn_in_flight
        slot = self._slots.get(agent_id)
        if turn is None or slot is None:
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

    async def _close_driver(
        self,
        agent_id: str,
        *,
        conclude: bool = False,
        ending: tuple[str, str] | None = None,
        release: bool = True,
    ) -> None:
        """Close the agent's driver. With `conclude` (a terminal agent whose run never ended
        in the stream), the driver records the end itself once closed (contract 4:
        `conclude` is a no-op for a driver that already finished), as `ending` (outcome,
        detail) when given. `release=False` keeps the agent's lease (the caller still acts
        on the agent as its owner)."""
        slot = self._slots.get(agent_id)
        if slot is None or slot.driver is None:
            return
        driver = slot.driver
        await driver.close()
        if slot.task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await wait_for(asyncio.shield(slot.task), 5.0)
        if conclude:
            await self._conclude(agent_id, driver, ending)
        if release:
            await self.ownership.release(agent_id)

    async def wait_driver(self, agent_id: str, timeout: float | None = None) -> DriverExit | None:
        """Test/ops helper: wait for the agent's current driver run to end."""
        slot = self._slots.get(agent_id)
        if slot is None or slot.task is None:
            return None
        return await wait_for(asyncio.shield(slot.task), timeout)
