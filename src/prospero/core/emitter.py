"""The single writer of fleet events: sequencing, group commit, durable-first publish.

`emit()` stamps the event (ts, per-stream seq) and queues it; `emit_many()` does the same for
a driver's whole read of a stream at once (one ts, consecutive seqs), queued as one compact
`EventRun` whose `FleetEvent` models are only built to be published. Batches of everything
queued (up to `max_batch` events) are appended to the store atomically, and only then is each
event published to the bus with its ordinal. Because publish happens after commit, a
subscriber that subscribes *before* reading history never misses an event (prospero-surface.md
§1.5): anything published after it subscribed reaches it live, anything before is in the store.

Committing: with a store that takes batches synchronously (`batch_submitter`, the SQLite
store), producers themselves hand the next batch to the store's writer thread and finish
(publish) committed ones as they emit, so commits overlap the drivers' work instead of waiting
for a turn of the background task behind every busy driver; two batches are in flight, the
second queued `after` the first (it writes nothing unless the first succeeded). The background
task covers quiet periods, failures (`_recover`: later batches are requeued in order, then the
failed one takes the slow path below) and stores without the synchronous path, which it drives
one `append_batch` at a time.

Cursors: `emit_many(..., cursor=...)` queues a driver's resume state right behind its events
(a `CursorMark`); the store writes it in the same transaction as the events queued before it,
so a restart resumes from exactly what is stored (0 duplicates); a run carrying a cursor is
never split across batches, and a failed append writes no cursor. Poison events (kinds that
cannot be serialised) are the store's business: it stores and hands back their reduced form
(`core.store.reduce`), which is what gets published.

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
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future as ConcurrentFuture

from prospero.core.bus import Bus, BusItem
from prospero.core.emitter_queue import (
    Entry,
    InFlight,
    Submit,
    encodable,
    expand_any,
    failure,
    materialise,
    take,
)
from prospero.core.errors import SeqConflict, StoreError
from prospero.core.metrics import APPEND_FAILURES, EVENTS_APPENDED, Metrics
from prospero.core.store.base import CursorMark, EventStore
from prospero.types.events import (
    EVENT_KIND_TYPES,
    CompactKind,
    EventKind,
    EventRun,
    FleetEvent,
    Output,
    StorePersistFailed,
    compact_kind,
    now_ts,
    stream_key_for,
)

log = logging.getLogger(__name__)


# Batches handed to a submitting store at once: the next one is queued while one commits, so
# the store thread goes straight from one to the next.
_PIPELINE_DEPTH = 2
# Longest pause between two looks at an in-flight batch (see `Emitter._until_done`).
_POLL_MAX = 0.002


_OUTPUT_STREAMS = frozenset({"stdout", "thinking"})


class Emitter:
    def __init__(
        self,
        store: EventStore,
        bus: Bus,
        metrics: Metrics | None = None,
        *,
        max_batch: int = 4096,
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
        self._pending: deque[Entry] = deque()  # events (runs count as len(run) events)
        self._wakeup = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._enqueued = 0
        self._done = 0
        self._flush_waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._task: asyncio.Task[None] | None = None
        # Stores that take a batch synchronously (`batch_submitter`) let a producer hand the
        # next batch over, and finish committed ones, without waiting for a turn of the writer
        # task (which, behind many busy drivers, can come late): the store keeps committing
        # while the drivers work. Up to _PIPELINE_DEPTH batches are in flight, each queued
        # `after` the previous one; failures go to the writer task (`_recover`).
        submitter = getattr(store, "batch_submitter", None)
        self._submitter: Callable[[], Submit | None] | None = (
            submitter if callable(submitter) else None
        )
        # Batches handed to the store, oldest first (each queued `after` the previous one).
        self._inflight: deque[InFlight] = deque()
        self._slow = False  # the writer task is handling a failed commit: submit nothing
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
        """Events (and cursor marks) emitted but not yet committed and published."""
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
        ev = FleetEvent.trusted(seq, ts if ts is not None else now_ts(), repo, agent_id, kind)
        self._enqueue(ev)
        return ev

    async def emit_many(
        self,
        repo: str,
        agent_id: str,
        kinds: Sequence[CompactKind],
        cursor: bytes | None = None,
        *,
        ts: str | None = None,
        cursor_extra: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        """`emit` each kind, in order, on one stream: consecutive seqs, one `ts` for the batch
        (stamped now unless given). Same durability and back-pressure as `emit` (a batch may
        overshoot `max_pending` by its own size). Kinds may be `CompactKind`s (an Output as its
        (stream, chunk) pair). The events are queued as one `EventRun`: their `FleetEvent`
        models are only built to be published.

        `cursor`: the driver's resume state once these events are stored. It is queued right
        behind them and the store writes it (the `cursors` row of `agent_id`) in the same
        transaction as them (a run that carries a cursor is never split across transactions;
        whatever was queued before the run commits in that transaction or an earlier one), or
        not at all when that append fails. With no kinds, the cursor alone is queued, and
        commits in order. `flush()` covers it. Events a driver emits one by one (`emit`)
        between two cursors are not held back for the next cursor: a driver that wants
        exactness passes every event of the agent through here.

        `cursor_extra`: more (key, data) cursor rows, queued just before `cursor` and so
        committed in the same transaction as it (a driver's base row beside its delta)."""
        if self._closing:
            raise StoreError("emitter is closed")
        if not kinds:
            if cursor is not None:
                self._start_writer()
                self._queue_cursor(agent_id, cursor, cursor_extra)
                self._wakeup.set()
                self._pump()
            return
        if self._task is None:
            self._start_writer()
        if self._enqueued - self._done >= self.max_pending:
            await self._wait_for_room()
        key = stream_key_for(repo, agent_id)
        seq = self._next.get(key)
        while seq is None:
            await self._seed(key)
            seq = self._next.get(key)
        stamp = ts if ts is not None else now_ts()
        n = len(kinds)
        run: list[CompactKind] = []
        append = run.append
        for kind in kinds:
            t = type(kind)
            if t is tuple:
                if (
                    len(kind) != 2  # type: ignore[arg-type]
                    or kind[0] not in _OUTPUT_STREAMS  # type: ignore[index]
                    or type(kind[1]) is not str  # type: ignore[index]
                ):
                    break
                append(kind)
            elif t is Output:
                d = kind.__dict__
                append((d["stream"], d["chunk"]))  # == compact_kind(kind)
            elif t in EVENT_KIND_TYPES:
                append(kind)
            else:
                break
        if len(run) == n and type(repo) is str and type(agent_id) is str and type(stamp) is str:
            self._pending.append(EventRun(repo, agent_id, stamp, seq, run))
        else:  # not plainly valid: build (and so validate, or raise) the models now
            evs = FleetEvent.trusted_batch(
                seq, stamp, repo, agent_id, [expand_any(k) for k in kinds]
            )
            if cursor is None:
                self._pending.extend(evs)
            else:  # one run: never split from its cursor (see `emitter_queue.take`)
                e0 = evs[0]
                kinds_ = [compact_kind(e.kind) for e in evs]
                self._pending.append(EventRun(e0.repo, e0.agent_id, e0.ts, seq, kinds_))
        self._next[key] = seq + n
        self._enqueued += n
        if cursor is not None:
            self._queue_cursor(agent_id, cursor, cursor_extra)
        self._wakeup.set()
        self._pump()

    def _queue_cursor(
        self, agent_id: str, cursor: bytes, extra: Sequence[tuple[str, bytes]]
    ) -> None:
        # Consecutive marks behind a run: `take` hands them to the store with it.
        for key, data in extra:
            self._pending.append(CursorMark(key, bytes(data)))
            self._enqueued += 1
        self._pending.append(CursorMark(agent_id, bytes(cursor)))
        self._enqueued += 1

    def _enqueue(self, ev: FleetEvent) -> None:
        self._pending.append(ev)
        self._enqueued += 1
        self._wakeup.set()
        self._pump()

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

    async def prepare(self, keys: Iterable[str]) -> None:
        """Seed the seq counters of these streams now, concurrently, so that the emits that
        follow need not each wait for the store (many new streams at once: one round trip)."""
        missing = [k for k in dict.fromkeys(keys) if k not in self._next]
        if missing:
            await asyncio.gather(*(self._seed(k) for k in missing))

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
        inflight = self._inflight
        while True:
            if inflight:
                head = inflight[0]
                if not head.future.done():
                    await self._until_done(head.future)
                if not inflight or inflight[0] is not head:
                    continue  # a producer has finished it already
                error = failure(head.future, head.size)
                if error is None:
                    inflight.popleft()
                    self._fill()  # the next batches commit while this one is published
                    self._finish(head, head.future.result())
                    continue
                await self._recover(head, error)
                continue
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            self._fill()
            if inflight:
                continue
            entries, n, units = take(self._pending, self.max_batch)
            try:
                await self._commit(*materialise(entries))
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the writer die; _commit already handles store errors
                log.exception("emitter: unexpected error committing %d events", n)
            self._advance(units)

    async def _recover(self, head: InFlight, error: BaseException) -> None:
        """The oldest in-flight batch failed: the ones queued after it write nothing (they
        were submitted `after` it), so put them back, in order, and handle the failure the
        slow way (conflict retries, loss markers) with nothing submitted meanwhile."""
        self._slow = True
        try:
            inflight = self._inflight
            inflight.popleft()
            rest = list(inflight)
            inflight.clear()
            for inf in rest:
                await self._until_done(inf.future)
            requeue: list[Entry] = []
            for inf in rest:
                if failure(inf.future, inf.size) is None:  # cannot happen (see submit_append)
                    log.error("emitter: a batch queued after a failed one was committed")
                    self._finish(inf, inf.future.result())
                else:
                    requeue.extend(inf.entries)
            self._pending.extendleft(reversed(requeue))
            try:
                await self._commit(*materialise(head.entries), error)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("emitter: unexpected error committing %d events", head.size)
            self._advance(head.units)
        finally:
            self._slow = False

    @staticmethod
    async def _until_done(future: ConcurrentFuture[list[int]]) -> None:
        """Wait for a store future by polling, not by a callback from the store thread: that
        callback would wake the loop through its self-pipe, and the store thread, having let
        go of the GIL for it, could then wait a whole switch interval (5 ms) to get it back
        behind a busy loop before starting its next batch. Producers usually see the result
        first anyway (`_pump`)."""
        delay = 0.0002
        while not future.done():
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX)

    def _pump(self) -> None:
        """Advance the submit path synchronously: finish the batches the store has committed,
        keep the store fed. Failures are left to the writer task."""
        if self._submitter is None or self._slow or self._closed:
            return
        inflight = self._inflight
        done: list[InFlight] = []
        while inflight and inflight[0].future.done():
            head = inflight[0]
            if failure(head.future, head.size) is not None:
                break  # the writer task recovers; queue nothing behind a failed batch
            done.append(inflight.popleft())
        else:
            self._fill()  # hand the store the next batches first, then publish committed ones
        for inf in done:
            self._finish(inf, inf.future.result())

    def _fill(self) -> None:
        while (
            len(self._inflight) < _PIPELINE_DEPTH
            and self._pending
            and not self._slow
            and not self._closed
            and self._submit_next()
        ):
            pass

    def _submit_next(self) -> bool:
        """Hand the next batch to the store's submit path, if it has one right now."""
        submit = self._submitter() if self._submitter is not None else None
        if submit is None or len(self._inflight) >= _PIPELINE_DEPTH:
            return False
        after = self._inflight[-1].future if self._inflight else None
        entries, n, units = take(self._pending, self.max_batch)
        try:
            future = submit(entries, after)
        except Exception as e:  # e.g. the store is closed: the writer task reports the loss
            future = ConcurrentFuture()
            future.set_exception(e)
        self._inflight.append(InFlight(entries, n, units, future))
        self._wakeup.set()  # the writer task watches the in-flight batches
        return True

    def _finish(self, inf: InFlight, ordinals: list[int]) -> None:
        """A batch is durable: count it, publish it (in order, with its ordinals). Never
        raises (it also runs inside producers' `emit` calls): a failing bus is logged."""
        try:
            self._publish(inf, ordinals)
        except Exception:
            log.exception("emitter: publishing %d committed events failed", inf.size)
        finally:
            self._advance(inf.units)

    def _publish(self, inf: InFlight, ordinals: list[int]) -> None:
        self.metrics.inc(EVENTS_APPENDED, inf.size)
        publish = self.bus.publish
        # A bus that can tell nobody would get a stream's events (no watcher: the usual case
        # while ingesting) spares building them: the models are only ever built to publish.
        wants = getattr(self.bus, "wants", None)
        i = 0
        for e in inf.entries:
            if type(e) is EventRun:
                if wants is not None and not wants(e.stream_key):
                    i += len(e)
                    continue
                # One model at a time: a materialised run would hold thousands of live objects
                # (each batch would then push its events through the GC generations).
                for ev in e.iter_events():
                    publish(BusItem(ordinals[i], ev))
                    i += 1
            elif type(e) is not CursorMark:
                publish(BusItem(ordinals[i], e))  # type: ignore[arg-type]
                i += 1

    def _advance(self, n: int) -> None:
        self._done += n
        if self._enqueued - self._done < self.max_pending:
            self._room.set()
        while self._flush_waiters and self._flush_waiters[0][0] <= self._done:
            _, fut = self._flush_waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    async def _commit(
        self,
        batch: list[FleetEvent],
        cursors: dict[str, bytes],
        failed: BaseException | None = None,
    ) -> None:
        """Append and publish one batch, and write its cursors in the same transaction,
        handling conflicts and failures. `failed`: the error of an attempt already made (the
        submit path), handled as if this call had got it."""
        if not batch and not cursors:
            return
        attempt = 0
        while True:
            try:
                if failed is not None:
                    error, failed = failed, None
                    raise error
                if cursors:
                    ordinals = await self.store.append_batch(batch, cursors=cursors)
                else:
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
        for i, entry in enumerate(self._pending):
            if type(entry) is CursorMark:
                continue
            key = entry.stream_key  # type: ignore[union-attr]
            if key not in moved:
                continue
            if type(entry) is EventRun:
                self._pending[i] = entry.renumbered(moved[key])
                moved[key] += len(entry)
            else:
                self._pending[i] = renumber(entry)  # type: ignore[arg-type]
        for key, nxt in moved.items():
            self._next[key] = max(self._next.get(key, 0), nxt)
        return batch

    def _persist_failed(self, batch: list[FleetEvent], detail: str) -> None:
        """Publish the unpersisted events anyway and mark the loss on each affected stream.
        (The batch's cursors are not written: a restart re-reads what they covered.)"""
        self.metrics.inc(APPEND_FAILURES, len(batch))
        log.error("emitter: %d events (and their cursors) not persisted: %s", len(batch), detail)
        lost: dict[str, tuple[FleetEvent, int, int]] = {}
        publish = self.bus.publish
        for ev in batch:
            publish(BusItem(None, encodable(ev)))
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
