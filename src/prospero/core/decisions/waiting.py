"""The wait for a human answer. A `LiveDecision` is a pending decision whose agent request
waits in this process: the future its resolution sets, and `announced` (set once its
`decision_pending` event is recorded, so a resolution's event never precedes it).
`wait_for_answer` waits for that future until the decision's deadline, then lets the caller
resolve it (`on_timeout`) and returns the resolution."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from prospero.core.aio import wait_for
from prospero.types.decisions import Decision


@dataclass
class LiveDecision:
    """A decision whose agent request is waiting in this process."""

    decision: Decision
    future: asyncio.Future[Decision]
    announced: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    def waiting(cls, decision: Decision) -> LiveDecision:
        return cls(decision, asyncio.get_running_loop().create_future())


def deadline_after(timeout: float | None) -> str | None:
    """The ISO deadline `timeout` seconds from now (None: no deadline)."""
    if timeout is None:
        return None
    at = datetime.now(UTC) + timedelta(seconds=timeout)
    return at.isoformat(timespec="microseconds")


def seconds_until(deadline: str) -> float:
    try:
        at = datetime.fromisoformat(deadline)
    except ValueError:
        return 0.0
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return (at - datetime.now(UTC)).total_seconds()


def raise_if_cancel_requested() -> None:
    """Raise CancelledError when this task was asked to cancel but an await on the way here
    swallowed the request (Python 3.11's wait_for does when its inner future completes at the
    same time); `Task.cancelling()` still counts it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def wait_for_answer(
    live: LiveDecision, on_timeout: Callable[[Decision], Awaitable[object]]
) -> Decision:
    """The decision's resolution. At its deadline `on_timeout(decision)` runs (it resolves
    the decision, typically `expired`) and the wait goes on for the resolution that won."""
    d = live.decision
    if d.deadline is not None:
        left = seconds_until(d.deadline)
        try:
            return await wait_for(asyncio.shield(live.future), max(0.0, left))
        except TimeoutError:
            await on_timeout(d)
    # Shielded: a cancelled caller must not cancel the future (resolutions look at it).
    return await asyncio.shield(live.future)
