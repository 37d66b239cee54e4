"""Server-Sent Events for the per-agent and fleet-wide streams.

Served by `SseResponse` (a StreamingResponse of `StreamSession.chunks()`), not by FastAPI's
native SSE (`EventSourceResponse` + yielded `ServerSentEvent`s), which costs one send through
its producer/keep-alive streams and the middleware chain per event (issue 11). Here events
arrive from the follower as JSON bytes (`subscription.RawPage`): stored history a page at a
time (spliced by the store, never decoded into models), live events as every event the bus
queued for the connection since its last wake-up (each event's JSON encoded once, for all its
watchers: `BusItem.json`); each page leaves as one `http.response.body` message, i.e. one
socket write. The bytes are exactly what `format_sse_event` wrote for each event before. The
OpenAPI entry is the one FastAPI writes for an SSE generator (`SSE_RESPONSES`).

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

Memory per connection is bounded: the follower reads the store in pages and its bus queue is
bounded; when the socket is slower than the producer, that queue overflows and the follower
self-heals (gap + replay) instead of buffering.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from prospero.api.metrics_text import API_SSE_STREAMS
from prospero.api.middleware import BODY_SEND
from prospero.api.settings import ApiSettings
from prospero.core.metrics import SSE_DELIVERY_SECONDS, Histogram, Metrics
from prospero.core.store.base import StoredEvent
from prospero.core.subscription import IDLE, GapSignal, RawPage
from prospero.types.events import FleetEvent

log = logging.getLogger(__name__)

HEARTBEAT_FRAME = b": heartbeat\n\n"
# A heartbeat timer that fires this early (the loop runs timers up to its clock resolution
# ahead) still counts as due.
TIMER_SLACK = 0.001

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
        self._body_send: Send | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ext = scope.get("extensions")
        self._body_send = ext.get(BODY_SEND) if ext else None
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Send) -> None:
        """StreamingResponse's, with the body chunks sent straight to the server once the
        response has started (`middleware.BodySendExtension`; the start, and so the status
        every middleware records, goes through the chain as usual)."""
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        body_send = self._body_send or send
        async for chunk in self.body_iterator:
            await body_send({"type": "http.response.body", "body": chunk, "more_body": True})
        await body_send({"type": "http.response.body", "body": b"", "more_body": False})


class StreamSession:
    """One SSE connection: `chunks()` (what `SseResponse` streams) iterates the follower in
    the response's own task and writes each item it yields as one chunk — a history page, or
    every live event the bus queued for it since its last wake-up — so a live event costs one
    task wake-up per burst, not one per event, and no queue sits between the follower and the
    socket. Heartbeats come from one timer per session (re-armed once per interval, not per
    event), which interrupts a follower waiting for live events.

    Opened by a request-scoped yield dependency whose teardown calls `close()`, because the
    endpoint's async generator is NOT closed when a client disconnects mid-stream (the
    framework just stops iterating it); the teardown runs deterministically after the response
    ends, so the follower, its bus subscription and the timer are released at once.

    A slow socket blocks the response's send, so the follower stops being iterated: its bus
    queue overflows and it self-heals (gap + replay from the store) once the socket drains;
    `publish` never waits for it, so the other connections are not delayed.
    """

    def __init__(
        self,
        hub: StreamHub,
        source: Any,
        frame: Callable[[Any], bytes | None],
        delivery: Histogram | None = None,
    ) -> None:
        self.hub = hub
        self.source = source
        self.frame = frame
        # Times each write of live events from its oldest event's publish on the bus.
        self._delivery = delivery
        self.closed = False
        self._released = False
        # The follower's `interrupt()` (a plain async iterator has none: it gets heartbeats
        # only between items).
        self._interrupt: Callable[[], None] | None = getattr(source, "interrupt", None)
        self._interval = hub.settings.heartbeat_interval
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._last_write = loop.time()
        self._beat_due = False
        self._timer: asyncio.TimerHandle | None = loop.call_at(
            self._last_write + self._interval, self._on_timer
        )

    def _on_timer(self) -> None:
        if self.closed:
            self._timer = None
            return
        loop = self._loop
        due = self._last_write + self._interval
        now = loop.time()
        if now + TIMER_SLACK < due:  # something was written since: wait for the new deadline
            self._timer = loop.call_at(due, self._on_timer)
            return
        self._beat_due = True
        self._timer = loop.call_at(now + self._interval, self._on_timer)
        if self._interrupt is not None:
            self._interrupt()  # a waiting follower yields IDLE: chunks() writes the heartbeat

    def stop(self) -> None:
        """Ask the consumer to finish (shutdown); it ends without writing what is pending."""
        self.closed = True
        if self._interrupt is not None:
            self._interrupt()  # wakes a follower waiting for live events

    async def chunks(self) -> AsyncIterator[bytes]:
        """The stream's bytes: one chunk per follower item (a page of history, or the live
        events that were ready together); a heartbeat after `heartbeat_interval` of silence,
        also on a busy stream whose items are all filtered out."""
        frame = self.frame
        loop = self._loop
        interval = self._interval
        delivery = self._delivery
        try:
            async for item in self.source:
                if self.closed:
                    return
                b = None if item is IDLE else frame(item)
                if not b:
                    if not self._beat_due and loop.time() - self._last_write < interval:
                        continue
                    b = HEARTBEAT_FRAME
                self._beat_due = False
                self._last_write = loop.time()
                yield b  # (resumed once the server has taken the chunk for the socket)
                if delivery is not None and type(item) is RawPage and item.published:
                    delivery.observe(time.monotonic() - item.published)
                if self.closed:
                    return
        except Exception:
            log.exception("SSE follower failed; closing the stream")

    async def close(self) -> None:
        """Release everything (idempotent): timer, follower, registration."""
        self.closed = True
        if self._released:
            return
        self._released = True
        self.hub._release(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await _aclose(self.source)


class StreamHub:
    """Tracks open SSE connections so shutdown can end them before the HTTP server waits for
    connections to close."""

    def __init__(self, settings: ApiSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self._sessions: set[StreamSession] = set()
        self._delivery: dict[str, Histogram] = {}
        self.closing = False

    @property
    def open_streams(self) -> int:
        return len(self._sessions)

    def open(
        self,
        source: Any,
        frame: Callable[[Any], bytes | None],
    ) -> StreamSession:
        stream = "agent" if frame is agent_frame else "fleet"
        delivery = self._delivery.get(stream)
        if delivery is None:
            delivery = self._delivery[stream] = self.metrics.histogram(
                SSE_DELIVERY_SECONDS, (stream,)
            )
        session = StreamSession(self, source, frame, delivery)
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
