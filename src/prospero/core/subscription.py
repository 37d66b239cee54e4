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

Both return an async iterator that has already subscribed when the call returns; close it with
`aclose()` (or `async with`) when abandoning it early.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, TypeVar

from prospero.core.bus import Bus, BusItem, BusSubscription, Lagged
from prospero.core.store.base import EventStore, StoredEvent
from prospero.types.events import TERMINAL_EVENT_KINDS, FleetEvent

T = TypeVar("T")

DEFAULT_PAGE = 256


@dataclass(frozen=True, slots=True)
class GapSignal:
    """The consumer lagged and `skipped` live events were dropped after `last_seq`; the
    follower replays them from the store right after this signal."""

    skipped: int
    last_seq: int


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


def follow_stream(
    store: EventStore,
    bus: Bus,
    stream_key: str,
    from_seq: int = 0,
    *,
    close_on_finish: bool = True,
    page: int = DEFAULT_PAGE,
) -> Follower[FleetEvent | GapSignal]:
    sub = bus.subscribe(stream_key)

    async def run() -> AsyncGenerator[FleetEvent | GapSignal, None]:
        # Seqs start at 1, so from_seq 0 and 1 mean the same: everything.
        last = max(from_seq, 1) - 1
        try:
            async for ev in _stream_pages(store, stream_key, last + 1, None, page):
                last = ev.seq
                yield ev
                if close_on_finish and _is_terminal(ev):
                    return
            async for item in sub:
                if isinstance(item, Lagged):
                    yield GapSignal(skipped=item.skipped, last_seq=last)
                    async for ev in _stream_pages(store, stream_key, last + 1, None, page):
                        last = ev.seq
                        yield ev
                        if close_on_finish and _is_terminal(ev):
                            return
                    continue
                live = item.event
                if live.seq <= last:
                    continue  # already delivered (history/live overlap)
                if live.seq > last + 1:
                    # Missed a stretch (e.g. written by another process): read it back.
                    async for ev in _stream_pages(store, stream_key, last + 1, live.seq, page):
                        last = ev.seq
                        yield ev
                        if close_on_finish and _is_terminal(ev):
                            return
                last = live.seq
                yield live
                if close_on_finish and _is_terminal(live):
                    return
        finally:
            sub.close()

    return Follower(sub, run())


def follow_fleet(
    store: EventStore, bus: Bus, after_ordinal: int = 0, *, page: int = DEFAULT_PAGE
) -> Follower[StoredEvent]:
    sub = bus.subscribe(None)

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

    async def run() -> AsyncGenerator[StoredEvent, None]:
        last = max(after_ordinal, 0)
        try:
            async for se in catch_up(last, None):
                last = se.ordinal
                yield se
            async for item in sub:
                if isinstance(item, Lagged):
                    async for se in catch_up(last, None):
                        last = se.ordinal
                        yield se
                    continue
                ordinal = item.ordinal
                if ordinal is None or ordinal <= last:
                    continue  # not persisted / already delivered
                if ordinal > last + 1:
                    # Ordinals are contiguous in commit order: anything between was committed
                    # (by another writer, or is about to be published) — read it back.
                    async for se in catch_up(last, ordinal):
                        last = se.ordinal
                        yield se
                last = ordinal
                yield _stored(item)
        finally:
            sub.close()

    return Follower(sub, run())


def _stored(item: BusItem) -> StoredEvent:
    assert item.ordinal is not None
    return StoredEvent(item.ordinal, item.event)
