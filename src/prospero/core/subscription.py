"""Replay-then-tail readers over the store and the bus (prospero-surface.md §1.5).

`follow_stream` serves one stream (the SSE endpoint): it subscribes to the bus *first*,
replays stored events with `seq >= from_seq`, then tails live ones, deduplicating the join on
seq with a high-water mark seeded at `from_seq - 1`. A live event that skips ahead makes it
re-read the missing range from the store; a bus `Lagged` makes it yield a
`GapSignal(skipped, last_seq)` and then replay everything after `last_seq` from the store, so a
slow consumer still sees every stored event exactly once. It ends after `agent_finished`
(history or live) when `close_on_finish`, or when the bus ends.

`follow_fleet` does the same for every stream by store ordinal (the fleet feed's resume
cursor). Events the store could not persist (ordinal None) have no place in that order and are
not yielded by it; the per-stream follower does yield them.

Events leave as JSON bytes, never as models: history as the store's `RawEvent`s
(`replay_raw` / `replay_fleet_raw`, a page per read), live events as the bus item's JSON
(`BusItem.json`, encoded once for every follower), and both as a `RawPage`: one page per store
read, one per burst of live events taken from the bus in one wake-up (`batch()`). The cursor of
an event is its seq on a stream and its store ordinal on the fleet feed.

Memory per consumer is bounded: history is read in pages of `page` events and the bus queue
is bounded by the bus buffer (a live page holds at most what that queue held).

Both return an async iterator that has already subscribed when the call returns; close it with
`aclose()` (or `async with`) when abandoning it early. `interrupt()` makes a follower that is
waiting for live events yield `IDLE` (nothing happened): a consumer's timer can wake it
without a timeout around every wait.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Generic, TypeVar

from prospero.core.bus import Bus, BusSubscription, Lagged
from prospero.core.store.base import EventStore, RawEvent
from prospero.types.events import TERMINAL_EVENT_KINDS

T = TypeVar("T")

# Events per `RawPage` read from the store: a page is one read, one encode and (mostly) one
# socket write.
RAW_PAGE = 2048


@dataclass(frozen=True, slots=True)
class GapSignal:
    """The consumer lagged and `skipped` live events were dropped after `last_seq`; the
    follower replays them from the store right after this signal."""

    skipped: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class RawPage:
    """Events as JSON bytes, ascending by cursor (seq on a stream, ordinal on the fleet feed);
    never empty. `published`: for a page of live events, when the oldest of them was
    published on the bus (`BusItem.published`; 0.0 for history), so a consumer can time its
    delivery."""

    events: list[RawEvent]
    published: float = 0.0


class Idle:
    """What an interrupted follower yields: it was waiting for live events, none came."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "IDLE"


IDLE: Final = Idle()

StreamItem = RawPage | GapSignal | Idle
FleetItem = RawPage | Idle


class Follower(Generic[T]):
    """An async iterator bound to a bus subscription taken at construction time."""

    def __init__(self, sub: BusSubscription, gen: AsyncGenerator[T, None]) -> None:
        self._sub = sub
        self._gen = gen

    def __aiter__(self) -> Follower[T]:
        return self

    async def __anext__(self) -> T:
        return await self._gen.__anext__()

    def interrupt(self) -> None:
        """Wake the follower if it is waiting for live events: it yields `IDLE` (once)."""
        self._sub.interrupt()

    async def aclose(self) -> None:
        """Unsubscribe and end the iterator. Safe to call from another task while a consumer
        is waiting in `__anext__`: that consumer then sees the end of the stream."""
        self._sub.close()
        try:
            await self._gen.aclose()
        except RuntimeError:
            pass  # being iterated right now: it ends on the closed subscription by itself

    def __del__(self) -> None:
        # Safety net for an abandoned follower: stop the bus from queueing for it.
        self._sub.close()

    async def __aenter__(self) -> Follower[T]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def _pages(
    read: Callable[[int, int], Awaitable[list[RawEvent]]],
    after: int,
    below: int | None,
    page: int,
) -> AsyncIterator[RawPage]:
    """Stored events with after < cursor (< below), ascending, one `RawPage` per `read(after,
    limit)` (which returns up to `limit` events with a cursor above `after`)."""
    while True:
        limit = page if below is None else min(page, below - after - 1)
        if limit <= 0:
            return
        batch = await read(after, limit)
        full = len(batch) >= limit
        if below is not None and batch and batch[-1].cursor >= below:
            batch = [r for r in batch if r.cursor < below]
            full = False
        if batch:
            yield RawPage(batch)
        if not full:
            return
        after = batch[-1].cursor


def _stream_pages(
    store: EventStore, stream_key: str, from_seq: int, below: int | None, page: int
) -> AsyncIterator[RawPage]:
    """Stored events of one stream with from_seq <= seq (< below): a stream's cursor is its
    seq."""
    return _pages(lambda a, n: store.replay_raw(stream_key, a + 1, n), from_seq - 1, below, page)


def _fleet_pages(
    store: EventStore, after: int, below: int | None, page: int
) -> AsyncIterator[RawPage]:
    """Stored events of every stream with after < ordinal (< below)."""
    return _pages(store.replay_fleet_raw, after, below, page)


def _upto_terminal(pg: RawPage) -> RawPage | None:
    """The page cut after its first terminal event (None when it has none)."""
    for i, r in enumerate(pg.events):
        if r.kind in TERMINAL_EVENT_KINDS:
            return RawPage(pg.events[: i + 1])
    return None


def follow_stream(
    store: EventStore,
    bus: Bus,
    stream_key: str,
    from_seq: int = 0,
    *,
    close_on_finish: bool = True,
    page: int | None = None,
) -> Follower[StreamItem]:
    sub = bus.subscribe(stream_key)
    size = RAW_PAGE if page is None else page

    async def run() -> AsyncGenerator[StreamItem, None]:
        # Seqs start at 1, so from_seq 0 and 1 mean the same: everything.
        last = max(from_seq, 1) - 1
        ended = False

        async def history(below: int | None) -> AsyncIterator[RawPage]:
            """Stored events after `last` (below `below`), cut at the end of the stream."""
            nonlocal last, ended
            async for pg in _stream_pages(store, stream_key, last + 1, below, size):
                cut = _upto_terminal(pg) if close_on_finish else None
                if cut is not None:
                    pg, ended = cut, True
                last = pg.events[-1].seq
                yield pg
                if ended:
                    return

        try:
            async for pg in history(None):
                yield pg
            if ended:
                return
            while True:
                try:
                    items = await sub.batch()
                except StopAsyncIteration:
                    return
                if not items:
                    yield IDLE
                    continue
                live: list[RawEvent] = []
                first = 0.0  # when the oldest event of `live` was published
                for item in items:
                    if isinstance(item, Lagged):
                        if live:
                            yield RawPage(live, first)
                            live = []
                        yield GapSignal(skipped=item.skipped, last_seq=last)
                        async for pg in history(None):
                            yield pg
                        if ended:
                            return
                        continue
                    ev = item.event
                    seq = ev.seq
                    if seq <= last:
                        continue  # already delivered (history/live overlap)
                    if seq > last + 1:
                        # Missed a stretch (e.g. written by another process): read it back.
                        if live:
                            yield RawPage(live, first)
                            live = []
                        async for pg in history(seq):
                            yield pg
                        if ended:
                            return
                    last = seq
                    tag = ev.kind.kind
                    if not live:
                        first = item.published
                    live.append(RawEvent(seq, seq, tag, item.json))
                    if close_on_finish and tag in TERMINAL_EVENT_KINDS:
                        yield RawPage(live, first)
                        return
                if live:
                    yield RawPage(live, first)
        finally:
            sub.close()

    return Follower(sub, run())


def follow_fleet(
    store: EventStore,
    bus: Bus,
    after_ordinal: int = 0,
    *,
    page: int | None = None,
) -> Follower[FleetItem]:
    sub = bus.subscribe(None)
    size = RAW_PAGE if page is None else page

    async def run() -> AsyncGenerator[FleetItem, None]:
        last = max(after_ordinal, 0)
        try:
            async for pg in _fleet_pages(store, last, None, size):
                last = pg.events[-1].cursor
                yield pg
            while True:
                try:
                    items = await sub.batch()
                except StopAsyncIteration:
                    return
                if not items:
                    yield IDLE
                    continue
                live: list[RawEvent] = []
                first = 0.0  # when the oldest event of `live` was published
                for item in items:
                    if isinstance(item, Lagged):
                        if live:
                            yield RawPage(live, first)
                            live = []
                        async for pg in _fleet_pages(store, last, None, size):
                            last = pg.events[-1].cursor
                            yield pg
                        continue
                    ordinal = item.ordinal
                    if ordinal is None or ordinal <= last:
                        continue  # not persisted / already delivered
                    if ordinal > last + 1:
                        # Ordinals are contiguous in commit order: anything between was
                        # committed (by another writer, or is about to be published): read it.
                        if live:
                            yield RawPage(live, first)
                            live = []
                        async for pg in _fleet_pages(store, last, ordinal, size):
                            last = pg.events[-1].cursor
                            yield pg
                    last = ordinal
                    ev = item.event
                    if not live:
                        first = item.published
                    live.append(RawEvent(ordinal, ev.seq, ev.kind.kind, item.json))
                if live:
                    yield RawPage(live, first)
        finally:
            sub.close()

    return Follower(sub, run())
