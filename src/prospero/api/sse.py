"""Server-Sent Events for the per-agent and fleet-wide streams.

Served with FastAPI's native SSE support (`fastapi.sse.EventSourceResponse` + yielding
`ServerSentEvent`), which can do everything needed on the wire: unnamed `data:` messages, `id:`
lines, a named `gap` event, comment lines. No fallback to a hand-rolled StreamingResponse was
needed. Two rough edges of the native support are worked around here:

* on a client disconnect the endpoint's generator is simply abandoned (not closed), so the
  per-connection resources live in a `StreamSession` opened by a request-scoped yield
  dependency, whose teardown releases them as soon as the response ends;
* a disconnect from a busy stream makes FastAPI's keep-alive task raise
  `ExceptionGroup[BrokenResourceError]`; `middleware.StreamDisconnectGuard` swallows exactly
  that case so an ordinary disconnect is not logged as a server error.

Wire format
-----------
* every FleetEvent is an unnamed message: `data: <FleetEvent JSON>` plus `id: <cursor>`, where
  the cursor is the event's `seq` on a per-agent stream and its store `ordinal` on the fleet
  stream;
* a consumer that fell behind gets `event: gap` / `data: {"skipped": n, "last_seq": m}` (no
  id) and then the missed events, replayed from the store: nothing is lost or duplicated;
* `: heartbeat` comment lines after `heartbeat_interval` seconds of silence (FastAPI adds its
  own `: ping` after 15 s of silence too; both are comments and ignored by clients).

Resume: `?from=N` (per agent: `seq >= N`; fleet: `ordinal >= N`) or the `Last-Event-ID`
header (resume strictly after that id). When both are sent the header wins: it is what a
browser's EventSource sends on auto-reconnect, while its URL still carries the original `from`.

Memory per connection is bounded: a follower (store replay in pages + a bounded bus queue)
feeds a bounded queue of `stream_buffer` items; when the socket is slower than the producer,
the follower's bus queue overflows and it self-heals (gap + replay) instead of buffering.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from fastapi.sse import ServerSentEvent

from prospero.api.metrics_text import API_SSE_STREAMS
from prospero.api.settings import ApiSettings
from prospero.core.aio import wait_for
from prospero.core.metrics import Metrics
from prospero.core.store.base import StoredEvent
from prospero.core.subscription import GapSignal
from prospero.types.events import FleetEvent

log = logging.getLogger(__name__)

_END = object()
_CLOSE = object()

HEARTBEAT = ServerSentEvent(comment="heartbeat")


def encode_agent_item(item: Any) -> ServerSentEvent | None:
    if isinstance(item, FleetEvent):
        return ServerSentEvent(raw_data=orjson.dumps(item.to_json()).decode(), id=str(item.seq))
    if isinstance(item, GapSignal):
        return gap_event(item)
    return None


def encode_fleet_item(item: Any) -> ServerSentEvent | None:
    if isinstance(item, StoredEvent):
        return ServerSentEvent(
            raw_data=orjson.dumps(item.event.to_json()).decode(), id=str(item.ordinal)
        )
    if isinstance(item, GapSignal):
        return gap_event(item)
    return None


def fleet_encoder_for(kinds: frozenset[str]) -> Callable[[Any], ServerSentEvent | None]:
    """`encode_fleet_item` that drops events of other kinds (gap signals still pass: the
    client must learn it fell behind whatever it filters)."""

    def encode(item: Any) -> ServerSentEvent | None:
        if isinstance(item, StoredEvent) and item.event.kind.kind not in kinds:
            return None
        return encode_fleet_item(item)

    return encode


def gap_event(gap: GapSignal) -> ServerSentEvent:
    return ServerSentEvent(
        event="gap",
        raw_data=orjson.dumps({"skipped": gap.skipped, "last_seq": gap.last_seq}).decode(),
    )


class StreamSession:
    """One SSE connection: a pump task moving follower items into a bounded queue, and the
    consumer side (`messages()`) that the endpoint yields from.

    Opened by a request-scoped yield dependency whose teardown calls `close()`, because the
    endpoint's async generator is NOT closed when a client disconnects mid-stream (the
    framework just stops iterating it); the teardown runs deterministically after the response
    ends, so the pump, the follower and its bus subscription are released at once.
    """

    def __init__(
        self,
        hub: StreamHub,
        source: Any,
        encode: Callable[[Any], ServerSentEvent | None],
    ) -> None:
        self.hub = hub
        self.source = source
        self.encode = encode
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=max(1, hub.settings.stream_buffer))
        self.closed = False
        self._released = False
        self._task = asyncio.create_task(self._pump(), name="sse-pump")

    async def _pump(self) -> None:
        try:
            async for item in self.source:
                await self.queue.put(item)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("SSE follower failed; closing the stream")
        finally:
            await _aclose(self.source)
        await self.queue.put(_END)

    def stop(self) -> None:
        """Ask the consumer to finish (shutdown); it ends without draining the queue."""
        self.closed = True
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(_CLOSE)  # wakes a consumer blocked on an empty queue

    async def messages(self) -> AsyncIterator[ServerSentEvent]:
        heartbeat = self.hub.settings.heartbeat_interval
        queue = self.queue
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()  # last time the client was sent anything
        while not self.closed:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                try:
                    item = await wait_for(queue.get(), heartbeat)
                except TimeoutError:
                    quiet_since = loop.time()
                    yield HEARTBEAT
                    continue
            if item is _END or item is _CLOSE or self.closed:
                return
            msg = self.encode(item)
            if msg is not None:
                quiet_since = loop.time()
                yield msg
            elif loop.time() - quiet_since >= heartbeat:
                # A busy stream whose items are all filtered out still owes the client its
                # heartbeat (proxies and browsers drop connections that stay silent).
                quiet_since = loop.time()
                yield HEARTBEAT

    async def close(self) -> None:
        """Release everything (idempotent): pump task, follower, queued items, registration."""
        self.closed = True
        if self._released:
            return
        self._released = True
        self.hub._release(self)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await wait_for(self._task, 5.0)
        await _aclose(self.source)
        while not self.queue.empty():
            self.queue.get_nowait()


class StreamHub:
    """Tracks open SSE connections so shutdown can end them before the HTTP server waits for
    connections to close."""

    def __init__(self, settings: ApiSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._sessions: set[StreamSession] = set()
        self.closing = False

    @property
    def open_streams(self) -> int:
        return len(self._sessions)

    def open(self, source: Any, encode: Callable[[Any], ServerSentEvent | None]) -> StreamSession:
        session = StreamSession(self, source, encode)
        self._sessions.add(session)
        self.metrics.add_gauge(API_SSE_STREAMS, 1)
        if self.closing:
            session.stop()
        return session

    def _release(self, session: StreamSession) -> None:
        if session in self._sessions:
            self._sessions.discard(session)
            self.metrics.add_gauge(API_SSE_STREAMS, -1)

    def close_all(self) -> None:
        self.closing = True
        for session in list(self._sessions):
            session.stop()


async def _aclose(source: Any) -> None:
    aclose = getattr(source, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()
