"""Replay-then-tail readers over the store and the bus (prospero-surface.md §1.5).

`follow_stream` serves one stream (the SSE endpoint, `prospero follow`): it subscribes to the
bus *first*, replays stored events with `seq >= from_seq`, then tails live ones, deduplicating
the join on seq with a high-water mark seeded at `from_seq - 1`. A live event that skips ahead
makes it re-read the missing range from the store; a bus `Lagged` makes it yield a
`GapSignal(skipped, last_seq)` and then replay everything after `last_seq` from the store, so a
slow consumer still sees every stored event exactly once. It ends after `agent_finished`
(history or live) when `close_on_finish`, or when the bus ends.

`follow_fleet` does the same for every stream by store ordinal (the fleet feed's resume
cursor). Events the store could not persist (ordinal None) have no place in that order and are
not yielded by it; the per-stream follower does yield them.

Memory per consumer is bounded: history is read in pages of `page` events and the bus queue
is bounded by the bus buffer.

`raw=True` (the SSE endpoints): history leaves the store as JSON bytes (`replay_raw` /
`replay_fleet_raw`) and is yielded a page at a time as one `RawPage`, never decoded into
models; live events are yielded as before. Same events, same order, same gap/resume semantics.

Both return an async iterator that has already subscribed when the call returns; close it with
`aclose()` (or `async with`) when abandoning it early.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, TypeVar

from prospero.core.bus import Bus, BusItem, BusSubscription, Lagged
from prospero.core.store.base import EventStore, RawEvent, StoredEvent
from prospero.types.events import TERMINAL_EVENT_KINDS, FleetEvent

T = TypeVar("T")

DEFAULT_PAGE = 256
# Events per `RawPage`: a page is one read, one encode and (mostly) one socket write.
RAW_PAGE = 2048


@dataclass(frozen=True, slots=True)
class GapSignal:
    """The consumer lagged and `skipped` live events were dropped after `last_seq`; the
    follower replays them from the store right after this signal."""

    skipped: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class RawPage:
    """Stored events as JSON bytes, ascending (cursor: seq on a stream, ordinal on the fleet
    feed); never empty."""

    events: list[RawEvent]


class Follower(Generic[T]):
    """An async iterator bound to a bus subscription taken at construction time."""

    def __init__(self, sub: BusSubscription, gen: AsyncGenerator[T, None]) -> None:
        self._sub = sub
        self._gen = gen

    def __aiter__(self) -> Follower[T]:
        return self

    async def __anext__(self) -> T:
        return await self._gen.__anext__()

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


def _is_terminal(ev: FleetEvent) -> bool:
    return ev.kind.kind in TERMINAL_EVENT_KINDS


async def _stream_pages(
    store: EventStore, stream_key: str, from_seq: int, below: int | None, page: int
) -> AsyncIterator[FleetEvent]:
    """Stored events of one stream with from_seq <= seq (< below), ascending, page by page."""
    nxt = from_seq
    while True:
        limit = page if below is None else min(page, below - nxt)
        if limit <= 0:
            return
        batch = await store.replay(stream_key, nxt, limit)
        for ev in batch:
            if below is not None and ev.seq >= below:
                return
            yield ev
        if len(batch) < limit:
            return
        nxt = batch[-1].seq + 1


async def _raw_stream_pages(
    store: EventStore, stream_key: str, from_seq: int, below: int | None, page: int
) -> AsyncIterator[RawPage]:
    """`_stream_pages` as JSON bytes, one `RawPage` per read."""
    nxt = from_seq
    while True:
        limit = page if below is None else min(page, below - nxt)
        if limit <= 0:
            return
        batch = await store.replay_raw(stream_key, nxt, limit)
        full = len(batch) >= limit
        if below is not None and batch and batch[-1].seq >= below:
            batch = [r for r in batch if r.seq < below]
            full = False
        if batch:
            yield RawPage(batch)
        if not full:
            return
        nxt = batch[-1].seq + 1


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
    page: int = DEFAULT_PAGE,
    raw: bool = False,
) -> Follower[FleetEvent | GapSignal | RawPage]:
    sub = bus.subscribe(stream_key)
    if raw and page == DEFAULT_PAGE:
        page = RAW_PAGE

    async def history(start: int, below: int | None) -> AsyncIterator[FleetEvent | RawPage]:
        if raw:
            async for pg in _raw_stream_pages(store, stream_key, start, below, page):
                yield pg
        else:
            async for ev in _stream_pages(store, stream_key, start, below, page):
                yield ev

    async def run() -> AsyncGenerator[FleetEvent | GapSignal | RawPage, None]:
        # Seqs start at 1, so from_seq 0 and 1 mean the same: everything.
        last = max(from_seq, 1) - 1

        def seen(x: FleetEvent | RawPage) -> tuple[FleetEvent | RawPage, bool]:
            """`x`, cut at the end of the stream, and whether it ends the stream."""
            nonlocal last
            if type(x) is RawPage:
                cut = _upto_terminal(x) if close_on_finish else None
                out = x if cut is None else cut
                last = out.events[-1].seq
                return out, cut is not None
            assert isinstance(x, FleetEvent)
            last = x.seq
            return x, close_on_finish and _is_terminal(x)

        try:
            async for x in history(last + 1, None):
                x, end = seen(x)
                yield x
                if end:
                    return
            async for item in sub:
                if isinstance(item, Lagged):
                    yield GapSignal(skipped=item.skipped, last_seq=last)
                    async for x in history(last + 1, None):
                        x, end = seen(x)
                        yield x
                        if end:
                            return
                    continue
                live = item.event
                if live.seq <= last:
                    continue  # already delivered (history/live overlap)
                if live.seq > last + 1:
                    # Missed a stretch (e.g. written by another process): read it back.
                    async for x in history(last + 1, live.seq):
                        x, end = seen(x)
                        yield x
                        if end:
                            return
                last = live.seq
                yield live
                if close_on_finish and _is_terminal(live):
                    return
        finally:
            sub.close()

    return Follower(sub, run())


def follow_fleet(
    store: EventStore,
    bus: Bus,
    after_ordinal: int = 0,
    *,
    page: int = DEFAULT_PAGE,
    raw: bool = False,
) -> Follower[StoredEvent | RawPage]:
    sub = bus.subscribe(None)
    if raw and page == DEFAULT_PAGE:
        page = RAW_PAGE

    async def raw_catch_up(after: int, below: int | None) -> AsyncIterator[RawPage]:
        nxt = after
        while True:
            limit = page if below is None else min(page, below - nxt - 1)
            if limit <= 0:
                return
            batch = await store.replay_fleet_raw(nxt, limit)
            full = len(batch) >= limit
            if below is not None and batch and batch[-1].cursor >= below:
                batch = [r for r in batch if r.cursor < below]
                full = False
            if batch:
                yield RawPage(batch)
            if not full:
                return
            nxt = batch[-1].cursor

    async def catch_up(after: int, below: int | None) -> AsyncIterator[StoredEvent]:
        nxt = after
        while True:
            limit = page if below is None else min(page, below - nxt - 1)
            if limit <= 0:
                return
            batch = await store.replay_fleet(nxt, limit)
            for se in batch:
                if below is not None and se.ordinal >= below:
                    return
                yield se
            if len(batch) < limit:
                return
            nxt = batch[-1].ordinal

    async def history(after: int, below: int | None) -> AsyncIterator[StoredEvent | RawPage]:
        if raw:
            async for pg in raw_catch_up(after, below):
                yield pg
        else:
            async for se in catch_up(after, below):
                yield se

    def cursor(x: StoredEvent | RawPage) -> int:
        return x.events[-1].cursor if type(x) is RawPage else x.ordinal  # type: ignore[union-attr]

    async def run() -> AsyncGenerator[StoredEvent | RawPage, None]:
        last = max(after_ordinal, 0)
        try:
            async for x in history(last, None):
                last = cursor(x)
                yield x
            async for item in sub:
                if isinstance(item, Lagged):
                    async for x in history(last, None):
                        last = cursor(x)
                        yield x
                    continue
                ordinal = item.ordinal
                if ordinal is None or ordinal <= last:
                    continue  # not persisted / already delivered
                if ordinal > last + 1:
                    # Ordinals are contiguous in commit order: anything between was committed
                    # (by another writer, or is about to be published) — read it back.
                    async for x in history(last, ordinal):
                        last = cursor(x)
                        yield x
                last = ordinal
                yield _stored(item)
        finally:
            sub.close()

    return Follower(sub, run())


def _stored(item: BusItem) -> StoredEvent:
    assert item.ordinal is not None
    return StoredEvent(item.ordinal, item.event)
