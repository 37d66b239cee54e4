"""`MemoryRelay`: the relay between replicas living in one process (tests, the conformance
suite's reference). Replicas join a `MemoryRelayHub`; a call waits in the hub until its target
takes it (claim), runs there, and its outcome wakes the caller. Same at-most-once, withdrawal
and error rules as the PostgreSQL relay."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from prospero.core.aio import wait_for
from prospero.core.relay.base import (
    DEFAULT_TIMEOUT,
    Handler,
    RelayedCall,
    RelayOp,
    RelayOutcome,
    RelayUnanswered,
)


@dataclass
class _Pending:
    call: RelayedCall
    outcome: asyncio.Future[RelayOutcome]
    taken: bool = False


@dataclass
class MemoryRelayHub:
    """The calls not yet taken, by target replica."""

    waiting: dict[str, list[_Pending]] = field(default_factory=dict)
    doorbells: dict[str, asyncio.Event] = field(default_factory=dict)

    def bell(self, replica: str) -> asyncio.Event:
        return self.doorbells.setdefault(replica, asyncio.Event())


class MemoryRelay:
    def __init__(self, hub: MemoryRelayHub, replica_id: str) -> None:
        self.hub = hub
        self.replica_id = replica_id
        self._handler: Handler | None = None
        self._worker: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()

    async def start(self, handler: Handler) -> None:
        self._handler = handler
        if self._worker is None:
            self._worker = asyncio.create_task(self._take(), name=f"relay-{self.replica_id}")

    async def call(
        self,
        target: str,
        agent_id: str,
        op: RelayOp,
        args: dict[str, Any] | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Any:
        call = RelayedCall.new(target, agent_id, op, args)
        pending = _Pending(call, asyncio.get_running_loop().create_future())
        self.hub.waiting.setdefault(target, []).append(pending)
        self.hub.bell(target).set()
        try:
            outcome = await wait_for(asyncio.shield(pending.outcome), timeout)
        except TimeoutError:
            if not pending.taken:
                with contextlib.suppress(ValueError):
                    self.hub.waiting.get(target, []).remove(pending)
            raise RelayUnanswered(call, timeout, taken=pending.taken) from None
        return outcome.unwrap(target)

    async def _take(self) -> None:
        bell = self.hub.bell(self.replica_id)
        while True:
            await bell.wait()
            bell.clear()
            queue = self.hub.waiting.pop(self.replica_id, [])
            for pending in queue:
                pending.taken = True
                task = asyncio.create_task(self._run(pending), name=f"relay-call-{pending.call.id}")
                self._running.add(task)
                task.add_done_callback(self._running.discard)

    async def _run(self, pending: _Pending) -> None:
        assert self._handler is not None
        try:
            outcome = RelayOutcome(ok=True, value=await self._handler(pending.call))
        except Exception as e:
            outcome = RelayOutcome.of_error(e)
        if not pending.outcome.done():
            pending.outcome.set_result(outcome)

    async def close(self) -> None:
        """Stop taking calls (a closed replica is a dead one: its calls go unanswered)."""
        tasks = [t for t in (self._worker, *self._running) if t is not None]
        self._worker = None
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
