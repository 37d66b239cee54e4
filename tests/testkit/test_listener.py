"""The three fakes (NDJSON worker, ACP agent endpoint, caliband control plane) admit TCP
connections through one piece (prospero.testkit.listener): TLS, then the bounded bearer
preamble; any failure drops the connection without a word."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from prospero.core.wire.control import TcpEndpoint
from prospero.testkit import listener, scripts
from prospero.testkit.certs import CertBundle, make_certs
from prospero.testkit.fake_acp import FakeAcpAgent
from prospero.testkit.fake_acp_listener import AcpAgentListener
from prospero.testkit.fake_agent import FakeAgentWorker
from prospero.testkit.fake_caliband import FakeCaliband

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def bundle() -> CertBundle:
    return make_certs()


Served = tuple[TcpEndpoint, Callable[[], int], Callable[[], Awaitable[None]]]


async def serve(kind: str, bundle: CertBundle) -> Served:
    """Start one fake on TCP + TLS + token: its endpoint, its auth-failure count, a stopper."""
    if kind == "worker":
        w = FakeAgentWorker("l1", [scripts.turn_start(0), scripts.sleep(3600)])
        ep = await w.serve_tcp("127.0.0.1", 0, bundle.server_context(), TOKEN)
        w.start()
        return ep, lambda: w.auth_failures, w.stop
    if kind == "acp":
        a = AcpAgentListener("l2", agent_factory=lambda: FakeAcpAgent())
        ep = await a.serve_tcp("127.0.0.1", 0, bundle.server_context(), TOKEN)
        return ep, lambda: a.auth_failures, a.stop
    fake = await FakeCaliband.start_tcp("127.0.0.1", 0, bundle.cert_pem, bundle.key_pem, TOKEN)
    ep = fake.endpoint
    assert isinstance(ep, TcpEndpoint)
    return ep, lambda: fake.auth_failures, fake.stop


async def dial(
    ep: TcpEndpoint, bundle: CertBundle, preamble: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    ctx = ssl.create_default_context(cadata=bundle.ca_pem.decode())
    host, port = ep.host_port()
    r, w = await asyncio.open_connection(host, port, ssl=ctx, server_hostname="localhost")
    w.write(preamble)
    await w.drain()
    return r, w


async def read_some(r: asyncio.StreamReader) -> bytes:
    """What the server sends before closing (b"" = dropped without a word)."""
    try:
        return await asyncio.wait_for(r.read(1), 10)
    except (ConnectionError, ssl.SSLError, OSError):
        return b""


@pytest.fixture(params=["worker", "acp", "caliband"])
async def served(request: pytest.FixtureRequest, bundle: CertBundle) -> AsyncIterator[Served]:
    s = await serve(str(request.param), bundle)
    yield s
    await s[2]()


async def closed(w: asyncio.StreamWriter) -> None:
    w.close()
    with contextlib.suppress(Exception):
        await w.wait_closed()


@pytest.mark.parametrize(
    "preamble",
    [
        b'{"bearer":"wrong"}\n',
        b'{"bearer": 42}\n',
        b"not json\n",
        b'{"bearer":"' + b"x" * 5000 + b'"}\n',  # over 4096 bytes before its newline
    ],
    ids=["wrong-token", "not-a-string", "not-json", "oversized"],
)
async def test_bad_preamble_is_dropped_silently(
    served: Served, bundle: CertBundle, preamble: bytes
) -> None:
    ep, failures, _stop = served
    r, w = await dial(ep, bundle, preamble)
    assert await read_some(r) == b""
    await closed(w)
    assert failures() == 1


REQUEST = {
    "worker": b"",  # the worker replays its history unasked
    "acp": b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n',
    "caliband": b'{"kind":"status"}\n',
}


@pytest.mark.parametrize("kind", ["worker", "acp", "caliband"])
async def test_good_preamble_is_served(bundle: CertBundle, kind: str) -> None:
    ep, failures, stop = await serve(kind, bundle)
    r, w = await dial(ep, bundle, b'{"bearer":"' + TOKEN.encode() + b'"}\n' + REQUEST[kind])
    got: Any = await asyncio.wait_for(r.readline(), 10)
    assert got.endswith(b"\n") and failures() == 0
    await closed(w)
    await stop()


async def test_a_silent_client_is_dropped_after_the_bound(
    served: Served, bundle: CertBundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listener, "HANDSHAKE_BOUND", 0.2)
    ep, failures, _stop = served
    r, w = await dial(ep, bundle, b'{"bearer":')  # never finishes its line
    assert await read_some(r) == b""
    await closed(w)
    assert failures() == 1
