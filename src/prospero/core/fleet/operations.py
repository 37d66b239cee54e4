"""The agent operations the API calls on the FleetManager: spawn, kill, respawn, remove,
steering, drain, adopt. Lifecycle goes to the provider (its `AgentSpec` carries the posture
too, kept only by a backend that carries one: K8sFleet's CR); what Prospero must remember of
an agent (posture, protocol asked for, spawned or adopted here) goes to its own metadata store
(AgentMeta), never read back from a backend's echo."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from prospero.core.drivers.base import AgentDriver
from prospero.core.errors import (
    AgentNotFound,
    Conflict,
    InvalidState,
    ProsperoError,
    Unsupported,
)
from prospero.core.fleet.meta import drivable, drive_protocol, effective_status
from prospero.core.fleet.records import AgentSpec, ListedAgent
from prospero.core.fleet.state import NOT_DRIVEN, AgentSlot, FleetState
from prospero.core.ownership import workspace_key
from prospero.core.provider_env import check_spawnable
from prospero.core.relay.base import RelayOp
from prospero.core.relay.routing import RELAYED_CALLS
from prospero.types.api import SpawnedResponse, SpawnRequest
from prospero.types.events import BUDGET_EXCEEDED, AgentGone, AgentSpawned, now_ts
from prospero.types.model import Agent, AgentMeta, AgentStatus, DriveProtocol, RegisteredWorkspace

log = logging.getLogger("prospero.core.fleet.manager")

# Seconds an ACP agent stopped at its budget mid-turn is given to end the cancelled turn.
BUDGET_SETTLE = 5.0

KILLED_BY_REMOVAL = ("killed", "killed by the operator: its CalibanTask was deleted")


class AgentOperations(FleetState):
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
        if self.config.provider_keys_here:
            check_spawnable(ws.config, self.config.default_env, os.environ)
        await self.daily_budgets.refuse_spawn(ws.name, ws.config)
        posture = req.posture
        if posture is None and self.decisions is not None:
            posture = await self.decisions.default_posture(ws.name)
        spec = AgentSpec(
            prompt=req.prompt,
            label=req.label,
            frontmatter_path=req.frontmatter_path,
            model=req.model,
            provider=ws.config.provider,
            tool_allowlist=tuple(req.tool_allowlist) if req.tool_allowlist is not None else None,
            worktree=req.isolated,
            inherit_hooks=True,
            interactive=req.interactive,
            drive_protocol=req.drive_protocol,
            posture=posture,
        )
        # No poll of this workspace runs until the new agent is registered here as ours: a
        # listing that raced the provider's reply would take it for a discovered agent.
        async with self._poll_locks.setdefault(ws.name, asyncio.Lock()):
            reply = await self.provider.spawn(ws, spec)
            # An identical spawn that found the agent already there (K8sFleet: the CR existed,
            # spawned by this replica, another one or another client) changes nothing here:
            # no second `agent_spawned`, and the first spawn's record stays as it was.
            created = reply.created
            # Prospero's own record of the spawn, kept before anything acts on the reply: the
            # posture and the protocol asked for are never read back from caliband's echo.
            meta = AgentMeta(
                agent_id=reply.id,
                workspace=ws.name,
                spawned_here=True,
                drive_protocol=req.drive_protocol,
                posture=posture,
                prompt=req.prompt,
                created_at=now_ts(),
                budget_usd=req.budget_usd,
                budget_tokens=req.budget_tokens,
            )
            slot = self._slots.setdefault(reply.id, AgentSlot(workspace=ws.name))
            slot.workspace = ws.name
            if created:
                slot.meta = meta
            if slot.record is None:
                # Provisional record until the next poll (so kill/rm right after spawn work).
                slot.record = ListedAgent(
                    id=reply.id,
                    name=req.label or f"agent-{reply.id}",
                    status=AgentStatus.spawning,
                    started_at=now_ts(),
                    spec=spec,
                    address=reply.address,
                )
                slot.status = AgentStatus.spawning
            if created:
                await self.emitter.emit(ws.name, reply.id, AgentSpawned())
                await self._put_meta(meta)
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
            created=created,
            drive_protocol=req.drive_protocol,
        )

    async def kill(self, agent_id: str, *, local: bool = False) -> None:
        """Kill a live agent (its driver then concludes the run: agent_finished `killed`).
        A finished agent is refused (InvalidState, 409) and nothing changes: caliband's kill
        would rewrite its `done` into `killed`. In a cluster an ACP agent's kill runs on the
        replica that drives it (the session is concluded before caliband's kill)."""
        ws, _slot = self._slot(agent_id)
        await self.poll_workspace(ws.name)  # decide on caliband's current status
        ws, slot = self._slot(agent_id)
        assert slot.record is not None
        status = effective_status(slot.record, slot.meta)
        if status.terminal:
            raise InvalidState("kill", agent_id, status.value, "the agent has already finished")
        removes = self.config.kill_removes_agent
        if not local and (
            owner := await self._owner_elsewhere(slot, agent_id, "kill", any_protocol=removes)
        ):
            await self._relay(owner, agent_id, "kill")
            return
        await self._cancel_asks(agent_id, "the agent was killed")
        if slot.driver is not None and drive_protocol(slot.record, slot.meta) != "ndjson":
            # session/cancel, open tool calls closed, agent_finished{killed} — before caliband's
            # kill, so an agent that answers the cancel first cannot turn the kill into a
            # `Cancelled` run.
            slot.released = True  # the kill below releases the worker; no second kill
            with contextlib.suppress(ProsperoError):
                await slot.driver.conclude("killed", "killed by the operator")
        elif slot.driver is not None and removes:
            # The provider's kill removes the agent (K8s: its CalibanTask is deleted, the pod
            # goes with it), so no terminal status will ever be listed: the driver stops
            # reading and records the end itself now, under the agent's lease.
            # The lease is kept until the agent is gone from the listing.
            await self._close_driver(
                agent_id, conclude=True, ending=KILLED_BY_REMOVAL, release=False
            )
        await self.provider.kill(ws, agent_id)
        await self.poll_workspace(ws.name)  # sees `killed`: nudges the driver to conclude

    async def _stop_for_budget(self, agent_id: str, detail: str) -> None:
        """The agent crossed a cap it was spawned with (core/budgets.py; called on the
        replica driving it): its run ends as `budget_exceeded`, then caliband kills the
        worker. ACP: the driver's conclude sends session/cancel and closes the turn first.
        NDJSON: the driver stops reading and records the end itself, then the kill."""
        try:
            ws, slot = self._slot(agent_id)
        except ProsperoError:
            return
        if slot.record is None or slot.driver is None or slot.driver.finished:
            return
        ending = (BUDGET_EXCEEDED, detail)
        await self._cancel_asks(agent_id, "the agent was stopped at its budget")
        try:
            if drive_protocol(slot.record, slot.meta) != "ndjson":
                slot.released = True  # the kill below releases the worker
                settle = getattr(slot.driver, "settle_turn", None)
                if settle is not None:
                    # A cap crossed mid-turn (ACP usage_update): the turn is cancelled and
                    # ends with its usage counted before the run is concluded.
                    await settle(BUDGET_SETTLE, ending)
                await slot.driver.conclude(*ending)
                if slot.driver.finished:
                    await self._on_finished(agent_id)
            else:
                await self._close_driver(agent_id, conclude=True, ending=ending)
            await self.provider.kill(ws, agent_id)
        except ProsperoError as e:
            log.warning("agent %s: stopping it at its budget failed: %s", agent_id, e)
            return
        await self.poll_workspace(ws.name)

    async def respawn(self, agent_id: str) -> str:
        ws, slot = self._slot(agent_id)
        rec = slot.record
        assert rec is not None
        old = slot.meta
        await self.daily_budgets.refuse_spawn(ws.name, ws.config)
        async with self._poll_locks.setdefault(ws.name, asyncio.Lock()):  # as in spawn
            new_id = await self.provider.respawn(ws, agent_id)
            new_slot = self._slots.setdefault(new_id, AgentSlot(workspace=ws.name))
            new_slot.workspace = ws.name
            # The new agent is this control plane's (it asked for it), with the old intent.
            new_slot.meta = AgentMeta(
                agent_id=new_id,
                workspace=ws.name,
                spawned_here=True,
                drive_protocol=drive_protocol(rec, old),
                posture=old.posture if old is not None else None,
                prompt=old.prompt if old is not None else rec.spec.prompt,
                created_at=now_ts(),
            )
            await self.emitter.emit(ws.name, new_id, AgentSpawned())
            await self._put_meta(new_slot.meta)
        await self.poll_workspace(ws.name)
        return new_id

    async def remove(self, agent_id: str, force: bool = False) -> None:
        ws, slot = self._slot(agent_id)
        await self.provider.remove(ws, agent_id, force)
        await self._cancel_asks(agent_id, "the agent was removed")
        slot.record = None
        self._listed.get(ws.name, {}).pop(agent_id, None)
        if self.ownership.owns(workspace_key(ws.name)):  # the lifecycle writer's event
            await self.emitter.emit(ws.name, agent_id, AgentGone())
        await self._close_driver(agent_id)
        # The registry has forgotten the agent: from now on only its stored history answers
        # for it, so that history is committed before the caller hears "removed".
        await self.emitter.flush()

    async def _refresh_meta(self, agent_id: str) -> None:
        """An agent first listed here before the replica that spawned it had stored its
        metadata (clustered) has none in its slot: read it again before deciding whether the
        agent can be steered, or an ACP agent another replica drives reads "not spawned by this
        control plane" instead of being relayed to its owner."""
        slot = self._slots.get(agent_id)
        if slot is None or slot.meta is not None:
            return
        try:
            meta = await self.agents.get_meta(agent_id)
        except ProsperoError:
            return
        if meta is not None and slot.meta is None:
            slot.meta = meta
            if slot.target is not None:
                slot.target.meta = meta

    def _steerable(self, op: str, agent_id: str) -> tuple[RegisteredWorkspace, AgentSlot]:
        ws, slot = self._slot(agent_id)
        rec = slot.record
        assert rec is not None
        status = effective_status(rec, slot.meta)
        if status.terminal:
            raise InvalidState(op, agent_id, status.value, "the agent has finished")
        if not drivable(rec, slot.meta):
            raise InvalidState(op, agent_id, status.value, NOT_DRIVEN)
        if drive_protocol(rec, slot.meta) == "ndjson" and not rec.spec.interactive:
            raise InvalidState(op, agent_id, status.value, "the agent is not interactive")
        return ws, slot

    def _driver_for(self, ws: RegisteredWorkspace, slot: AgentSlot) -> AgentDriver:
        assert slot.record is not None
        if slot.driver is None:
            slot.driver = self._make_driver(ws, slot.record)
        return slot.driver

    async def _owner_elsewhere(
        self, slot: AgentSlot, agent_id: str, op: str, *, any_protocol: bool = False
    ) -> str | None:
        """The replica that must run `op` (it drives this ACP agent — or any agent, with
        `any_protocol`), or None for this one. NDJSON steering goes to caliband from any
        replica; standalone is always here."""
        if self.routing is None or slot.record is None:
            return None
        if drive_protocol(slot.record, slot.meta) == "ndjson" and not any_protocol:
            return None
        return await self.routing.owner_elsewhere(agent_id, op)

    async def _relay(self, owner: str, agent_id: str, op: RelayOp, **args: str) -> None:
        assert self.routing is not None
        self.metrics.inc(RELAYED_CALLS)
        await self.routing.call(owner, agent_id, op, dict(args))

    async def send_input(self, agent_id: str, text: str, *, local: bool = False) -> None:
        await self._refresh_meta(agent_id)
        ws, slot = self._steerable("send input to", agent_id)
        if not local and (owner := await self._owner_elsewhere(slot, agent_id, "send input to")):
            await self._relay(owner, agent_id, "send_input", text=text)
            return
        await self._driver_for(ws, slot).send_input(text)

    async def end_input(self, agent_id: str, *, local: bool = False) -> None:
        await self._refresh_meta(agent_id)
        ws, slot = self._steerable("end input of", agent_id)
        if not local and (owner := await self._owner_elsewhere(slot, agent_id, "end input of")):
            await self._relay(owner, agent_id, "end_input")
            return
        await self._driver_for(ws, slot).end_input()

    async def cancel_turn(self, agent_id: str, *, local: bool = False) -> None:
        await self._refresh_meta(agent_id)
        ws, slot = self._slot(agent_id)
        assert slot.record is not None
        status = effective_status(slot.record, slot.meta)
        if status.terminal:
            raise InvalidState("cancel the turn of", agent_id, status.value)
        if not drivable(slot.record, slot.meta):
            raise InvalidState("cancel the turn of", agent_id, status.value, NOT_DRIVEN)
        if not local and (
            owner := await self._owner_elsewhere(slot, agent_id, "cancel the turn of")
        ):
            await self._relay(owner, agent_id, "cancel_turn")
            return
        await self._cancel_asks(agent_id, "the turn was cancelled")
        try:
            await self._driver_for(ws, slot).cancel_turn()
        except Unsupported as e:
            raise InvalidState("cancel the turn of", agent_id, status.value, str(e)) from e

    async def drain(self, agent_id: str, timeout: float = 30.0) -> None:
        """End input (best effort), wait for a terminal status or removal, then kill."""
        ws, slot = self._slot(agent_id)
        with contextlib.suppress(ProsperoError):
            if owner := await self._owner_elsewhere(slot, agent_id, "drain"):
                await self._relay(owner, agent_id, "end_input")
            else:
                await self._driver_for(ws, slot).end_input()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            await self.poll_workspace(ws.name)
            slot = self._slots[agent_id]
            if slot.record is None or effective_status(slot.record, slot.meta).terminal:
                return
            await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))
        with contextlib.suppress(AgentNotFound):
            await self.provider.kill(ws, agent_id)
        await self.poll_workspace(ws.name)

    async def adopt(self, agent_id: str, protocol: DriveProtocol | None = None) -> Agent:
        """Drive an agent this control plane did not spawn (an ACP agent is otherwise only
        listed: driving it means prompting it, which its spawner may be doing). Stores
        `adopted` (and the protocol) in Prospero's metadata, then starts the driver."""
        ws, slot = self._slot(agent_id)
        rec = slot.record
        assert rec is not None
        proto = protocol or drive_protocol(rec, slot.meta)
        status = effective_status(rec, slot.meta)
        if slot.meta is not None and slot.meta.drivable and slot.meta.drive_protocol == proto:
            return self.get_agent(agent_id)  # already ours: nothing to do
        if status.terminal:
            raise InvalidState("adopt", agent_id, status.value, "the agent has finished")
        if slot.driver is not None and slot.driver.protocol != proto:
            raise Conflict(f"agent '{agent_id}' is already driven as {slot.driver.protocol}")
        if proto != "ndjson" and not self.config.allow_acp:
            raise Conflict(f"drive protocol '{proto}' is disabled on this daemon")
        if proto not in self.driver_factories:
            raise Conflict(f"this build has no '{proto}' driver")
        posture = await self.decisions.default_posture(ws.name) if self.decisions else None
        base = slot.meta or AgentMeta(agent_id=agent_id, workspace=ws.name, created_at=now_ts())
        slot.meta = base.model_copy(
            update={"adopted": True, "drive_protocol": proto, "posture": base.posture or posture}
        )
        await self._put_meta(slot.meta)
        if slot.target is not None:
            slot.target.meta = slot.meta
        self._ensure_driver(ws, rec)
        return self.get_agent(agent_id)

    def driver_factory_names(self) -> list[str]:
        return sorted(self.driver_factories)
