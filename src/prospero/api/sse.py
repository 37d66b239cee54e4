"""Server-Sent Events for the per-agent and fleet-wide streams.

Served by `SseResponse` (a StreamingResponse of `StreamSession.chunks()`), not by FastAPI's
native SSE (`EventSourceResponse` + yielded `ServerSentEvent`s), which costs one send through
its producer/keep-alive streams and the middleware chain per event (issue 11). Here stored
history arrives from the follower as JSON bytes a page at a time (`subscription.RawPage`,
spliced by the store, never decoded into models) and leaves as one `http.response.body`
message per batch of SSE frames: whatever is queued when the socket is ready goes out in one
write (at most about MAX_WRITE bytes), live events included. The bytes are exactly what
`format_sse_event` wrote for each event before. The OpenAPI entry is the one FastAPI writes for
an SSE generator (`SSE_RESPONSES`).

* on a client disconnect the response simply stops, so the per-connection resources live in a
  `StreamSession` opened by a request-scoped yield dependency, whose teardown releases them as
  soon as the response ends;
* `middleware.StreamDisconnectGuard` still swallows a disconnect's
  `ExceptionGroup[BrokenResourceError]`, should a stream raise one.

Wire format
-----------
* every FleetEvent is an unnamed message: `data: <FleetEvent JSON>` plus `id: <cursor>`, where
  the cursor is the event's `seq` on a per-agent stream and its store `ordinal` on the fleet
  stream;
* a consumer that fell behind gets `event: gap` / `data: {"skipped": n, "last_seq": m}` (no
  id) and then the missed events, replayed from the store: nothing is lost or duplicated;
* `: heartbeat` comment lines after `heartbeat_interval` seconds of silence (a comment, ignored
  by clients).

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
from starlette.responses import StreamingResponse

from prospero.api.metrics_text import API_SSE_STREAMS
from prospero.api.settings import ApiSettings
from prospero.core.aio import wait_for
from prospero.core.metrics import Metrics
from prospero.core.store.base import StoredEvent
from prospero.core.subscription import GapSignal, RawPage
from prospero.types.events import FleetEvent

log = logging.getLogger(__name__)

_END = object()
_CLOSE = object()

HEARTBEAT_FRAME = b": heartbeat\n\n"
# Bytes of frames joined into one socket write at most (a bigger batch waits for the next).
MAX_WRITE = 1 << 20

# The OpenAPI description of an SSE 200 (what FastAPI documents for a generator endpoint).
SSE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Successful Response",
        "content": {
            "text/event-stream": {
                "itemSchema": {
                    "type": "object",
                    "properties": {
                        "data": {"type": "string"},
                        "event": {"type": "string"},
                        "id": {"type": "string"},
                        "retry": {"type": "integer", "minimum": 0},
                    },
                }
            }
        },
    }
}


def _page_frames(pg: RawPage) -> bytes:
    # == format_sse_event(data_str=<event JSON>, id=str(cursor)): the JSON has no line breaks.
    return b"".join([b"data: %b\nid: %d\n\n" % (r.data, r.cursor) for r in pg.events])


def _event_frame(ev: FleetEvent, cursor: int) -> bytes:
    return b"data: %b\nid: %d\n\n" % (orjson.dumps(ev.to_json()), cursor)


def _gap_frame(gap: GapSignal) -> bytes:
    return b"event: gap\ndata: %b\n\n" % orjson.dumps(
        {"skipped": gap.skipped, "last_seq": gap.last_seq}
    )


def agent_frame(item: Any) -> bytes | None:
    """The SSE bytes of a per-agent follower item ."""
    if type(item) is RawPage:
        return _page_frames(item)
    if isinstance(item, FleetEvent):
        return _event_frame(item, item.seq)
    if isinstance(item, GapSignal):
        return _gap_frame(item)
    return None


def fleet_frame(item: Any) -> bytes | None:
    """The SSE bytes of a fleet follower item ."""
    if type(item) is RawPage:
        return _page_frames(item)
    if isinstance(item, StoredEvent):
        return _event_frame(item.event, item.ordinal)
    if isinstance(item, GapSignal):
        return _gap_frame(item)
    return None


def fleet_frame_for(kinds: frozenset[str]) -> Callable[[Any], bytes | None]:
    """`fleet_frame` that drops events of other kinds (gap signals still pass)."""

    def frame(item: Any) -> bytes | None:
        if type(item) is RawPage:
            events = [r for r in item.events if r.kind in kinds]
            return _page_frames(RawPage(events)) if events else None
        if isinstance(item, StoredEvent) and item.event.kind.kind not in kinds:
            return None
        return fleet_frame(item)

    return frame


class SseResponse(StreamingResponse):
    """`text/event-stream` of a session's `chunks()`, with the headers FastAPI's SSE sets."""

    media_type = "text/event-stream"

    def __init__(self, session: StreamSession) -> None:
        super().__init__(
            session.chunks(),
            media_type=self.media_type,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


class StreamSession:
    """One SSE connection: a pump task moving follower items into a bounded queue, and the
    consumer side (`chunks()`) that `SseResponse` streams.

    Opened by a request-scoped yield dependency whose teardown calls `close()`, because the
    endpoint's async generator is NOT closed when a client disconnects mid-stream (the
    framework just stops iterating it); the teardown runs deterministically after the response
    ends, so the pump, the follower and its bus subscription are released at once.
    """

    def __init__(
        self,
        hub: StreamHub,
        source: Any,
        frame: Callable[[Any], bytes | None],
    ) -> None:
        self.hub = hub
        self.source = source
        self.frame = frame
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=max(1, hub.settings.stream_buffer))
        # Set by the consumer whenever it took items: a `RawPage` (up to RAW_PAGE events) is
        # queued only behind at most one other, so memory stays bounded by pages, not items.
        self._taken = asyncio.Event()
        self.closed = False
        self._released = False
        self._task = asyncio.create_task(self._pump(), name="sse-pump")

    async def _pump(self) -> None:
        try:
            async for item in self.source:
                if type(item) is RawPage:
                    while self.queue.qsize() >= 2 and not self.closed:
                        self._taken.clear()
                        await self._taken.wait()
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
        self._taken.set()  # a pump waiting to queue a page sees `closed`
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(_CLOSE)  # wakes a consumer blocked on an empty queue

    async def chunks(self) -> AsyncIterator[bytes]:
        """The stream's bytes: every item queued by the time the socket is ready again goes
        out as one chunk of SSE frames (at most about MAX_WRITE bytes); a heartbeat after
        `heartbeat_interval` of silence, also on a busy stream whose items are all filtered
        out."""
        heartbeat = self.hub.settings.heartbeat_interval
        queue = self.queue
        frame = self.frame
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        while not self.closed:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                try:
                    item = await wait_for(queue.get(), heartbeat)
                except TimeoutError:
                    quiet_since = loop.time()
                    yield HEARTBEAT_FRAME
                    continue
            parts: list[bytes] = []
            size = 0
            end = False
            while True:
                if item is _END or item is _CLOSE or self.closed:
                    end = True
                    break
                b = frame(item)
                if b:
                    parts.append(b)
                    size += len(b)
                    if size >= MAX_WRITE:
                        break
                try:
                    item = queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
            self._taken.set()
            if parts:
                quiet_since = loop.time()
                yield parts[0] if len(parts) == 1 else b"".join(parts)
            elif not end and loop.time() - quiet_since >= heartbeat:
                quiet_since = loop.time()
                yield HEARTBEAT_FRAME
            if end:
                return

    async def close(self) -> None:
        """Release everything (idempotent): pump task, follower, queued items, registration."""
        self.closed = True
        if self._released:
            return
        self._released = True
        self.hub._release(self)
        self._taken.set()
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

    def open(
        self,
        source: Any,
        frame: Callable[[Any], bytes | None],
    ) -> StreamSession:
        session = StreamSession(self, source, frame)
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
