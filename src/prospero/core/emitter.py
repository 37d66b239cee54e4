"""The single writer of fleet events: sequencing, group commit, durable-first publish.

`emit()` stamps the event (ts, per-stream seq) and queues it; `emit_many()` does the same for
a driver's whole read of a stream at once (one ts, consecutive seqs), queued as one compact
`EventRun` whose `FleetEvent` models are only built to be published. Batches of everything
queued (up to `max_batch` events) are appended to the store atomically, and only then is each
event published to the bus with its ordinal. Because publish happens after commit, a
subscriber that subscribes *before* reading history never misses an event (prospero-surface.md
§1.5): anything published after it subscribed reaches it live, anything before is in the store.

Committing (`core.emitter_commit`): with a store that can append on the loop's own thread when
its write lock is free (`inline_appender`, the SQLite store), everything queued during a loop
turn is committed at the start of the next one (`_inline_flush`, when at most _INLINE_MAX
events are queued) and published at once: no thread hand-off between an event and its watchers.
A larger backlog (a catch-up, where throughput matters more) or a batch the store refuses (its
write lock is held elsewhere) goes to the submit path instead: producers hand batches to the store's writer thread (`batch_submitter`)
and finish (publish) committed ones as they emit; two batches are in flight, the second queued
`after` the first (it writes nothing unless the first succeeded), and the inline path resumes
once they have drained, so commit order is emit order. The background task covers quiet
periods, failures (`_recover`: later batches are requeued in order, then the failed one takes
the slow path below) and stores without either path, which it drives one `append_batch` at a
time.

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

Fencing (clustered replicas): given an `ownership` (`core.ownership.FencingOwnership`) and a
store with `fenced_appends` (PostgreSQL), each batch is appended with the fences of the leases
its events are written under (`lease_key_for`: the agent's, `repo:<workspace>` for lifecycle
kinds, none for the unfenced ones; a cursor goes under its agent's). The store refuses the
batch (`FenceLost`, nothing written) when one of them is no longer this replica's, with the
same epoch: the emitter then drops the events and cursors of the lost keys — another replica
writes those now: they are not published, get no loss marker, and are counted as
`events_fenced` — and appends the rest at once. Without an ownership, or on a store without
the capability (SQLite), nothing of this runs.

Memory is bounded: once `max_pending` events are emitted but not yet committed, `emit` waits
for the writer (back-pressure on a slow store) instead of queueing without limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import cast

from prospero.core.bus import Bus
from prospero.core.emitter_commit import CommitPath
from prospero.core.emitter_queue import (
    Entry,
    InFlight,
    InlineAppend,
    Submit,
    expand_any,
)
from prospero.core.errors import StoreError
from prospero.core.event_metrics import EventCounter, PublishClock
from prospero.core.metrics import Metrics
from prospero.core.ownership import FencingOwnership
from prospero.core.store.base import CursorMark, EventStore, PipelinedAppends
from prospero.types.events import (
    EVENT_KIND_TYPES,
    CompactKind,
    EventKind,
    EventRun,
    FleetEvent,
    Output,
    compact_kind,
    now_ts,
    stream_key_for,
)

log = logging.getLogger(__name__)


_OUTPUT_STREAMS = frozenset({"stdout", "thinking"})


class Emitter(CommitPath):
    def __init__(
        self,
        store: EventStore,
        bus: Bus,
        metrics: Metrics | None = None,
        *,
        max_batch: int = 4096,
        max_pending: int = 100_000,
        max_conflict_retries: int = 8,
        ownership: FencingOwnership | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.store = store
        self.bus = bus
        self.metrics = metrics if metrics is not None else Metrics()
        # What is published is counted (by workspace and kind, usage by model) and timed from
        # each emit call to its publish (`core.event_metrics`).
        self._counter = EventCounter(self.metrics)
        self._clock = PublishClock(self._counter)
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
        # Stores that take a batch synchronously (`pipelined_appends`: `batch_submitter`) let a
        # producer hand the next batch over, and finish committed ones, without waiting for a turn of the writer
        # task (which, behind many busy drivers, can come late): the store keeps committing
        # while the drivers work. Up to _PIPELINE_DEPTH batches are in flight, each queued
        # `after` the previous one; failures go to the writer task (`_recover`).
        caps = store.capabilities
        pipelined = cast(PipelinedAppends, store) if caps.pipelined_appends else None
        self._submitter: Callable[[], Submit | None] | None = (
            pipelined.batch_submitter if pipelined is not None else None
        )
        # Stores that can also append right here on the loop's thread when their write lock is
        # free (`inline_appends`: the SQLite store) get the live path's batches that way: one
        # group commit per loop turn (`_schedule_inline`), no thread hand-off (see
        # `store.sqlite.inline`). A batch they refuse (lock held), or a large one, goes to the
        # submit path, which then keeps the order until it has drained.
        self._inline: Callable[[], InlineAppend | None] | None = (
            pipelined.inline_appender if pipelined is not None and caps.inline_appends else None
        )
        self._inline_scheduled = False
        self._direct = False  # the writer task is committing a batch itself (`_commit`)
        # Batches handed to the store, oldest first (each queued `after` the previous one).
        self._inflight: deque[InFlight] = deque()
        self._slow = False  # the writer task is handling a failed commit: submit nothing
        self._closing = False
        self._closed = False
        # Clustered: every append carries the fences of the leases it is written under, checked
        # by the store in its transaction (`fenced_appends`; `_commit_fenced`). A store without
        # that capability has one writer: no fences, the paths above unchanged.
        self.ownership = ownership
        self._fencing: FencingOwnership | None = (
            ownership if ownership is not None and caps.fenced_appends else None
        )
        self._fence_warned: set[str] = set()  # lost keys already logged (once each)

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
        self._clock.stamp(self._enqueued + 1, repo, 1)
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
        self._clock.stamp(self._enqueued, repo, n)
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
