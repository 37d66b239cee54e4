"""Where a request for an agent runs in a cluster: on this replica when it drives the agent (or
when the request needs no driver), else on the replica that holds the agent's lease, through the
relay (`base.py`). Only what needs the driver itself is relayed — an ACP agent's steering
(prompt, end of input, `session/cancel`, a kill that concludes the session first) and the answer
to a permission request, which waits in its owner's memory. NDJSON steering goes to caliband from
any replica, as before.

`OwnerRouting.owner_elsewhere(agent_id)` is the decision: None = run here; a replica id = relay
there. While nobody holds the lease (its owner died and no replica has taken the agent over yet)
it waits up to `settle` seconds for a new owner rather than failing a request that lands in the
takeover window. `RelayHandler` runs a relayed call on the owner, through the same methods a
local request uses (with `local=True`, so it is never relayed again).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from prospero.core.errors import ProsperoError
from prospero.core.leases import LeaseAuthority
from prospero.core.ownership import Ownership
from prospero.core.relay.base import DEFAULT_TIMEOUT, CommandRelay, RelayedCall, RelayOp
from prospero.types.decisions import Decision

log = logging.getLogger(__name__)

RELAYED_CALLS = "relay_calls_sent"
RELAYED_RUNS = "relay_calls_run"


class NoOwner(ProsperoError):
    """Nobody drives the agent right now (its lease is free) and nobody took it over in time."""

    kind = "unreachable"

    def __init__(self, agent_id: str, op: str, waited: float) -> None:
        super().__init__(
            f"cannot {op} agent '{agent_id}': no replica drives it right now (none took it "
            f"over within {waited:g}s); retry in a moment"
        )
        self.agent_id = agent_id


class OwnerRouting:
    def __init__(
        self,
        relay: CommandRelay,
        authority: LeaseAuthority,
        ownership: Ownership,
        *,
        settle: float = 10.0,
        poll: float = 0.1,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.relay = relay
        self.authority = authority
        self.ownership = ownership
        self.replica_id = relay.replica_id
        self.settle = settle
        self.poll = poll
        self.timeout = timeout

    async def call(
        self, owner: str, agent_id: str, op: RelayOp, args: dict[str, Any] | None = None
    ) -> Any:
        """Run `op` on `owner` (RelayedError / RelayUnanswered as `CommandRelay.call`)."""
        return await self.relay.call(owner, agent_id, op, args, timeout=self.timeout)

    async def owner_elsewhere(self, agent_id: str, op: str) -> str | None:
        """The replica that must run `op` for the agent, or None for this one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settle
        while True:
            if self.ownership.owns(agent_id):
                return None
            lease = await self.authority.holder(agent_id)
            if lease is not None and lease.owner:
                return None if lease.owner == self.replica_id else lease.owner
            if loop.time() >= deadline:
                raise NoOwner(agent_id, op, self.settle)
            await asyncio.sleep(self.poll)  # bounded: until an owner appears or `settle`

    async def decide_remote(
        self, decision: Decision, option_id: str, by: str, note: str | None
    ) -> Decision | None:
        """Answer a decision whose request waits on another replica; None when it would be
        this replica (then the request is not live anywhere)."""
        owner = await self.owner_elsewhere(decision.agent_id, "answer a decision of")
        if owner is None:
            return None
        value = await self.call(
            owner,
            decision.agent_id,
            "decide",
            {"decision_id": decision.id, "option_id": option_id, "by": by, "note": note},
        )
        return Decision.model_validate(value)


class Steering(Protocol):
    async def send_input(self, agent_id: str, text: str, *, local: bool = False) -> None: ...

    async def end_input(self, agent_id: str, *, local: bool = False) -> None: ...

    async def cancel_turn(self, agent_id: str, *, local: bool = False) -> None: ...

    async def kill(self, agent_id: str, *, local: bool = False) -> None: ...


class Deciding(Protocol):
    async def decide_by_human(
        self,
        decision_id: str,
        option_id: str,
        *,
        by: str,
        note: str | None = None,
        local: bool = False,
    ) -> Decision: ...


class RelayHandler:
    """Runs a call relayed to this replica (the owner) as if it had received the request."""

    def __init__(self, steering: Steering, decisions: Deciding | None) -> None:
        self.steering = steering
        self.decisions = decisions

    async def __call__(self, call: RelayedCall) -> Any:
        log.info("relayed %s for agent %s (call %s)", call.op, call.agent_id, call.id)
        a = call.args
        if call.op == "decide":
            if self.decisions is None:
                raise ProsperoError("this replica has no decision service")
            d = await self.decisions.decide_by_human(
                str(a["decision_id"]),
                str(a["option_id"]),
                by=str(a["by"]),
                note=a.get("note"),
                local=True,
            )
            return d.model_dump(mode="json")
        s = self.steering
        if call.op == "send_input":
            await s.send_input(call.agent_id, str(a["text"]), local=True)
        elif call.op == "end_input":
            await s.end_input(call.agent_id, local=True)
        elif call.op == "cancel_turn":
            await s.cancel_turn(call.agent_id, local=True)
        elif call.op == "kill":
            await s.kill(call.agent_id, local=True)
        return None
