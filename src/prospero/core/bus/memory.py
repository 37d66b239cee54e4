"""`InProcessBus`: the live bus of one prosperod.

`InProcessBus` gives each subscriber its own bounded queue: `publish` never blocks and never
waits for a slow consumer; on overflow the *incoming* items are dropped and counted, and the
subscriber later receives one `Lagged(n)` exactly where the hole is (after the items it did
get, before anything newer). Memory per subscriber is bounded by `buffer` items. A consumer
takes items one at a time (`async for`) or everything ready at once (`batch()`: one wake-up per
burst, not one per item); `interrupt()` makes a waiting `batch()` return an empty batch (the
SSE session's heartbeat timer uses it instead of a timeout around every wait).

Not thread-safe: publish and consume on the event loop's thread.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from types import TracebackType

from prospero.core.bus.base import BusItem, Lagged
from prospero.core.metrics import BUS_LAGGED, Metrics


class InProcessSubscription:
    __slots__ = ("_bus", "_closed", "_dropped", "_interrupted", "_queue", "_waiter", "key")

    def __init__(self, bus: InProcessBus, key: str | None) -> None:
        self._bus = bus
        self.key = key
        self._queue: deque[BusItem | Lagged] = deque()
        self._dropped = 0
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._interrupted = False

    # -- producer side (called by the bus) ---------------------------------------------------

    def _offer(self, item: BusItem, buffer: int) -> None:
        if self._dropped:
            if len(self._queue) >= buffer:
                self._dropped += 1
                return
            self._flush_lag()
        elif len(self._queue) >= buffer:
            self._dropped = 1
            return
        self._queue.append(item)
        self._wake()

    def _flush_lag(self) -> None:
        # The Lagged marker may take one slot beyond `buffer`: at most buffer + 1 entries.
        self._queue.append(Lagged(self._dropped))
        self._bus._lagged(self._dropped)
        self._dropped = 0

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- consumer side -------------------------------------------------------------------

    def __aiter__(self) -> InProcessSubscription:
        return self

    async def __anext__(self) -> BusItem | Lagged:
        while True:
            if self._queue:
                return self._queue.popleft()
            if self._dropped:
                self._flush_lag()
                return self._queue.popleft()
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def batch(self) -> Sequence[BusItem | Lagged]:
        while True:
            if self._dropped:
                self._flush_lag()  # the hole is at the end: nothing newer got in since
            queue = self._queue
            if queue:
                self._queue = deque()
                return queue
            if self._interrupted:
                self._interrupted = False
                return ()
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def interrupt(self) -> None:
        self._interrupted = True
        self._wake()

    def pending(self) -> int:
        """Items queued and ready (a pending Lagged marker included)."""
        return len(self._queue) + (1 if self._dropped else 0)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.clear()
        self._dropped = 0
        self._bus._unregister(self)
        self._wake()

    async def __aenter__(self) -> InProcessSubscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _offer_all(subs: set[InProcessSubscription], item: BusItem, buffer: int) -> None:
    """`sub._offer(item, buffer)` for each, with the common case (room, no lag) inlined.
    Offering never changes the subscriber sets: wake-ups are scheduled, not run here."""
    for sub in subs:
        queue = sub._queue
        if sub._dropped or len(queue) >= buffer:
            sub._offer(item, buffer)
            continue
        queue.append(item)
        w = sub._waiter
        if w is not None and not w.done():
            w.set_result(None)


class InProcessBus:
    """Broadcast to per-subscriber bounded queues, filtered by stream key."""

    def __init__(self, buffer: int = 1024, metrics: Metrics | None = None) -> None:
        if buffer < 1:
            raise ValueError("bus buffer must be >= 1")
        self.buffer = buffer
        self._metrics = metrics
        self._by_key: dict[str, set[InProcessSubscription]] = {}
        self._all: set[InProcessSubscription] = set()
        self._closed = False

    def publish(self, item: BusItem) -> None:
        if self._closed:
            return
        ev = item.event
        subs = self._by_key.get(ev.agent_id or ev.stream_key)
        if subs:
            _offer_all(subs, item, self.buffer)
        if self._all:
            _offer_all(self._all, item, self.buffer)

    def subscribe(self, stream_key: str | None = None) -> InProcessSubscription:
        sub = InProcessSubscription(self, stream_key)
        if self._closed:
            sub._closed = True
            return sub
        if stream_key is None:
            self._all.add(sub)
        else:
            self._by_key.setdefault(stream_key, set()).add(sub)
        return sub

    def subscriber_count(self) -> int:
        return len(self._all) + sum(len(s) for s in self._by_key.values())

    def wants(self, stream_key: str) -> bool:
        """Whether publishing an event of this stream now would reach anyone: False lets a
        publisher (the emitter) skip building the event at all. Always True when `publish` is
        overridden (a subclass or a patched instance then sees every item)."""
        if type(self).publish is not InProcessBus.publish or "publish" in vars(self):
            return True
        return not self._closed and (bool(self._all) or stream_key in self._by_key)

    def close(self) -> None:
        """End every subscription (after it drains what it already holds)."""
        self._closed = True
        subs = list(self._all) + [s for group in self._by_key.values() for s in group]
        self._all.clear()
        self._by_key.clear()
        for sub in subs:
            sub._closed = True
            sub._wake()

    def _unregister(self, sub: InProcessSubscription) -> None:
        if sub.key is None:
            self._all.discard(sub)
            return
        group = self._by_key.get(sub.key)
        if group is not None:
            group.discard(sub)
            if not group:
                del self._by_key[sub.key]

    def _lagged(self, n: int) -> None:
        if self._metrics is not None:
            self._metrics.inc(BUS_LAGGED, n)
