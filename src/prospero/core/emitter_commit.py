"""The emitter's commit path (mixed into `core.emitter.Emitter`, see its module doc): the
writer task, the submit pipeline to the store's writer thread, the inline path on the loop's
own thread, publishing committed batches, the slow path for failed appends (seq-conflict
re-seeding, loss markers) and fenced commits (`_commit_fenced`: writes under leases, dropping
what a lost lease covered)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future as ConcurrentFuture

from prospero.core.bus import Bus, BusItem
from prospero.core.emitter_queue import (
    Entry,
    InFlight,
    InlineAppend,
    Submit,
    encodable,
    failure,
    materialise,
    take,
)
from prospero.core.errors import FenceLost, SeqConflict, StoreError
from prospero.core.event_metrics import EventCounter, PublishClock
from prospero.core.metrics import APPEND_FAILURES, EVENTS_FENCED, Metrics
from prospero.core.ownership import FencingOwnership, lease_key_for
from prospero.core.store.base import CursorMark, EventStore
from prospero.types.events import EventRun, FleetEvent, StorePersistFailed, now_ts

log = logging.getLogger("prospero.core.emitter")

# Batches handed to a submitting store at once: the next one is queued while one commits, so
# the store thread goes straight from one to the next.
_PIPELINE_DEPTH = 2
# The inline path (`_inline_flush`) takes what is queued when it is at most this many events
# (a few milliseconds of the loop's time), in one commit per loop turn. A larger backlog (a
# catch-up: replays, many agents at once) goes to the writer thread, whose big pipelined batches
# overlap the loop's own work: throughput then matters more than a millisecond of latency.
_INLINE_MAX = 512
# Longest pause between two looks at an in-flight batch (see `_until_done`).
_POLL_MAX = 0.002


class CommitPath:
    """The commit half of `Emitter` (a mixin: the emitter owns the state)."""

    store: EventStore
    bus: Bus
    metrics: Metrics
    _counter: EventCounter
    _clock: PublishClock
    max_batch: int
    max_pending: int
    max_conflict_retries: int
    _next: dict[str, int]
    _pending: deque[Entry]
    _wakeup: asyncio.Event
    _room: asyncio.Event
    _enqueued: int
    _done: int
    _flush_waiters: deque[tuple[int, asyncio.Future[None]]]
    _submitter: Callable[[], Submit | None] | None
    _inline: Callable[[], InlineAppend | None] | None
    _inline_scheduled: bool
    _direct: bool
    _inflight: deque[InFlight]
    _slow: bool
    _closed: bool
    _fencing: FencingOwnership | None
    _fence_warned: set[str]

    def _enqueue(self, ev: FleetEvent) -> None:
        raise NotImplementedError

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
            if self._inline_scheduled:  # the loop's next turn commits them (`_inline_flush`)
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            entries, n, units = take(self._pending, self.max_batch)
            self._direct = True
            try:
                await self._commit(*materialise(entries))
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the writer die; _commit already handles store errors
                log.exception("emitter: unexpected error committing %d events", n)
            finally:
                self._direct = False
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
        if self._inline_scheduled:
            return
        if (
            self._inline is not None
            and not self._inflight
            and self._pending
            and not self._slow
            and not self._closed
            and not self._direct
            and self._enqueued - self._done <= _INLINE_MAX
            and self._inline() is not None
        ):
            self._schedule_inline()
            return
        self._fill_submit()

    def _fill_submit(self) -> None:
        while (
            len(self._inflight) < _PIPELINE_DEPTH
            and self._pending
            and not self._slow
            and not self._closed
            and self._submit_next()
        ):
            pass

    def _schedule_inline(self) -> None:
        if not self._inline_scheduled:
            self._inline_scheduled = True
            asyncio.get_running_loop().call_soon(self._inline_flush)

    def _inline_flush(self) -> None:
        """Commit everything queued, here on the loop's thread, when it is at most _INLINE_MAX
        events and marks and nothing is in flight on the submit path; a larger backlog, or a
        batch the store refuses (its write lock is held), goes to the submit path."""
        self._inline_scheduled = False
        if (
            not self._pending
            or self._inflight
            or self._slow
            or self._closed
            or self._direct
            or self._inline is None
        ):
            return
        append = self._inline() if self._enqueued - self._done <= _INLINE_MAX else None
        if append is None:  # no inline path now, or a backlog: the writer thread
            self._fill_submit()
            return
        entries, n, units = take(self._pending, _INLINE_MAX)
        if n > _INLINE_MAX:  # one run too large for a loop turn (it travels with its cursor)
            self._pending.extendleft(reversed(entries))
            self._fill_submit()
            return
        try:
            ordinals = append(entries)
        except Exception as e:  # the writer task handles it (`_recover`), in order
            failed: ConcurrentFuture[list[int]] = ConcurrentFuture()
            failed.set_exception(e)
            self._inflight.append(InFlight(entries, n, units, failed))
            self._wakeup.set()
            return
        if ordinals is None:  # the write lock is held: nothing written
            self._pending.extendleft(reversed(entries))
            self._fill_submit()
            return
        if len(ordinals) != n:
            failed = ConcurrentFuture()
            failed.set_exception(
                StoreError(f"store returned {len(ordinals)} ordinals for {n} events")
            )
            self._inflight.append(InFlight(entries, n, units, failed))
            self._wakeup.set()
            return
        self._finish_inline(entries, n, units, ordinals)
        if self._pending:
            self._schedule_inline()

    def _finish_inline(self, entries: list[Entry], n: int, units: int, ordinals: list[int]) -> None:
        done: ConcurrentFuture[list[int]] = ConcurrentFuture()
        done.set_result(ordinals)
        self._finish(InFlight(entries, n, units, done), ordinals)

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
        self._counter.count(inf.entries)
        publish = self.bus.publish
        now = time.monotonic()  # the publish time of the batch (SSE delivery is timed from it)
        # A bus that can tell nobody would get a stream's events (no watcher: the usual case
        # while ingesting) spares building them: the models are only ever built to publish.
        wants = self.bus.wants
        i = 0
        for e in inf.entries:
            if type(e) is EventRun:
                if not wants(e.stream_key):
                    i += len(e)
                    continue
                # One model at a time: a materialised run would hold thousands of live objects
                # (each batch would then push its events through the GC generations).
                for ev in e.iter_events():
                    publish(BusItem(ordinals[i], ev, now))
                    i += 1
            elif type(e) is not CursorMark:
                publish(BusItem(ordinals[i], e, now))  # type: ignore[arg-type]
                i += 1

    def _advance(self, n: int) -> None:
        self._done += n
        self._clock.done(self._done)
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
        if self._fencing is not None:
            await self._commit_fenced(self._fencing, batch, cursors, failed)
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
            self._counter.count(batch)
            publish = self.bus.publish
            now = time.monotonic()
            for ordinal, ev in zip(ordinals, batch, strict=True):
                publish(BusItem(ordinal, ev, now))
            return

    async def _commit_fenced(
        self,
        fencing: FencingOwnership,
        batch: list[FleetEvent],
        cursors: dict[str, bytes],
        failed: BaseException | None,
    ) -> None:
        """`_commit` under leases (a store with `fenced_appends`, an emitter given an
        `ownership`): each event goes with the fence of its lease (`lease_key_for`; unfenced
        kinds with none), each cursor with its agent's. On `FenceLost` the events and cursors of
        the lost keys are dropped — another replica owns them now: not published, no loss
        marker, counted as `events_fenced` — and the rest is retried at once. A key we hold no
        lease on at all (epoch 0) is dropped without asking the store."""
        keys = [lease_key_for(ev.repo, ev.agent_id, ev.kind.kind) for ev in batch]
        attempt = 0
        while True:
            if not batch and not cursors:
                return
            wanted = {k for k in keys if k is not None}
            wanted.update(cursor_lease_key(k) for k in cursors)
            fences = [fencing.fence(k) for k in sorted(wanted)]
            try:
                if failed is not None:
                    error, failed = failed, None
                    raise error
                unheld = [f.key for f in fences if f.epoch <= 0]
                if unheld:
                    raise FenceLost(unheld)
                ordinals = await self.store.append_batch(
                    batch, cursors=cursors or None, fences=fences or None
                )
            except FenceLost as e:
                lost = set(e.keys)
                before = len(batch) + len(cursors)
                batch, keys, cursors = self._drop_fenced(lost, batch, keys, cursors)
                if len(batch) + len(cursors) == before:  # (a store naming keys we did not send)
                    self._persist_failed(batch, f"fence lost on keys not in the batch: {e}")
                    return
                continue
            except SeqConflict as e:
                attempt += 1
                if attempt > self.max_conflict_retries:
                    self._persist_failed(batch, f"seq conflict not resolved: {e}")
                    return
                log.info("emitter: seq conflict (attempt %d), re-seeding: %s", attempt, e)
                await asyncio.sleep(random.uniform(0, min(0.05, 0.001 * 2**attempt)))
                try:
                    batch = await self._reseed(batch)  # (same events, same order: keys hold)
                except Exception as e2:
                    self._persist_failed(batch, f"re-seed after seq conflict failed: {e2}")
                    return
                continue
            except Exception as e:
                self._persist_failed(batch, str(e) or type(e).__name__)
                return
            if self._fence_warned:
                self._fence_warned.difference_update(f.key for f in fences)
            self._counter.count(batch)
            publish = self.bus.publish
            now = time.monotonic()
            for ordinal, ev in zip(ordinals, batch, strict=True):
                publish(BusItem(ordinal, ev, now))
            return

    def _drop_fenced(
        self,
        lost: set[str],
        batch: list[FleetEvent],
        keys: list[str | None],
        cursors: dict[str, bytes],
    ) -> tuple[list[FleetEvent], list[str | None], dict[str, bytes]]:
        """The batch without the events and cursors written under the `lost` leases. A stream
        that lost events is renumbered to stay gapless: what is left of it in the batch, then
        its still-queued events, continue from the first dropped seq; with nothing of it left,
        its counter is forgotten (its next event continues from the store's high water: the
        new owner's)."""
        kept: list[FleetEvent] = []
        kept_keys: list[str | None] = []
        start: dict[str, int] = {}  # stream -> the seq its kept events continue from
        for ev, k in zip(batch, keys, strict=True):
            if k is not None and k in lost:
                start.setdefault(ev.stream_key, ev.seq)
            else:
                kept.append(ev)
                kept_keys.append(k)
        kept_cursors = {c: d for c, d in cursors.items() if cursor_lease_key(c) not in lost}
        dropped = len(batch) - len(kept)
        if dropped:
            self.metrics.inc(EVENTS_FENCED, dropped)
        for key in sorted(lost - self._fence_warned):
            self._fence_warned.add(key)
            log.warning(
                "emitter: lease %s is no longer ours: dropping what was written under it "
                "(%d events in this batch, %d cursors); the new owner writes it",
                key,
                sum(1 for k in keys if k == key),
                sum(1 for c in cursors if cursor_lease_key(c) == key),
            )
        if start:
            left: set[str] = set()
            for i, ev in enumerate(kept):
                nxt = start.get(ev.stream_key)
                if nxt is None:
                    continue
                left.add(ev.stream_key)
                if ev.seq < nxt:  # (kept events before the first dropped one)
                    continue
                start[ev.stream_key] = nxt + 1
                if ev.seq != nxt:
                    kept[i] = ev.model_copy(update={"seq": nxt})
            for i, entry in enumerate(self._pending):
                if type(entry) is CursorMark:
                    continue
                key = entry.stream_key  # type: ignore[union-attr]
                nxt = start.get(key)
                if nxt is None:
                    continue
                left.add(key)
                if type(entry) is EventRun:
                    self._pending[i] = entry.renumbered(nxt)
                    start[key] = nxt + len(entry)
                else:
                    self._pending[i] = entry.model_copy(update={"seq": nxt})  # type: ignore[union-attr]
                    start[key] = nxt + 1
            for key, nxt in start.items():
                if key in left:
                    self._next[key] = nxt
                else:
                    self._next.pop(key, None)
        return kept, kept_keys, kept_cursors

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
        now = time.monotonic()
        for ev in batch:
            publish(BusItem(None, encodable(ev), now))
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


def cursor_lease_key(key: str) -> str:
    """The lease a cursor row is written under: its agent's (the key is the agent id, or the
    agent id and a `#` suffix for a driver's extra rows, e.g. the ndjson base row)."""
    return key.partition("#")[0]
