"""uvicorn's h11 protocol with the defences a public socket needs against slow clients.

- **Header-read deadline.** Each request gets `header_timeout` seconds to deliver its complete
  request line and headers, counted from the connection's opening (first request) or from the
  end of the previous response (keep-alive requests). Bytes arriving do not move the deadline,
  so a slowloris that trickles a byte now and then is closed like a silent one. When the
  deadline passes the connection is closed; if part of a request had arrived it first gets a
  `408 request_timeout` envelope. uvicorn's own `timeout_keep_alive` still closes a connection
  that stays silent after a response (it is reset by any byte; this deadline is not).
- **Connection bound.** A connection accepted while the server already holds
  `max_connections` is answered `503 unavailable` (envelope, `Retry-After`) at once and closed:
  it never holds a slot while it sends (or trickles) its request. The bytes it sends meanwhile
  are discarded for a short linger so that closing does not reset the 503 out of the client's
  buffer. A request that arrives while more than `max_connections` request tasks run (a task can
  outlive its connection briefly) gets the same 503. This replaces uvicorn's
  `limit_concurrency`, whose 503 is plain text (not the envelope) and which serves one
  connection fewer than its limit (it counts the asking connection).

The body of a request is bounded separately (`BodyLimitMiddleware`, `body_timeout`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import h11
from uvicorn._types import ASGI3Application
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from prospero.api.errors import envelope_bytes
from prospero.core.metrics import Metrics

log = logging.getLogger(__name__)

API_HEADER_TIMEOUTS = "api_header_timeouts"
API_CONNECTIONS_REFUSED = "api_connections_refused"
API_CONNECTIONS = "api_connections"  # gauge: connections being served

# How long a refused connection's incoming bytes are read and dropped after its 503 was written
# (closing a socket with unread input resets it, and a reset can discard the unread 503).
REFUSED_LINGER = 1.0


def _raw_response(status: int, reason: str, body: bytes, extra: str = "") -> bytes:
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        f"{extra}"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def _overloaded_body(limit: int | None) -> bytes:
    return envelope_bytes(
        f"server is at its limit of {limit} concurrent connections; retry shortly", "unavailable"
    )


class GuardedH11Protocol(H11Protocol):
    """Configured through class attributes (uvicorn instantiates the protocol class itself):
    use `guarded_protocol(...)` to get a subclass bound to the settings."""

    header_timeout: ClassVar[float] = 10.0
    max_connections: ClassVar[int | None] = None
    metrics: ClassVar[Metrics | None] = None

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._refused = False
        self.limit_concurrency = None  # ours: see the module docstring
        if self.max_connections is not None:
            self.app = self._limited(self.app)

    # ---------------------------------------------------------------- deadline bookkeeping

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_deadline = self.loop.call_later(
            self.header_timeout, self._header_deadline_passed
        )

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_deadline_passed(self) -> None:
        self._header_deadline = None
        if self.transport.is_closing():
            return
        if self.metrics is not None:
            self.metrics.inc(API_HEADER_TIMEOUTS)
        # Part of a request line/headers buffered: tell the client why (it sent something and
        # waits for an answer). A silent connection (nothing since the last response) is just
        # closed: an unsolicited 408 could be read as the answer to a request sent later.
        partial = self.conn.their_state is h11.IDLE and bool(self.conn.trailing_data[0])
        log.debug("closing %s: request headers not complete in time", self._peer())
        if partial:
            body = envelope_bytes(
                f"request headers not received within {self.header_timeout:g}s",
                "request_timeout",
            )
            self.transport.write(_raw_response(408, "Request Timeout", body))
            # A client still sending (a slowloris drips on) would get a reset for its next
            # bytes if the socket closed now, and a reset can discard the 408 it has not read:
            # half-close, drop what it sends for a short linger, then abort.
            self._linger_close()
            return
        self.transport.close()

    def _linger_close(self) -> None:
        self._refused = True  # data_received drops input from now on
        self.connections.discard(self)  # no longer served: frees its slot
        try:
            self.transport.write_eof()
        except (OSError, RuntimeError, NotImplementedError):
            self.transport.close()
            return
        self._linger = self.loop.call_later(REFUSED_LINGER, self.transport.abort)

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "client"

    # ---------------------------------------------------------------- connection bound

    def _limited(self, app: ASGI3Application) -> ASGI3Application:
        limit = self.max_connections
        assert limit is not None
        tasks = self.tasks  # shared by every connection of the server; holds this request's

        async def limited(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http" or len(tasks) <= limit:
                await app(scope, receive, send)
                return
            if self.metrics is not None:
                self.metrics.inc(API_CONNECTIONS_REFUSED)
            body = _overloaded_body(limit)
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
                (b"connection", b"close"),
            ]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        return limited

    def _count_connections(self) -> None:
        if self.metrics is not None:
            self.metrics.set_gauge(API_CONNECTIONS, len(self.connections))

    def _refuse(self) -> None:
        if self.metrics is not None:
            self.metrics.inc(API_CONNECTIONS_REFUSED)
        body = _overloaded_body(self.max_connections)
        self.transport.write(_raw_response(503, "Service Unavailable", body, "retry-after: 1\r\n"))
        self._linger_close()

    # ---------------------------------------------------------------- protocol interface

    def connection_made(  # type: ignore[override]
        self, transport: asyncio.Transport
    ) -> None:
        super().connection_made(transport)
        limit = self.max_connections
        if limit is not None and len(self.connections) > limit:
            self._refuse()
            return
        self._count_connections()
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # drained and dropped until the linger ends
        before = self.cycle
        super().data_received(data)
        if self.cycle is not before:  # a request's headers are complete
            self._disarm_header_deadline()

    def on_response_complete(self) -> None:
        if self.transport.is_closing():
            super().on_response_complete()
            return
        # The next request's headers are due within header_timeout of this response's end.
        self._arm_header_deadline()
        before = self.cycle
        super().on_response_complete()  # may parse a pipelined request
        if self.cycle is not before:
            self._disarm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        super().connection_lost(exc)
        self._count_connections()


def guarded_protocol(
    *, header_timeout: float, max_connections: int | None, metrics: Metrics | None = None
) -> type[GuardedH11Protocol]:
    """A `GuardedH11Protocol` subclass bound to these settings (for `uvicorn.Config(http=…)`)."""
    return type(
        "BoundGuardedH11Protocol",
        (GuardedH11Protocol,),
        {
            "header_timeout": float(header_timeout),
            "max_connections": max_connections,
            "metrics": metrics,
        },
    )
