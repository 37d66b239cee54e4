"""`HeadAdapter`: HEAD answered wherever GET is (issue 10, item 5).

FastAPI's routes answer only the methods they declare, so `HEAD /healthz` was a 405. This
pure-ASGI middleware runs a HEAD request as a GET and drops the body, keeping the status and
every header (`content-length` included, as RFC 9110 §9.3.2 asks):

- a response with a `content-length` (every ordinary response): the headers go out as they
  are, the body chunks are dropped, the response ends with the GET's last chunk;
- a response without one (an SSE stream, a 204): there is no body a HEAD could wait for, so
  the response ends right after the headers, and from then on the application sees the
  client as gone: `receive()` answers `http.disconnect` (which is what ends a stream and
  releases its follower) and anything it still sends is dropped.

A path without a GET route answers HEAD exactly as it answers GET: 405 (with `Allow`) or 404.
The outer middleware (access log, Host guard) still see the request as HEAD; everything
inside sees a GET, so the auth route table and the origin guard treat it as the read it is.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prospero.api.middleware import BODY_SEND

_DISCONNECT: Message = {"type": "http.disconnect"}
_END: Message = {"type": "http.response.body", "body": b"", "more_body": False}


def _has_content_length(message: Message) -> bool:
    return any(key.lower() == b"content-length" for key, _ in message.get("headers", ()))


class HeadAdapter:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        inner = {**scope, "method": "GET"}
        ext = scope.get("extensions")
        if ext and BODY_SEND in ext:  # every body message must come through here (dropped)
            inner["extensions"] = {k: v for k, v in ext.items() if k != BODY_SEND}
        await _HeadExchange(receive, send).run(self.app, inner)


class _HeadExchange:
    """One HEAD request run as a GET."""

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self._ended = asyncio.Event()
        self._pending: asyncio.Future[Message] | None = None

    async def run(self, app: ASGIApp, scope: Scope) -> None:
        try:
            await app(scope, self.receive, self.send)
        finally:
            if self._pending is not None:
                self._pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._pending

    async def _end(self) -> None:
        self._ended.set()
        await self._send(_END)

    async def send(self, message: Message) -> None:
        if self._ended.is_set():
            return  # the HEAD response is complete; the app just has not noticed yet
        kind = message["type"]
        if kind == "http.response.start":
            await self._send(message)
            if not _has_content_length(message):
                await self._end()
        elif kind == "http.response.body":
            if not message.get("more_body", False):
                await self._end()
        else:
            await self._send(message)

    async def receive(self) -> Message:
        """The client's messages until the HEAD response is complete, then a disconnect (also
        for a receive already waiting when it completes)."""
        if self._ended.is_set():
            return _DISCONNECT
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._receive())
        ended: asyncio.Future[Any] = asyncio.ensure_future(self._ended.wait())
        waiting: set[asyncio.Future[Any]] = {self._pending, ended}
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
        if self._pending.done():
            pending, self._pending = self._pending, None
            return pending.result()
        return _DISCONNECT
