"""Pure-ASGI middleware: request body limit and the access log.

Pure ASGI (not BaseHTTPMiddleware) so SSE responses stream through untouched.

Body limit: a declared `Content-Length` over the limit is refused before reading anything; a
chunked body is buffered up to the limit and refused as soon as it goes over. Either way the
answer is 413 in the `{error, kind}` envelope, for every endpoint, whether or not the endpoint
reads its body (Starlette's lazy RequestBodyLimitMiddleware only fires when the body is read and
answers in plain text, hence this eager variant). Bodies are ≤ 1 MiB, so buffering is cheap.
The whole body read is bounded by `body_timeout` seconds (a client trickling its body cannot
hold a request open): past it the answer is 408 `request_timeout` and the connection is closed.
"""

from __future__ import annotations

import logging
import time

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prospero.api.errors import send_envelope
from prospero.core.aio import wait_for
from prospero.core.metrics import Metrics

access_log = logging.getLogger("prospero.api.access")

API_REQUESTS = "api_requests"  # by method and status code (0: no response started)
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
API_BODY_TOO_LARGE = "api_body_too_large"
API_BODY_TIMEOUTS = "api_body_timeouts"


CLOSE = ((b"connection", b"close"),)


class _TooLarge(Exception):
    pass


class BodyLimitMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        metrics: Metrics | None = None,
        body_timeout: float | None = 30.0,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.body_timeout = body_timeout

    async def _too_large(self, send: Send) -> None:
        if self.metrics is not None:
            self.metrics.inc(API_BODY_TOO_LARGE)
        await send_envelope(
            send,
            413,
            f"request body exceeds the {self.max_bytes} byte limit",
            "payload_too_large",
            CLOSE,
        )

    async def _timed_out(self, send: Send) -> None:
        if self.metrics is not None:
            self.metrics.inc(API_BODY_TIMEOUTS)
        await send_envelope(
            send,
            408,
            f"request body not received within {self.body_timeout:g}s",
            "request_timeout",
            CLOSE,
        )

    async def _read_body(self, receive: Receive) -> Message:
        """The whole body as one `http.request` message (or the disconnect that cut it short).
        Raises _TooLarge as soon as it goes over the limit."""
        chunks: list[bytes] = []
        total = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return msg  # disconnect before the body was complete: hand it on
            body = msg.get("body", b"")
            total += len(body)
            if total > self.max_bytes:
                raise _TooLarge
            if body:
                chunks.append(body)
            if not msg.get("more_body", False):
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared: int | None = None
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await send_envelope(
                        send, 400, "invalid Content-Length", "invalid_request", CLOSE
                    )
                    return
        if declared is not None and declared > self.max_bytes:
            await self._too_large(send)
            return

        try:
            first = await wait_for(self._read_body(receive), self.body_timeout)
        except _TooLarge:
            await self._too_large(send)
            return
        except TimeoutError:
            await self._timed_out(send)
            return
        replay: list[Message] = [first]

        async def buffered_receive() -> Message:
            if replay:
                return replay.pop()
            return await receive()

        await self.app(scope, buffered_receive, send)


# The scope extension under which `BodySendExtension` puts the server's own `send`.
BODY_SEND = "prospero.body_send"


class BodySendExtension:
    """Outermost: puts the server's own `send` in `scope["extensions"][BODY_SEND]`, so a
    streaming response can send its body chunks past the middleware chain once the response
    has started (`sse.SseResponse`: one send per live burst, issue 11). Every middleware of
    this app looks only at `http.response.start` (status for the access log, "started" flags
    for error handling), never at body messages; one that must see or change the body (a HEAD
    adapter, compression) removes the extension from the scope it passes on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            ext = scope.get("extensions")
            scope["extensions"] = {**ext, BODY_SEND: send} if ext else {BODY_SEND: send}
        await self.app(scope, receive, send)


class StatusRecorder:
    """A `send` that remembers the response's status (0 until the response starts)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.status = 0

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
        await self.send(message)


class AccessLogMiddleware:
    """One line per request: method, path (never the query string), status, duration, token
    name. Streams are logged when they end."""

    def __init__(self, app: ASGIApp, metrics: Metrics | None = None, enabled: bool = True):
        self.app = app
        self.metrics = metrics
        self.enabled = enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        recorder = StatusRecorder(send)
        try:
            await self.app(scope, receive, recorder)
        finally:
            status = recorder.status
            if self.metrics is not None:
                method = scope["method"]
                labels = (method if method in _METHODS else "other", str(status or 0))
                self.metrics.inc(API_REQUESTS, 1, labels)
            if self.enabled:
                state = scope.get("state") or {}
                client = scope.get("client")
                access_log.info(
                    "%s %s %s",
                    scope["method"],
                    scope["path"],
                    status or "-",
                    extra={
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status,
                        "duration_ms": round((time.monotonic() - start) * 1000, 2),
                        "token_name": state.get("token_name"),
                        "client": f"{client[0]}:{client[1]}" if client else None,
                    },
                )


_DISCONNECT_ERRORS = (anyio.BrokenResourceError, anyio.ClosedResourceError)


def _only_disconnect_errors(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_disconnect_errors(e) for e in exc.exceptions)
    return isinstance(exc, _DISCONNECT_ERRORS)


class StreamDisconnectGuard:
    """Swallow the spurious error FastAPI's native SSE raises when a client disconnects from
    a busy stream: its keep-alive task may be blocked sending into the response stream when
    that stream is closed, and the task group re-raises `ExceptionGroup[BrokenResourceError]`
    after the response has started, which uvicorn would log as "Exception in ASGI application"
    on every ordinary disconnect (fastapi/fastapi discussion #15725). Nothing is lost: the
    response was already streaming and its client is gone. Anything else propagates."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_wrapper(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except BaseException as exc:
            if started and _only_disconnect_errors(exc):
                access_log.debug(
                    "client went away mid-stream: %s %s", scope["method"], scope["path"]
                )
                return
            raise
