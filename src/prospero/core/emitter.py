"""The single writer of fleet events: sequencing, group commit, durable-first publish.

`emit()` stamps the event (ts, per-stream seq) and queues it; one background task takes
everything queued (up to `max_batch`), appends it to the store in one transaction, and only
then publishes each event to the bus with its ordinal. Because publish happens after commit, a
subscriber that subscribes *before* reading history never misses an event (prospero-surface.md
§1.5): anything published after it subscribed reaches it live, anything before is in the store.

Seq is per stream key and starts at 1. The counter is seeded lazily from `store.high_water`;
on `SeqConflict` (another writer got there first) the writer backs off a little (jittered),
re-seeds the conflicting streams from the store, renumbers their queued events and retries (up
to `max_conflict_retries`). The
FleetEvent returned by `emit` carries the seq assigned at emit time; it differs from the stored
one only after such a conflict.

Any other store failure does not lose the live view: the events are published with ordinal
None, `append_failures` is counted, and a `store_persist_failed{lost_seq, detail}` marker is
emitted on each affected stream (its persistence is attempted once, it is published either way).

Memory is bounded: once `max_pending` events are emitted but not yet committed, `emit` waits
for the writer (back-pressure on a slow store) instead of queueing without limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque

from prospero.core.bus import Bus, BusItem
from prospero.core.errors import SeqConflict, StoreError
from prospero.core.metrics import APPEND_FAILURES, EVENTS_APPENDED, Metrics
from prospero.core.store.base import EventStore
from prospero.types.events import (
    EventKind,
    FleetEvent,
    StorePersistFailed,
    now_ts,
    stream_key_for,
)

log = logging.getLogger(__name__)


class Emitter:
    def __init__(
        self,
        store: EventStore,
        bus: Bus,
        metrics: Metrics | None = None,
        *,
        max_batch: int = 1000,
        max_pending: int = 100_000,
        max_conflict_retries: int = 8,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.store = store
        self.bus = bus
        self.metrics = metrics if metrics is not None else Metrics()
        self.max_batch = max_batch
        self.max_pending = max(max_pending, 1)
        self.max_conflict_retries = max_conflict_retries
        self._next: dict[str, int] = {}
        self._seeding: dict[str, asyncio.Future[None]] = {}
        self._pending: deque[FleetEvent] = deque()
        self._wakeup = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._enqueued = 0
        self._done = 0
        self._flush_waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the writer task (idempotent; `emit` also starts it on first use)."""
        self._start_writer()

    def _start_writer(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(
                self._writer(), name="prospero-emitter"
            )

    async def close(self) -> None:
        """Flush everything emitted so far, then stop the writer. Further emits raise."""
        if self._closed:
            return
        self._closing = True
        while self._task is not None and self._done < self._enqueued:
            await self.flush()
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def pending(self) -> int:
        """Events emitted but not yet committed and published."""
        return self._enqueued - self._done

    # -- producing -------------------------------------------------------------------------

    async def emit(
        self, repo: str, agent_id: str, kind: EventKind, *, ts: str | None = None
    ) -> FleetEvent:
        """Sequence and queue one event; returns it as stamped. Durability is asynchronous:
        `await flush()` to wait for it."""
        if self._closing:
            raise StoreError("emitter is closed")
        if self._task is None:
            self._start_writer()
        if self._enqueued - self._done >= self.max_pending:
            await self._wait_for_room()
        key = stream_key_for(repo, agent_id)
        seq = self._next.get(key)
        while seq is None:  # slow path: first event of this stream since start
            await self._seed(key)
            seq = self._next.get(key)
        self._next[key] = seq + 1
        ev = FleetEvent(
            seq=seq, ts=ts if ts is not None else now_ts(), repo=repo, agent_id=agent_id, kind=kind
        )
        self._enqueue(ev)
        return ev

    def _enqueue(self, ev: FleetEvent) -> None:
        self._pending.append(ev)
        self._enqueued += 1
        self._wakeup.set()

    async def _wait_for_room(self) -> None:
        while self._enqueued - self._done >= self.max_pending and not self._closed:
            self._room.clear()
            await self._room.wait()

    async def _seed(self, key: str) -> None:
        fut = self._seeding.get(key)
        if fut is not None:
            await asyncio.shield(fut)
            return
        fut = asyncio.get_running_loop().create_future()
        self._seeding[key] = fut
        try:
            try:
                hw = await self.store.high_water(key)
            except Exception as e:
                # Keep the live view going: start provisionally at 1. If the stream already
                # has events, the first successful append conflicts and the writer re-seeds.
                log.warning("emitter: cannot read high water of %r (%s); seq provisional", key, e)
                hw = 0
            if key not in self._next:
                self._next[key] = hw + 1
        finally:
            del self._seeding[key]
            fut.set_result(None)

    async def flush(self) -> None:
        """Wait until everything emitted before this call is committed (or given up on) and
        published."""
        target = self._enqueued
        if self._done >= target:
            return
        if self._task is None:
            self._start_writer()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flush_waiters.append((target, fut))
        await fut

    # -- the writer --------------------------------------------------------------------------

    async def _writer(self) -> None:
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            n = min(len(self._pending), self.max_batch)
            batch = [self._pending.popleft() for _ in range(n)]
            try:
                await self._commit(batch)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the writer die; _commit already handles store errors
                log.exception("emitter: unexpected error committing %d events", len(batch))
            self._done += n
            if self._enqueued - self._done < self.max_pending:
                self._room.set()
            while self._flush_waiters and self._flush_waiters[0][0] <= self._done:
                _, fut = self._flush_waiters.popleft()
                if not fut.done():
                    fut.set_result(None)

    async def _commit(self, batch: list[FleetEvent]) -> None:
        attempt = 0
        while True:
            try:
                ordinals = await self.store.append_batch(batch)
            except SeqConflict as e:
                attempt += 1
                if attempt > self.max_conflict_retries:
                    self._persist_failed(batch, f"seq conflict not resolved: {e}")
                    return
                log.info("emitter: seq conflict (attempt %d), re-seeding: %s", attempt, e)
                # Jittered backoff: two writers on one stream otherwise keep colliding in step.
                await asyncio.sleep(random.uniform(0, min(0.05, 0.001 * 2**attempt)))
                try:
                    batch = await self._reseed(batch)
                except Exception as e2:
                    self._persist_failed(batch, f"re-seed after seq conflict failed: {e2}")
                    return
                continue
            except Exception as e:
                self._persist_failed(batch, str(e) or type(e).__name__)
                return
            self.metrics.inc(EVENTS_APPENDED, len(batch))
            publish = self.bus.publish
            for ordinal, ev in zip(ordinals, batch, strict=True):
                publish(BusItem(ordinal, ev))
            return

    async def _reseed(self, batch: list[FleetEvent]) -> list[FleetEvent]:
        """Renumber the streams whose seqs another writer already used: this batch and every
        still-queued event of those streams continue after the store's high water."""
        first: dict[str, int] = {}
        for ev in batch:
            first.setdefault(ev.stream_key, ev.seq)
        moved: dict[str, int] = {}
        for key, lo in first.items():
            hw = await self.store.high_water(key)
            if hw >= lo:
                moved[key] = hw + 1
        if not moved:
            return batch  # a transient conflict (e.g. duplicate within another writer): retry

        def renumber(ev: FleetEvent) -> FleetEvent:
            nxt = moved.get(ev.stream_key)
            if nxt is None:
                return ev
            moved[ev.stream_key] = nxt + 1
            return ev.model_copy(update={"seq": nxt})

        batch = [renumber(ev) for ev in batch]
        for i, ev in enumerate(self._pending):
            if ev.stream_key in moved:
                self._pending[i] = renumber(ev)
        for key, nxt in moved.items():
            self._next[key] = max(self._next.get(key, 0), nxt)
        return batch

    def _persist_failed(self, batch: list[FleetEvent], detail: str) -> None:
        """Publish the unpersisted events anyway and mark the loss on each affected stream."""
        self.metrics.inc(APPEND_FAILURES, len(batch))
        log.error("emitter: %d events not persisted: %s", len(batch), detail)
        lost: dict[str, tuple[FleetEvent, int, int]] = {}
        publish = self.bus.publish
        for ev in batch:
            publish(BusItem(None, ev))
            if ev.kind.kind == "store_persist_failed":
                continue  # no marker for a lost marker: no cascade while the store is down
            key = ev.stream_key
            seen = lost.get(key)
            if seen is None:
                lost[key] = (ev, ev.seq, 1)
            else:
                lost[key] = (seen[0], seen[1], seen[2] + 1)
        for key, (sample, lo, count) in lost.items():
            nxt = self._next.get(key, lo + count)
            self._next[key] = nxt + 1
            # Queued behind what is already pending so the stream stays in seq order live; the
            # marker's own persistence is attempted by a later commit (published either way).
            self._enqueue(
                FleetEvent(
                    seq=nxt,
                    ts=now_ts(),
                    repo=sample.repo,
                    agent_id=sample.agent_id,
                    kind=StorePersistFailed(
                        lost_seq=lo,
                        detail=f"{count} event(s) from seq {lo} not persisted: {detail}",
                    ),
                )
            )
