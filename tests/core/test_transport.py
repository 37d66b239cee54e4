"""Byte transports: Unix, TCP+TLS+bearer preamble, line reading, one-shot inbound frames."""

from __future__ import annotations

import asyncio
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from prospero.core.errors import InvalidConfig, TransportError
from prospero.core.transport import (
    MAX_LINE,
    STREAM_LIMIT,
    NetworkSecurity,
    OversizedLine,
    describe,
    open_endpoint,
    read_line,
    send_one_line,
)
from prospero.core.wire.control import Endpoint, TcpEndpoint, UnixEndpoint
from prospero.testkit import scripts
from prospero.testkit.certs import CertBundle, make_certs
from prospero.testkit.fake_agent import FakeAgentWorker
from tests.support import short_tmpdir, wait_until

TOKEN = "transport-token"


@pytest.fixture(scope="module")
def certs() -> CertBundle:
    return make_certs()


@pytest.fixture
def sockdir() -> Iterator[str]:
    d = short_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


# --- NetworkSecurity -----------------------------------------------------------------------------


def test_security_validation(tmp_path: Path, certs: CertBundle) -> None:
    with pytest.raises(InvalidConfig, match="empty"):
        NetworkSecurity(ca_pem=certs.ca_pem, token="  ")
    with pytest.raises(InvalidConfig, match="without TLS"):
        NetworkSecurity(token="t")
    with pytest.raises(InvalidConfig, match="no certificate"):
        NetworkSecurity(ca_pem=b"not a pem")
    assert NetworkSecurity().ssl_context() is None
    bad_pem = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    with pytest.raises(InvalidConfig, match="cannot load CA"):
        NetworkSecurity(ca_pem=bad_pem).ssl_context()
    files = certs.write(tmp_path)
    tok = tmp_path / "token"
    tok.write_text("abc123\n\n")
    sec = NetworkSecurity.from_files(files.ca, tok, server_name="localhost")
    assert sec.token == "abc123" and sec.server_name == "localhost" and sec.ca_pem == certs.ca_pem
    assert oct(files.key.stat().st_mode & 0o777) == "0o600"
    assert NetworkSecurity.from_files(None, None) == NetworkSecurity()


def test_describe() -> None:
    assert describe(UnixEndpoint(path="/x.sock")) == "/x.sock"
    assert describe(TcpEndpoint(addr="h:1")) == "h:1"
    assert TcpEndpoint(addr="[::1]:7100").host_port() == ("::1", 7100)
    with pytest.raises(ValueError):
        TcpEndpoint(addr="no-port").host_port()


# --- read_line ---------------------------------------------------------------------------------


def _reader(data: bytes) -> asyncio.StreamReader:
    r = asyncio.StreamReader(limit=STREAM_LIMIT)
    r.feed_data(data)
    r.feed_eof()
    return r


async def test_read_line_basic_and_partial_tail() -> None:
    r = _reader(b'{"a":1}\n\n{"b":2}\r\npartial')
    assert await read_line(r) == b'{"a":1}'
    assert await read_line(r) == b""
    assert await read_line(r) == b'{"b":2}\r'
    assert await read_line(r) is None  # the cut-off tail is discarded


async def test_read_line_oversized_is_skipped_and_reported() -> None:
    big = b"x" * (MAX_LINE + 10)
    r = _reader(b"ok\n" + big + b"\nafter\n")
    assert await read_line(r) == b"ok"
    with pytest.raises(OversizedLine) as ei:
        await read_line(r)
    assert ei.value.size == len(big) and len(ei.value.digest) == 8
    assert await read_line(r) == b"after"
    exact = b"y" * MAX_LINE
    assert await read_line(_reader(exact + b"\n")) == exact
    assert await read_line(_reader(big)) is None  # oversized and unterminated


# --- dialing ---------------------------------------------------------------------------------


async def test_unix_stream(sockdir: str) -> None:
    w = FakeAgentWorker("a", scripts.text_script(3), linger=0)
    ep = await w.serve_unix(f"{sockdir}/a.sock")
    w.pause()
    w.start()
    reader, writer = await open_endpoint(ep)
    w.resume()
    lines = []
    while (ln := await read_line(reader)) is not None:
        lines.append(ln)
    writer.close()
    assert lines == w.history


async def test_tls_preamble_is_first_line_and_nodelay(certs: CertBundle) -> None:
    got: list[bytes] = []
    nodelay: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.append(await reader.readline())
        got.append(await reader.readline())
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=certs.server_context())
    port = server.sockets[0].getsockname()[1]
    try:
        sec = NetworkSecurity(ca_pem=certs.ca_pem, token=TOKEN)
        reader, writer = await open_endpoint(TcpEndpoint(addr=f"127.0.0.1:{port}"), sec)
        sock = writer.get_extra_info("socket")
        nodelay.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.write(b'{"kind":"list"}\n')
        await writer.drain()
        assert await reader.read() == b""
        writer.close()
    finally:
        server.close()
    assert got == [orjson.dumps({"bearer": TOKEN}) + b"\n", b'{"kind":"list"}\n']
    assert nodelay == [1]


async def test_connect_failures_are_transport_errors(sockdir: str, certs: CertBundle) -> None:
    with pytest.raises(TransportError, match="cannot connect"):
        await open_endpoint(UnixEndpoint(path=f"{sockdir}/missing.sock"))
    with pytest.raises(TransportError):
        await open_endpoint(TcpEndpoint(addr="bad-address"))
    # a plaintext server behind a TLS client: a TLS failure, not a hang
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(TransportError):
            await asyncio.wait_for(
                open_endpoint(
                    TcpEndpoint(addr=f"127.0.0.1:{port}"), NetworkSecurity(ca_pem=certs.ca_pem)
                ),
                10,
            )
    finally:
        server.close()


async def test_connect_timeout(certs: CertBundle) -> None:
    """A TLS server that never answers the handshake hits the connect timeout."""
    hold = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await hold.wait()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)  # plaintext: never speaks TLS
    port = server.sockets[0].getsockname()[1]
    try:
        sec = NetworkSecurity(ca_pem=certs.ca_pem, connect_timeout=0.2)
        with pytest.raises(TransportError, match="cannot connect"):
            await open_endpoint(TcpEndpoint(addr=f"127.0.0.1:{port}"), sec)
    finally:
        hold.set()
        server.close()


# --- send_one_line ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["unix", "tls"])
async def test_send_one_line_delivers_and_drains_replay(
    mode: str, sockdir: str, certs: CertBundle
) -> None:
    # a long replay makes the write-only connection receive lots of bytes it must drain
    script = [*scripts.long_script(2000)[:-1], scripts.wait_input(), scripts.run_end()]
    w = FakeAgentWorker("a", script, interactive=True)
    ep: Endpoint
    if mode == "unix":
        ep = await w.serve_unix(f"{sockdir}/a.sock")
        sec = None
    else:
        ep = await w.serve_tcp("127.0.0.1", 0, certs.server_context(), TOKEN)
        sec = NetworkSecurity(ca_pem=certs.ca_pem, token=TOKEN)
    w.start()
    await wait_until(lambda: w.waiting_input, 10)
    for i in range(3):
        await send_one_line(
            ep, sec, orjson.dumps({"type": "UserMessage", "text": f"m{i}"}), drain_timeout=0.3
        )
    await wait_until(lambda: w.replies_emitted == 3, 10)
    assert [f["text"] for f in w.inbound] == [f"m{i}" for i in range(3)]
    await send_one_line(ep, sec, b'{"type":"EndInput"}\n', drain_timeout=0.3)
    assert await w.wait_finished(10) == 0
    assert w.auth_failures == 0


async def test_send_one_line_to_dead_endpoint(sockdir: str) -> None:
    with pytest.raises(TransportError):
        await send_one_line(UnixEndpoint(path=f"{sockdir}/gone.sock"), None, b'{"type":"EndInput"}')
