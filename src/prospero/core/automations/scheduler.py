"""The automation scheduler: every `interval` seconds, fire each enabled automation whose
schedule has a tick due (docs/automations.md).

- A tick is fired once: `fire(..., tick=<the cron minute>)` claims a unique (automation, tick)
  row, so two replicas (or a lease handover between two passes) cannot fire it twice.
- Only the *latest* due tick is considered: after downtime an automation fires at most once,
  for the most recent tick it missed, and the older missed ticks are skipped (no burst). Ticks
  before its `armed_at` (creation, re-enable, schedule change) are never fired.
- A run left `firing` by a replica that died mid-spawn is marked failed once it is
  `STALE_RUN` old (service.abandon_stale), by whichever replica runs the pass.
- Clustered (a lease authority): only the replica holding the `automations` lease runs the
  pass; the others wait for it to lapse.

`clock` (UTC datetimes) is injectable, and `run_once()` is a single pass (tests drive both).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from prospero.core.aio import wait_for
from prospero.core.automations import cron
from prospero.core.automations.service import AutomationService
from prospero.core.leases import LeaseAuthority, LeaseKeeper
from prospero.types.automations import AutomationRun

log = logging.getLogger(__name__)

LEASE_KEY = "automations"
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class Scheduler:
    def __init__(
        self,
        service: AutomationService,
        *,
        interval: float = 2.0,
        clock: Clock = utc_now,
        leases: LeaseAuthority | None = None,
        owner: str = "",
        ttl: float = 30.0,
        heartbeat: float | None = None,
    ) -> None:
        self.service = service
        self.interval = interval
        self.clock = clock
        self.keeper = (
            LeaseKeeper(leases, owner, ttl=ttl, heartbeat=heartbeat) if leases is not None else None
        )
        self.passes = 0  # passes run (this replica held the lease)
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    @property
    def leader(self) -> bool:
        return self.keeper is None or self.keeper.owns(LEASE_KEY)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="automation-scheduler")

    def nudge(self) -> None:
        """Run a pass now (tests that moved the clock)."""
        self._wake.set()

    async def stop(self, *, release: bool = True) -> None:
        """Stop firing; `release`: hand the `automations` lease over now (False: leave it to
        expire, as a crashed replica does)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.keeper is not None:
            with contextlib.suppress(Exception):
                await self.keeper.close(release=release)

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("automation scheduler pass failed")
            with contextlib.suppress(TimeoutError):
                await wait_for(self._wake.wait(), self.interval)
            self._wake.clear()

    async def _lead(self) -> bool:
        if self.keeper is None or self.keeper.owns(LEASE_KEY):
            return True
        return await self.keeper.acquire(LEASE_KEY) is not None

    async def run_once(self) -> list[AutomationRun]:
        """One pass: the runs it fired (empty when another replica leads)."""
        if not await self._lead():
            return []
        self.passes += 1
        now = self.clock()
        await self.service.abandon_stale()  # wall clock, not self.clock: manual runs use it
        fired: list[AutomationRun] = []
        for a in await self.service.store.all():
            if not a.enabled or not a.schedule:
                continue
            tick = cron.latest_tick(a.schedule, now)
            if tick is None or tick < datetime.fromisoformat(a.armed_at):
                continue
            run = await self.service.fire(
                a, "schedule", tick=tick.isoformat(timespec="minutes"), now=now
            )
            if run is not None:
                fired.append(run)
        return fired
