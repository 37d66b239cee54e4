"""Slow and abusive clients against a real prosperod HTTP server on a real socket: slowloris
header trickling (1,000 sockets), a keep-alive connection stalling mid-headers, a stalled body,
and the bound on concurrent connections."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from prospero.api.app import create_app
from prospero.api.server import ApiServer
from prospero.api.settings import ApiSettings
from prospero.daemon.runtime import DaemonConfig, Runtime
from tests.support import wait_until

SLOWLORIS = 1000
# Generous for a loaded 2-core CI box: 1,000 connects can take over a second there.
HEADER_TIMEOUT = 5.0
BODY_TIMEOUT = 1.0
# How much later than its deadline the server may close a connection (scheduling, 1,000 closes).
CLOSE_MARGIN = 3.0
# Client-side clocks start when the connect returns, a little after the server's accept.
EARLY_SLACK = 0.75
# asyncio timers may fire a hair early relative to time.monotonic() in another task.
TIMER_SLACK = 0.98
# Pace of the trickled bytes: well under the header timeout, so they would keep a naive
# idle timer from ever firing.
TRICKLE_INTERVAL = 0.25
# A normal request while the slowloris sockets are held must be answered within this.
PROMPT = HEADER_TIMEOUT / 2
READ_LIMIT = 65536


@dataclass
class Server:
    server: ApiServer
    runtime: Runtime

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return self.server.url


ServerFactory = Callable[..., Awaitable[Server]]


@pytest.fixture
async def make_server(tmp_path: Path) -> AsyncIterator[ServerFactory]:
    servers: list[Server] = []

    async def factory(**settings: Any) -> Server:
        cfg = DaemonConfig(
            bind_host="127.0.0.1",
            port=0,
            data_dir=tmp_path / f"data{len(servers)}",
            autostart=False,
            poll_interval=0.05,
        )
        runtime = Runtime(cfg)
        await runtime.start()
        app = create_app(runtime, ApiSettings(**settings))
        server = ApiServer(app, "127.0.0.1", 0, graceful_timeout=3)
        await server.start()
        s = Server(server, runtime)
        servers.append(s)
        return s

    yield factory

    for s in reversed(servers):
        await s.server.stop()
        await s.runtime.stop()


@pytest.fixture(autouse=True)
def enough_fds() -> None:
    """Client and server ends of every socket live in this process: make sure the soft
    RLIMIT_NOFILE allows them (never lowered)."""
    need = 4 * SLOWLORIS + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def request_head(path: str = "/healthz", port: int = 0) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()


class Conn:
    """One raw client connection that records when the server closed it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.opened = time.monotonic()
        self.received = b""
        self.closed_at: float | None = None
        self._watch = asyncio.create_task(self._read_to_eof())

    @classmethod
    async def open(cls, port: int) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=READ_LIMIT)
        return cls(reader, writer)

    async def _read_to_eof(self) -> None:
        with contextlib.suppress(OSError):
            while chunk := await self.reader.read(READ_LIMIT):
                self.received += chunk
        self.closed_at = time.monotonic()

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    def send(self, data: bytes) -> None:
        if self.closed or self.writer.is_closing():
            return
        with contextlib.suppress(OSError, RuntimeError):
            self.writer.write(data)

    async def aclose(self) -> None:
        self._watch.cancel()
        with contextlib.suppress(BaseException):
            await self._watch
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def trickle(conns: list[Conn]) -> None:
    """Send one more header byte on every still-open connection, again and again."""
    while True:
        for c in conns:
            c.send(b"a")
        await asyncio.sleep(TRICKLE_INTERVAL)


def complete_response(raw: bytes) -> bool:
    """One whole Content-Length framed response is in `raw`."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def body_of(raw: bytes) -> Any:
    return orjson.loads(raw.split(b"\r\n\r\n", 1)[1])


async def test_slowloris_sockets_are_closed_and_others_served(
    make_server: ServerFactory,
) -> None:
    srv = await make_server(header_timeout=HEADER_TIMEOUT)
    t_open = time.monotonic()
    conns = await asyncio.gather(*(Conn.open(srv.port) for _ in range(SLOWLORIS)))
    opened_in = time.monotonic() - t_open
    first_opened = min(c.opened for c in conns)
    for c in conns:  # a partial request: the line and a header that never ends
        c.send(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nX-Slow: ".encode())
    dripper = asyncio.create_task(trickle(conns))
    try:
        await wait_until(
            lambda: srv.runtime.metrics.get("api_connections") >= SLOWLORIS,
            HEADER_TIMEOUT,
            interval=0.01,
            what="every slowloris socket accepted by the server",
        )
        # While all of them are held (and dripping), a normal client is served promptly.
        async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
            t0 = time.monotonic()
            r = await client.get("/healthz")
            served_in = time.monotonic() - t0
            assert r.status_code == 200, r.text
            assert served_in < PROMPT, served_in
            assert sum(c.closed for c in conns) == 0, "closed before their deadline"
        # (That client's connection is closed here: left idle, it would meet its own header
        # deadline for a next request, and be counted with the slowloris ones.)
        await wait_until(
            lambda: all(c.closed for c in conns),
            HEADER_TIMEOUT + CLOSE_MARGIN + 1,
            interval=0.05,
            what="every slowloris socket closed by the server",
        )
        # ...and still served afterwards (on a new connection: the first one idled past its
        # keep-alive and header deadlines meanwhile, and reusing it would race its close).
        async with httpx.AsyncClient(base_url=srv.url, timeout=10) as again:
            assert (await again.get("/healthz")).status_code == 200
    finally:
        dripper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dripper
    lifetimes = [c.closed_at - c.opened for c in conns if c.closed_at is not None]
    all_closed_after = max(c.closed_at for c in conns if c.closed_at is not None) - first_opened
    print(
        f"{SLOWLORIS} slowloris sockets opened in {opened_in:.2f} s; served a normal request in {served_in * 1000:.1f} ms; "
        f"closed after {min(lifetimes):.2f}..{max(lifetimes):.2f} s each "
        f"(header timeout {HEADER_TIMEOUT} s), all gone {all_closed_after:.2f} s after the first "
        "opened"
    )
    # Never early: the server accepted each socket after t_open, and its deadline runs from
    # the accept (a client's own `opened` stamp can lag its accept by seconds under load).
    earliest_close = min(c.closed_at for c in conns if c.closed_at is not None) - t_open
    assert earliest_close >= HEADER_TIMEOUT * TIMER_SLACK, earliest_close
    assert max(lifetimes) <= HEADER_TIMEOUT + CLOSE_MARGIN, max(lifetimes)
    assert srv.runtime.metrics.get("api_header_timeouts") == SLOWLORIS
    await wait_until(
        lambda: srv.runtime.metrics.get("api_connections") <= 1, CLOSE_MARGIN, what="gauge"
    )
    # They had sent part of a request: each was told why before the close.
    for c in conns:
        assert status_of(c.received) == 408, c.received[:200]
        assert body_of(c.received)["kind"] == "request_timeout"
    t_close = time.monotonic()
    await asyncio.gather(*(c.aclose() for c in conns))
    print(f"client side closed in {time.monotonic() - t_close:.2f} s")


async def test_silent_connection_is_closed_without_a_response(make_server: ServerFactory) -> None:
    srv = await make_server(header_timeout=HEADER_TIMEOUT / 4)
    c = await Conn.open(srv.port)
    await wait_until(lambda: c.closed, HEADER_TIMEOUT / 4 + CLOSE_MARGIN, what="silent conn closed")
    assert c.received == b""  # nothing asked, nothing answered
    await c.aclose()


async def test_keep_alive_connection_stalling_mid_headers_is_closed(
    make_server: ServerFactory,
) -> None:
    timeout = HEADER_TIMEOUT / 2
    srv = await make_server(header_timeout=timeout)
    c = await Conn.open(srv.port)
    c.send(request_head("/healthz", srv.port))
    await wait_until(lambda: complete_response(c.received) or c.closed, 5, what="1st response")
    assert status_of(c.received) == 200 and not c.closed
    first_response = c.received
    c.received = b""
    response_done = time.monotonic()
    # The second request starts, then stalls mid-headers while dripping bytes.
    c.send(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nX-Slow: ".encode())
    dripper = asyncio.create_task(trickle([c]))
    try:
        await wait_until(
            lambda: c.closed, timeout + CLOSE_MARGIN, interval=0.02, what="stalled conn"
        )
    finally:
        dripper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dripper
    assert c.closed_at is not None
    held = c.closed_at - response_done
    assert timeout * EARLY_SLACK <= held <= timeout + CLOSE_MARGIN, held
    assert status_of(c.received) == 408, c.received
    assert b"connection: close" in c.received.lower()
    assert first_response
    await c.aclose()


async def test_keep_alive_requests_each_get_a_fresh_deadline(make_server: ServerFactory) -> None:
    """A client that sends complete requests one after another on one connection is never cut
    off: the deadline restarts at the end of every response."""
    timeout = HEADER_TIMEOUT / 4
    srv = await make_server(header_timeout=timeout)
    c = await Conn.open(srv.port)
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < 2 * timeout:  # past the first request's deadline
        c.received = b""
        c.send(request_head("/healthz", srv.port))
        await wait_until(lambda: complete_response(c.received) or c.closed, 5, what="response")
        assert not c.closed and status_of(c.received) == 200
        n += 1
    assert n > 1
    await c.aclose()


async def test_stalled_body_gets_408_within_the_body_timeout(make_server: ServerFactory) -> None:
    srv = await make_server(header_timeout=HEADER_TIMEOUT, body_timeout=BODY_TIMEOUT)
    c = await Conn.open(srv.port)
    head = (
        f"POST /api/workspaces HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n"
        "Content-Type: application/json\r\nX-Prospero-Client: test\r\n"
        "Content-Length: 200\r\n\r\n"
    )
    c.send(head.encode() + b'{"name": "w", ')
    sent = time.monotonic()
    dripper = asyncio.create_task(trickle([c]))  # a byte of body now and then: never completes
    try:
        await wait_until(
            lambda: c.closed, BODY_TIMEOUT + CLOSE_MARGIN, interval=0.02, what="408 and close"
        )
    finally:
        dripper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dripper
    assert c.closed_at is not None
    held = c.closed_at - sent
    assert BODY_TIMEOUT * EARLY_SLACK <= held <= BODY_TIMEOUT + CLOSE_MARGIN, held
    assert status_of(c.received) == 408, c.received
    assert body_of(c.received) == {
        "error": f"request body not received within {BODY_TIMEOUT:g}s",
        "kind": "request_timeout",
    }
    assert srv.runtime.metrics.get("api_body_timeouts") == 1
    await c.aclose()


async def test_connections_over_the_bound_are_refused_then_served_again(
    make_server: ServerFactory,
) -> None:
    bound = 8
    srv = await make_server(header_timeout=30.0, max_connections=bound)
    held = [await Conn.open(srv.port) for _ in range(bound)]
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:

        async def refused() -> bool:
            r = await client.get("/healthz", headers={"Connection": "close"})
            return r.status_code == 503

        await wait_until(refused, 5, interval=0.02, what="503 once the bound is reached")
        r = await client.get("/healthz", headers={"Connection": "close"})
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        assert r.json()["kind"] == "unavailable"
        assert not any(c.closed for c in held)  # the held ones are not disturbed
        assert srv.runtime.metrics.get("api_connections_refused") >= 2

        await asyncio.gather(*(c.aclose() for c in held))

        async def served() -> bool:
            r = await client.get("/healthz", headers={"Connection": "close"})
            return r.status_code == 200

        await wait_until(served, 5, interval=0.02, what="served again once connections closed")
        # A keep-alive client is one connection: many requests within the bound.
        for _ in range(3 * bound):
            assert (await client.get("/healthz")).status_code == 200


async def test_stop_with_half_sent_connections_open(make_server: ServerFactory) -> None:
    srv = await make_server(header_timeout=30.0)
    conns = await asyncio.gather(*(Conn.open(srv.port) for _ in range(50)))
    for c in conns[:25]:
        c.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    for c in conns[25:]:
        c.send(b"POST /api/workspaces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 90\r\n\r\n{")
    t0 = time.monotonic()
    await srv.server.stop()
    stopped_in = time.monotonic() - t0
    await wait_until(lambda: all(c.closed for c in conns), 5, what="connections closed by stop")
    assert stopped_in < 5, stopped_in
    await asyncio.gather(*(c.aclose() for c in conns))
