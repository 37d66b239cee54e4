"""`PgBus`: the live bus of prosperod replicas sharing one PostgreSQL database.

The doorbell carries a pointer, never the payload: every append's statement sends
`NOTIFY prospero_events, '<last ordinal of the batch>'` (`store/postgres/events_sql.py`), which
PostgreSQL delivers at commit to every listening session, this replica's included, and never
for a rolled-back append. `PgBus` keeps one LISTEN connection of its own; a doorbell past what it
has read wakes its reader, which reads the new rows from the store in ordinal order
(`replay_fleet`, pages of `page` events) and publishes them to its local subscribers through an
`InProcessBus` (bounded queues, `Lagged` on overflow, healed from the store as always). So every
replica's subscribers see every replica's events, in commit order (ordinals are commit-ordered
and without holes), exactly once, whoever wrote them; the emitter's own `publish` is ignored
(`wants` is False: it does not even build the models), since its events come back the same way.

Healing:
- a lost doorbell (or one sent while the LISTEN connection was down) costs at most
  `heal_interval`: the reader also looks at the store's last ordinal that often;
- a dropped LISTEN connection is reopened with backoff, and the reader catches up from where it
  was (the store is the truth; nothing is lost);
- with no local subscriber the reader only moves its cursor to the newest ordinal (a subscriber
  joins through the store, as with any bus, and gets live items from the moment it subscribed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import asyncpg

from prospero.core.aio import wait_for
from prospero.core.bus.base import BusItem
from prospero.core.bus.memory import InProcessBus, InProcessSubscription
from prospero.core.errors import StoreError
from prospero.core.metrics import Metrics
from prospero.core.store.base import EventStore
from prospero.core.store.postgres.db import redact
from prospero.core.store.postgres.events_sql import EVENTS_CHANNEL

log = logging.getLogger(__name__)

BUS_DOORBELLS = "bus_doorbells"  # NOTIFYs received
BUS_STORE_READS = "bus_store_reads"  # pages read from the store for live delivery
BUS_LISTEN_RECONNECTS = "bus_listen_reconnects"

HEAL_INTERVAL = 1.0
PAGE = 1000
RECONNECT_MIN = 0.2
RECONNECT_MAX = 5.0


class PgBus:
    def __init__(
        self,
        store: EventStore,
        dsn: str,
        *,
        buffer: int = 1024,
        metrics: Metrics | None = None,
        heal_interval: float = HEAL_INTERVAL,
        page: int = PAGE,
    ) -> None:
        self.store = store
        self.dsn = dsn
        self.metrics = metrics or Metrics()
        self.local = InProcessBus(buffer=buffer, metrics=self.metrics)
        self.heal_interval = heal_interval
        self.page = max(1, page)
        self.cursor = 0  # the last ordinal published (or skipped for want of subscribers)
        self._rung = 0  # the highest ordinal a doorbell announced
        self._wake = asyncio.Event()
        self._lost = asyncio.Event()  # the LISTEN connection ended
        self._conn: asyncpg.Connection | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self.connected = asyncio.Event()  # the LISTEN connection is up

    # -- Bus ---------------------------------------------------------------------------------

    def publish(self, item: BusItem) -> None:
        """Ignored: committed events come back through the doorbell and the store."""

    def wants(self, stream_key: str) -> bool:
        return False

    def subscribe(self, stream_key: str | None = None) -> InProcessSubscription:
        return self.local.subscribe(stream_key)

    def subscriber_count(self) -> int:
        return self.local.subscriber_count()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, then read from the store's current end on (history is the store's)."""
        self.cursor = self._rung = await self.store.last_ordinal()
        await self._listen()
        self._tasks = [
            asyncio.create_task(self._reader(), name="pgbus-reader"),
            asyncio.create_task(self._keep_listening(), name="pgbus-listen"),
        ]

    async def close(self) -> None:
        self._closed = True
        self._wake.set()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        await self._drop_conn()
        self.local.close()

    # -- the LISTEN connection ---------------------------------------------------------------

    def _on_notify(self, conn: Any, pid: int, channel: str, payload: object) -> None:
        self.metrics.inc(BUS_DOORBELLS)
        try:
            ordinal = int(str(payload))
        except ValueError:
            ordinal = 0
        if ordinal > self._rung:
            self._rung = ordinal
        self._wake.set()

    def _on_terminated(self, conn: Any) -> None:
        self.connected.clear()
        self._lost.set()  # the keeper reconnects; the reader keeps healing meanwhile

    async def _listen(self) -> None:
        try:
            conn = await asyncpg.connect(self.dsn)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as e:
            raise StoreError(f"bus: cannot connect to {redact(self.dsn)}: {e}") from e
        try:
            conn.add_termination_listener(self._on_terminated)
            await conn.add_listener(EVENTS_CHANNEL, self._on_notify)
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        self._lost.clear()
        self.connected.set()
        self._wake.set()  # catch up on what committed while we were not listening

    async def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        self.connected.clear()
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=2)
            except Exception:
                conn.terminate()

    async def _keep_listening(self) -> None:
        delay = RECONNECT_MIN
        while not self._closed:
            conn = self._conn
            if conn is not None and not conn.is_closed():
                delay = RECONNECT_MIN
                # Woken by the termination listener, or look again after a while (a half-open
                # connection is found out by the server's keepalive and asyncpg then).
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._lost.wait(), self.heal_interval)
                continue
            await self._drop_conn()
            try:
                await self._listen()
                self.metrics.inc(BUS_LISTEN_RECONNECTS)
                log.info("bus: LISTEN connection to %s restored", redact(self.dsn))
            except (StoreError, OSError, asyncpg.PostgresError) as e:
                log.warning("bus: LISTEN connection lost, retrying in %.1fs: %s", delay, e)
                await asyncio.sleep(delay)  # backoff between reconnect attempts
                delay = min(RECONNECT_MAX, delay * 2)

    # -- the reader --------------------------------------------------------------------------

    async def _reader(self) -> None:
        while not self._closed:
            try:
                await wait_for(self._wake.wait(), self.heal_interval)
            except TimeoutError:
                # No doorbell for a while: look at the store's end (a lost NOTIFY heals here).
                try:
                    self._rung = max(self._rung, await self.store.last_ordinal())
                except StoreError as e:
                    log.warning("bus: cannot read the store's last ordinal: %s", e)
                    continue
            self._wake.clear()
            if self._closed:
                return
            try:
                await self._catch_up()
            except StoreError as e:
                log.warning("bus: reading new events failed (retrying): %s", e)
                self._wake.set()
                await asyncio.sleep(min(self.heal_interval, 0.5))  # backoff, then retry

    async def _catch_up(self) -> None:
        while self.cursor < self._rung and not self._closed:
            if self.local.subscriber_count() == 0:
                self.cursor = self._rung  # nobody to tell: history stays in the store
                return
            page = await self.store.replay_fleet(self.cursor, self.page)
            self.metrics.inc(BUS_STORE_READS)
            if not page:
                return  # announced but not visible yet (cannot happen after commit): next wake
            publish = self.local.publish
            now = time.monotonic()
            for stored in page:
                publish(BusItem(stored.ordinal, stored.event, now))
            self.cursor = page[-1].ordinal
            self._rung = max(self._rung, self.cursor)
            if len(page) == self.page:
                await asyncio.sleep(0)  # a backlog: let the subscribers run between pages
