"""How an agent's run ends, seen from the FleetManager (issue 9, deliverable 8).

- A driver closed after its agent turned terminal without the run's end in the stream is
  asked to `conclude` it (contract 4: agent_finished once, open tool calls closed).
- When a driver finished, the outcome goes into Prospero's metadata: the agent reads as
  finished everywhere, although caliband keeps an ACP worker `running` until kill/rm. Its
  pending decisions end with the session, and an ACP worker is released through caliband
  (the release's `killed` does not rewrite the outcome).
"""

from __future__ import annotations

import logging

from prospero.core.drivers.base import AgentDriver, concluding_outcome
from prospero.core.errors import ProsperoError
from prospero.core.fleet.meta import drive_protocol, effective_status
from prospero.core.fleet.state import AgentSlot, FleetState
from prospero.core.ownership import workspace_key
from prospero.types.events import AgentFinished, StatusChanged, now_ts, stream_key_for
from prospero.types.model import AgentMeta, RegisteredWorkspace

log = logging.getLogger(__name__)


class RunEnding(FleetState):
    async def _conclude(
        self, agent_id: str, driver: AgentDriver, ending: tuple[str, str] | None = None
    ) -> None:
        """Fallback end of a closed driver whose agent is terminal but whose run never ended
        in the stream: the driver closes open tool calls and emits agent_finished (once).
        `ending` (outcome, detail) when the caller knows why; else from the listed status."""
        slot = self._slots.get(agent_id)
        if driver.finished or slot is None or slot.record is None:
            return
        status = slot.record.status
        outcome, detail = ending or (
            concluding_outcome(status),
            f"caliband reports the agent {status.value}; the end of its run was never seen",
        )
        try:
            await driver.conclude(outcome, detail)
        except Exception as e:
            log.warning("agent %s: could not conclude its run: %s", agent_id, e)
            return
        if driver.finished:
            await self._on_finished(agent_id)

    async def _on_finished(self, agent_id: str) -> None:
        """The agent's driver finished (its agent_finished is on the stream): remember the
        outcome in Prospero's metadata, so the agent reads as finished everywhere (an ACP
        worker stays `running` in caliband), end its pending decisions with the session, and
        release an ACP worker through caliband."""
        slot = self._slots.get(agent_id)
        if slot is None or slot.record is None:
            return
        rec = slot.record
        key = stream_key_for(slot.workspace, agent_id)
        try:
            await self.emitter.flush()
            finished = await self.store.replay(key, 0, None, kinds=("agent_finished",))
        except ProsperoError as e:
            log.warning("agent %s: cannot read its outcome: %s", agent_id, e)
            return
        if not finished:
            return
        last = finished[-1].kind
        outcome = last.outcome if isinstance(last, AgentFinished) else ""
        base = slot.meta or AgentMeta(
            agent_id=agent_id,
            workspace=slot.workspace,
            drive_protocol=drive_protocol(rec, None),
            created_at=now_ts(),
        )
        meta = base.model_copy(update={"outcome": outcome})
        await self._put_meta(meta)
        slot.meta = meta
        if slot.target is not None:
            slot.target.meta = meta
        status = effective_status(rec, meta)
        if (
            slot.status is not None
            and slot.status != status
            and self.ownership.owns(workspace_key(slot.workspace))
        ):
            await self.emitter.emit(
                slot.workspace,
                agent_id,
                StatusChanged.model_validate({"from": slot.status, "to": status}),
            )
        slot.status = status
        await self._cancel_asks(agent_id, "the session ended")
        ws = self._workspaces.get(slot.workspace)
        if ws is not None:
            await self._release_worker(ws, slot)

    async def _release_worker(self, ws: RegisteredWorkspace, slot: AgentSlot) -> None:
        """An ACP agent whose session ended keeps its worker in caliband until kill/rm:
        release it (once per process; the agent keeps reading as its outcome)."""
        rec = slot.record
        if slot.released or rec is None or rec.status.terminal:
            return
        if drive_protocol(rec, slot.meta) != "acp":
            return
        slot.released = True
        try:
            await self.provider.kill(ws, rec.id)
        except ProsperoError as e:
            log.info("agent %s: could not release its ACP worker: %s", rec.id, e)

    async def _put_meta(self, meta: AgentMeta) -> None:
        try:
            await self.agents.put_meta(meta)
        except ProsperoError as e:
            log.error("agent %s: cannot store its metadata: %s", meta.agent_id, e)
