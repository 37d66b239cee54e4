"""The Bus seam (prospero-surface.md §4.7): what a publisher hands over and a subscriber gets.

Items are `BusItem(ordinal, event)` — `ordinal` is the store ordinal, None when the event could
not be persisted — or `Lagged(n)`: the subscriber fell `n` items behind and they were dropped.
Consumers heal a lag by re-reading the store (see `prospero.core.subscription`). A `BusItem`
encodes its event once, for all its subscribers (`BusItem.json`, computed on first use).

Implementations: `memory.InProcessBus` (one prosperod: the emitter publishes what it committed)
and `postgres.PgBus` (replicas sharing PostgreSQL: a NOTIFY doorbell sent in each append's
transaction; every replica reads the new rows from the store and publishes them locally).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from prospero.types.events import FleetEvent, Output


def event_json(ev: FleetEvent) -> bytes:
    """`orjson.dumps(ev.to_json())`, byte for byte; an `Output` (most live events) without the
    pydantic round trip (its fields are plain strings: the same JSON, tested)."""
    kind = ev.kind
    if type(kind) is Output:
        try:
            return orjson.dumps(
                {
                    "seq": ev.seq,
                    "ts": ev.ts,
                    "repo": ev.repo,
                    "agent_id": ev.agent_id,
                    "kind": {"kind": "output", "stream": kind.stream, "chunk": kind.chunk},
                }
            )
        except TypeError:  # e.g. a lone surrogate: let the general path decide
            pass
    return orjson.dumps(ev.to_json())


@dataclass(frozen=True, slots=True)
class BusItem:
    ordinal: int | None
    event: FleetEvent
    # `time.monotonic()` when it was published (0.0: not stamped): SSE delivery is timed from it.
    published: float = field(default=0.0, compare=False, repr=False)
    _json: bytes | None = field(default=None, compare=False, repr=False)

    @property
    def json(self) -> bytes:
        """The event's JSON (`orjson.dumps(event.to_json())`), encoded once for every
        subscriber that asks."""
        data = self._json
        if data is None:
            data = event_json(self.event)
            object.__setattr__(self, "_json", data)
        return data


@dataclass(frozen=True, slots=True)
class Lagged:
    skipped: int


class BusSubscription(Protocol):
    """Async iterator of `BusItem | Lagged`; ends when closed or when the bus closes."""

    def __aiter__(self) -> BusSubscription: ...

    async def __anext__(self) -> BusItem | Lagged: ...

    async def batch(self) -> Sequence[BusItem | Lagged]:
        """Everything queued, in order (waits for at least one item); an empty batch once
        after `interrupt()`; StopAsyncIteration when closed (or the bus closed) and drained."""
        ...

    def interrupt(self) -> None:
        """Make the current (or next) `batch()` wait return an empty batch; never blocks."""
        ...

    def close(self) -> None: ...


class Bus(Protocol):
    def publish(self, item: BusItem) -> None:
        """Deliver to every matching subscriber; never blocks."""
        ...

    def subscribe(self, stream_key: str | None = None) -> BusSubscription:
        """Register now (items published after this call are delivered); None = all streams."""
        ...

    def wants(self, stream_key: str) -> bool:
        """Whether publishing an event of this stream now would reach anyone (False lets the
        emitter skip building the event); a bus that cannot tell says True."""
        ...
