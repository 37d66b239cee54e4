"""Event retention: delete events older than N days (prospero-surface.md §4.6).

Deletion compares the stored RFC 3339 `ts` strings (`ts < cutoff`). Usage aggregates
(`usage_daily`) are not touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta

from prospero.core.metrics import Metrics
from prospero.core.store.base import EventStore

log = logging.getLogger(__name__)

EVENTS_PRUNED = "events_pruned"
PRUNE_FAILURES = "prune_failures"
DEFAULT_INTERVAL = 3600.0


def cutoff_ts(days: float, now: datetime | None = None) -> str:
    """The RFC 3339 (`+00:00`, microseconds) instant `days` before now."""
    base = now if now is not None else datetime.now(UTC)
    return (base.astimezone(UTC) - timedelta(days=days)).isoformat(timespec="microseconds")


async def prune_older_than(store: EventStore, days: float) -> int:
    """Delete events older than `days` days; returns how many were deleted."""
    if days < 0:
        raise ValueError("retention days must be >= 0")
    return await store.prune(cutoff_ts(days))


class RetentionTask:
    """Sweeps once immediately, then every `interval` seconds, until stopped.

    A failing sweep is logged and counted (`prune_failures`); the next one runs on schedule.
    """

    def __init__(
        self,
        store: EventStore,
        days: float,
        *,
        interval: float = DEFAULT_INTERVAL,
        metrics: Metrics | None = None,
    ) -> None:
        if days <= 0:
            raise ValueError("retention days must be > 0 (omit the task to keep everything)")
        if interval <= 0:
            raise ValueError("retention interval must be > 0")
        self.store = store
        self.days = days
        self.interval = interval
        self.metrics = metrics if metrics is not None else Metrics()
        self.sweeps = 0
        self.last_pruned = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="prospero-retention"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def sweep(self) -> int:
        try:
            n = await prune_older_than(self.store, self.days)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.metrics.inc(PRUNE_FAILURES)
            log.warning("retention: prune failed: %s", e)
            n = 0
        else:
            self.metrics.inc(EVENTS_PRUNED, n)
            if n:
                log.info("retention: pruned %d events older than %s days", n, self.days)
        self.sweeps += 1
        self.last_pruned = n
        return n

    async def _run(self) -> None:
        while True:
            await self.sweep()
            await asyncio.sleep(self.interval)
