"""`middleware.BodySendExtension` + `sse.SseResponse`: an SSE body goes straight to the server
once the response has started (the middleware chain sees only the start), and a HEAD request
(whose adapter must drop the body) still gets no body."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prospero.api.head import HeadAdapter
from prospero.api.middleware import BodySendExtension
from prospero.api.sse import SseResponse


def sse_response(chunks: list[bytes]) -> SseResponse:
    async def body() -> AsyncIterator[bytes]:
        for c in chunks:
            yield c

    resp = SseResponse.__new__(SseResponse)  # a response of these chunks, without a session
    StreamingResponse.__init__(resp, body(), media_type=SseResponse.media_type)
    resp._body_send = None
    return resp


class Counting:
    """A middleware that records the message types it forwards."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counting(message: Message) -> None:
            self.seen.append(message["type"])
            await send(message)

        await self.app(scope, receive, counting)


async def serve(app: ASGIApp, method: str) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    scope: Scope = {"type": "http", "method": method, "path": "/s", "asgi": {"spec_version": "2.4"}}
    await app(scope, receive, send)
    return sent


async def test_sse_body_bypasses_the_chain_after_the_start() -> None:
    chunks = [b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n"]
    counting = Counting(sse_response(chunks))
    sent = await serve(BodySendExtension(counting), "GET")
    assert [m["type"] for m in sent] == ["http.response.start"] + ["http.response.body"] * 4
    assert b"".join(m.get("body", b"") for m in sent) == b"".join(chunks)
    assert sent[-1]["more_body"] is False
    assert counting.seen == ["http.response.start"]  # status still seen by the chain


async def test_without_the_extension_the_body_goes_through_the_chain() -> None:
    counting = Counting(sse_response([b"data: 1\n\n"]))
    sent = await serve(counting, "GET")
    assert (
        counting.seen
        == [m["type"] for m in sent]
        == [
            "http.response.start",
            "http.response.body",
            "http.response.body",
        ]
    )


async def test_head_gets_no_body_even_with_the_extension() -> None:
    counting = Counting(sse_response([b"data: 1\n\n", b"data: 2\n\n"]))
    sent = await serve(BodySendExtension(HeadAdapter(counting)), "HEAD")
    assert sent[0]["type"] == "http.response.start"
    assert b"".join(m.get("body", b"") for m in sent) == b""
    assert "http.response.body" in counting.seen  # the body went to the HEAD adapter, dropped
