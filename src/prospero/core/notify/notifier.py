"""The notifier: reads the fleet stream from the store after its durable cursor, claims one
delivery per (target, event) in the store, and sends each from a per-target FIFO worker.

- Nothing is lost across a restart: the cursor moves only past events whose deliveries are
  claimed (stored), and deliveries claimed but never finished are sent again at start (at
  least once). The first start begins at the store's head: history is not notified.
- Nothing is sent twice by two readers: a delivery is sent only by whoever's claim inserted
  its row. Clustered, only the replica holding the `notifier` lease reads the stream; a new
  holder goes on from the shared cursor.
- Ingest never waits on it: it reads the store on its own task; a slow target only delays its
  own queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import httpx
import orjson

from prospero.core.aio import wait_for
from prospero.core.leases import LeaseAuthority, LeaseKeeper
from prospero.core.metrics import Metrics
from prospero.core.notify.render import SOURCE_KINDS, Notice, notice_of, payload, test_notice
from prospero.core.notify.sender import RetryPolicy, post
from prospero.core.store.base import EventStore
from prospero.core.store.notifications import NotificationStore
from prospero.types.events import now_ts
from prospero.types.notifications import Delivery, DeliveryState, NotificationTarget, TestResult

log = logging.getLogger(__name__)

LEASE_KEY = "notifier"
DELIVERED = "notifications_delivered"
FAILED = "notifications_failed"
RETRIES = "notification_retries"
QUEUE = "notification_queue"


@dataclass(frozen=True)
class NotifierConfig:
    public_url: str | None = None  # links in the messages
    poll_interval: float = 0.5  # seconds between reads of the fleet stream
    batch: int = 500
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout: float = 10.0
    # Clustered: the lease authority, this replica's id, the lease TTL and renewal cadence.
    leases: LeaseAuthority | None = None
    owner: str = ""
    ttl: float = 30.0
    heartbeat: float | None = None


@dataclass
class _Job:
    delivery: Delivery
    notice: Notice


class Notifier:
    def __init__(
        self,
        store: NotificationStore,
        events: EventStore,
        metrics: Metrics,
        config: NotifierConfig | None = None,
    ) -> None:
        self.store = store
        self.events = events
        self.metrics = metrics
        self.config = cfg = config or NotifierConfig()
        self.keeper = (
            LeaseKeeper(cfg.leases, cfg.owner, ttl=cfg.ttl, heartbeat=cfg.heartbeat)
            if cfg.leases is not None
            else None
        )
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._queues: dict[str, asyncio.Queue[_Job]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._cursor: int | None = None  # set while leading
        self._wake = asyncio.Event()
        self._queued = 0
        self._sending = 0  # workers in the middle of a delivery
        self._closing = False
        metrics.gauge_fn(QUEUE, lambda: {(): float(self._queued)})

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._task is None:
            self._client = httpx.AsyncClient(
                timeout=self.config.timeout,
                trust_env=False,
                follow_redirects=False,
                headers={"User-Agent": "prosperod", "Content-Type": "application/json"},
            )
            self._task = asyncio.create_task(self._loop(), name="notifier")

    def nudge(self) -> None:
        self._wake.set()

    async def stop(self, drain: float = 3.0, *, release: bool = True) -> None:
        """Stop reading; let the sends in flight finish (up to `drain` seconds, so that a
        graceful stop does not leave a sent notification to be sent again), then stop the
        workers. Claimed deliveries not sent yet are sent by the next start. `release`: hand
        the `notifier` lease over now (False: leave it to expire, as a crashed replica does)."""
        task, self._task = self._task, None
        self._closing = True
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain
        while self._sending and loop.time() < deadline:
            await asyncio.sleep(0.01)
        tasks = list(self._workers.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._workers.clear()
        self._queues.clear()
        if self.keeper is not None:
            with contextlib.suppress(Exception):
                await wait_for(self.keeper.close(release=release), 5.0)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @property
    def leading(self) -> bool:
        return self._cursor is not None and (self.keeper is None or self.keeper.owns(LEASE_KEY))

    # ------------------------------------------------------------------ the reader

    async def _loop(self) -> None:
        while True:
            more = False
            try:
                if await self._lead():
                    more = await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("notifier pass failed")
            if not more:
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._wake.wait(), self.config.poll_interval)
                self._wake.clear()

    async def _lead(self) -> bool:
        if self.keeper is not None and not self.keeper.owns(LEASE_KEY):
            self._cursor = None  # lost it (or never had it): read the shared cursor again
            if await self.keeper.acquire(LEASE_KEY) is None:
                return False
        if self._cursor is None:
            cursor = await self.store.load_cursor()
            if cursor is None:
                cursor = await self.events.last_ordinal()  # first start: from now on
                await self.store.save_cursor(cursor)
            self._cursor = cursor
            for d in await self.store.pending():  # claimed, never finished: send again
                target = await self.store.get_target(d.target_id)
                if target is not None:
                    notice = Notice(
                        d.event,
                        d.ordinal,
                        d.workspace or "",
                        d.agent_id or "",
                        d.summary,
                        {"resent": True},
                    )
                    self._enqueue(target, _Job(d, notice))
        return True

    async def run_once(self) -> bool:
        """Read the next batch after the cursor; True when it was full (read again now)."""
        assert self._cursor is not None
        # Everything up to the head is committed (ordinals commit in order): only the kinds
        # that may notify are read, and the cursor moves to the head past the others.
        head = await self.events.last_ordinal()
        if head <= self._cursor:
            return False
        rows = await self.events.replay_fleet_raw(
            self._cursor, limit=self.config.batch, kinds=SOURCE_KINDS
        )
        full = len(rows) >= self.config.batch
        notices: list[Notice] = []
        for row in rows:
            try:
                event = orjson.loads(row.data)
            except orjson.JSONDecodeError:
                continue
            notice = notice_of(row.cursor, event, self.config.public_url)
            if notice is not None:
                notices.append(notice)
        if notices:
            targets = await self.store.targets()
            for notice in notices:
                for target in targets:
                    # A target is told of what happens after it was added, not of the past
                    # (events stored before it, read only now).
                    if notice.ts and notice.ts < target.created_at:
                        continue
                    if target.wants(notice.event, notice.workspace):
                        await self._claim(target, notice)
        last = rows[-1].cursor if full else max(head, rows[-1].cursor if rows else head)
        await self.store.save_cursor(last)
        self._cursor = last
        return full

    async def _claim(self, target: NotificationTarget, notice: Notice) -> None:
        d = Delivery(
            id=0,
            target_id=target.id,
            ordinal=notice.ordinal,
            event=notice.event,
            agent_id=notice.agent_id or None,
            workspace=notice.workspace or None,
            summary=notice.summary,
            created_at=now_ts(),
        )
        new = await self.store.claim(d)
        if new is not None:
            self._enqueue(target, _Job(d.model_copy(update={"id": new}), notice))

    # ------------------------------------------------------------------ the senders

    def _enqueue(self, target: NotificationTarget, job: _Job) -> None:
        q = self._queues.get(target.id)
        if q is None:
            q = self._queues[target.id] = asyncio.Queue()
            self._workers[target.id] = asyncio.create_task(
                self._worker(target.id, q), name=f"notify-{target.name}"
            )
        self._queued += 1
        q.put_nowait(job)

    async def _worker(self, target_id: str, q: asyncio.Queue[_Job]) -> None:
        while not self._closing:
            job = await q.get()
            if self._closing:
                return  # stays pending: the next start sends it
            self._sending += 1
            try:
                await self._deliver(target_id, job)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("notification %s: delivery failed", job.delivery.id)
            finally:
                self._sending -= 1
                self._queued -= 1

    async def _deliver(self, target_id: str, job: _Job) -> None:
        target = await self.store.get_target(target_id)  # as it is now (edited, disabled)
        d = job.delivery
        if target is None:
            return  # deleted, with its log
        if not target.enabled:
            await self.store.finish(
                d.id, "failed", attempts=0, http_status=None,
                error="the target was disabled before delivery", at=now_ts(),
            )  # fmt: skip
            return
        assert self._client is not None
        sent_at = now_ts()
        out = await post(
            self._client,
            target.url,
            payload(target.format, job.notice, sent_at),
            self.config.retry,
            on_retry=lambda: self.metrics.inc(RETRIES),
        )
        state: DeliveryState = "delivered" if out.delivered else "failed"
        self.metrics.inc(DELIVERED if out.delivered else FAILED, labels=(d.event,))
        if not out.delivered:
            log.warning(
                "notification to %s (%s) failed after %d attempt(s): %s",
                target.name, d.event, out.attempts, out.error,
            )  # fmt: skip
        await self.store.finish(
            d.id, state, attempts=out.attempts, http_status=out.http_status,
            error=out.error, at=now_ts(),
        )  # fmt: skip

    async def test(self, target: NotificationTarget) -> TestResult:
        """Send a test message to `target` now (one attempt) and log it."""
        notice = test_notice(target.name, self.config.public_url)
        d = Delivery(
            id=0, target_id=target.id, ordinal=None, event="test",
            summary=notice.summary, created_at=now_ts(),
        )  # fmt: skip
        new = await self.store.claim(d)
        assert new is not None  # a test message is always new
        client = self._client or httpx.AsyncClient(timeout=self.config.timeout, trust_env=False)
        try:
            out = await post(
                client, target.url, payload(target.format, notice, now_ts()),
                RetryPolicy(attempts=1),
            )  # fmt: skip
        finally:
            if client is not self._client:
                await client.aclose()
        at = now_ts()
        state: DeliveryState = "delivered" if out.delivered else "failed"
        await self.store.finish(
            new, state, attempts=out.attempts, http_status=out.http_status, error=out.error, at=at
        )
        done = d.model_copy(
            update={
                "id": new, "state": state, "attempts": out.attempts,
                "http_status": out.http_status, "error": out.error, "updated_at": at,
            }
        )  # fmt: skip
        return TestResult(delivered=out.delivered, delivery=done)
