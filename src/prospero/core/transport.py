"""Byte transports to caliband and its agents (caliband-wire.md §1.3, §4.3).

Unix sockets carry no TLS and no token. TCP connections use TLS trusting only the configured
CA and verifying the configured server name, then send the `{"bearer": ...}` preamble line.
A token without TLS is refused: it would travel in clear.

The transport owns Prospero's address type, `Address` (`UnixAddress` | `TcpAddress`): what
the FleetProvider seam hands out (an agent's address, listed or from `attach`) and what the
drivers dial. It is independent of any backend's wire: caliband's endpoint models
(`wire.control.UnixEndpoint`/`TcpEndpoint`) are translated into it by `address_of`, at the
boundary of whatever speaks caliband (LocalFleet, K8sFleet's pod dial). The dialling functions
take caliband's endpoint models as well, read as the same address: the control client, the
testkit's fakes and the benchmarks dial caliband's endpoints as caliband wrote them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import orjson

from prospero.core.aio import wait_for
from prospero.core.errors import InvalidConfig, TransportError
from prospero.core.wire.control import Endpoint, UnixEndpoint

MAX_LINE = 1 << 20  # 1 MiB: longer lines are skipped and counted, never buffered whole
STREAM_LIMIT = MAX_LINE + 2


@dataclass(frozen=True)
class NetworkSecurity:
    """How to dial TCP endpoints. `ca_pem=None` means plaintext (only fakes accept that)."""

    ca_pem: bytes | None = None
    server_name: str = "caliband"
    token: str | None = None
    connect_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.token is not None and not self.token.strip():
            raise InvalidConfig("bearer token is empty")
        if self.token is not None and self.ca_pem is None:
            raise InvalidConfig("refusing a bearer token without TLS: the token would travel in clear")
        if self.ca_pem is not None and b"-----BEGIN CERTIFICATE-----" not in self.ca_pem:
            raise InvalidConfig("CA file contains no certificate")

    @classmethod
    def from_files(
        cls, ca_file: str | Path | None, token_file: str | Path | None, server_name: str = "caliband"
    ) -> NetworkSecurity:
        ca = Path(ca_file).read_bytes() if ca_file else None
        token = Path(token_file).read_text().rstrip() if token_file else None
        return cls(ca_pem=ca, server_name=server_name, token=token)

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.ca_pem is None:
            return None
        try:
            ctx = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH, cadata=self.ca_pem.decode())
        except (ssl.SSLError, ValueError) as e:
            raise InvalidConfig(f"cannot load CA: {e}") from e
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = True
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


@dataclass(frozen=True, slots=True)
class UnixAddress:
    """A Unix socket path (no TLS, no token)."""

    path: str
    scheme: ClassVar[Literal["unix"]] = "unix"


@dataclass(frozen=True, slots=True)
class TcpAddress:
    """A bare `host:port` (TLS + token per `NetworkSecurity`). Parsed when dialled, so a
    malformed one fails the dial (TransportError), not whoever merely passes it on."""

    addr: str
    scheme: ClassVar[Literal["tcp"]] = "tcp"

    def host_port(self) -> tuple[str, int]:
        host, _, port = self.addr.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bad tcp endpoint address {self.addr!r}")
        return host.strip("[]"), int(port)


Address = UnixAddress | TcpAddress
"""Where an agent (or a caliband) is reached."""

Dialable = Address | Endpoint
"""What the dialling functions accept: Prospero's address, or caliband's endpoint model."""


def address_of(endpoint: Dialable) -> Address:
    """caliband's endpoint model as Prospero's address (an Address is returned as it is)."""
    if isinstance(endpoint, UnixAddress | TcpAddress):
        return endpoint
    if isinstance(endpoint, UnixEndpoint):
        return UnixAddress(endpoint.path)
    return TcpAddress(endpoint.addr)


def describe(endpoint: Dialable) -> str:
    return endpoint.path if isinstance(endpoint, UnixEndpoint | UnixAddress) else endpoint.addr


async def open_endpoint(
    endpoint: Dialable, security: NetworkSecurity | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Dial an address (or caliband endpoint); for TCP do TLS + the bearer preamble. Raises
    TransportError."""
    sec = security or NetworkSecurity()
    address = address_of(endpoint)
    try:
        if isinstance(address, UnixAddress):
            reader, writer = await wait_for(
                asyncio.open_unix_connection(address.path, limit=STREAM_LIMIT),
                sec.connect_timeout,
            )
            return reader, writer
        host, port = address.host_port()
        ctx = sec.ssl_context()
        reader, writer = await wait_for(
            asyncio.open_connection(
                host,
                port,
                ssl=ctx,
                server_hostname=sec.server_name if ctx else None,
                limit=STREAM_LIMIT,
            ),
            sec.connect_timeout,
        )
    except InvalidConfig:
        raise
    except ssl.SSLError as e:
        raise TransportError(f"TLS failure dialing {describe(address)}: {e.reason or e}") from e
    except (OSError, TimeoutError, ValueError) as e:
        raise TransportError(f"cannot connect to {describe(address)}: {e or type(e).__name__}") from e
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if sec.token is not None:
        writer.write(orjson.dumps({"bearer": sec.token}) + b"\n")
        try:
            await writer.drain()
        except OSError as e:
            writer.close()
            raise TransportError(f"connection to {describe(address)} dropped: {e}") from e
    return reader, writer


class OversizedLine(Exception):
    """A line longer than MAX_LINE was read and discarded. `digest` identifies it."""

    def __init__(self, size: int, digest: bytes) -> None:
        super().__init__(f"line of {size} bytes exceeds the {MAX_LINE} byte limit")
        self.size = size
        self.digest = digest


async def read_line(reader: asyncio.StreamReader) -> bytes | None:
    """Read one newline-terminated line (without the newline). None at EOF.

    A partial line at EOF is discarded (the connection was cut mid-line; it will be replayed).
    A line over MAX_LINE is consumed and reported by raising OversizedLine.
    """
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError as e:
        digest = hashlib.blake2b(digest_size=8)
        size = 0
        consumed = e.consumed
        while True:
            try:
                chunk = await reader.readexactly(consumed)
                digest.update(chunk)
                size += len(chunk)
                tail = await reader.readuntil(b"\n")
            except asyncio.LimitOverrunError as e2:
                consumed = e2.consumed
                continue
            except asyncio.IncompleteReadError:
                return None
            digest.update(tail)
            size += len(tail)
            raise OversizedLine(size - 1, digest.digest()) from None
    if len(line) > MAX_LINE + 1:
        raise OversizedLine(len(line) - 1, hashlib.blake2b(line, digest_size=8).digest())
    return line[:-1]


READ_CHUNK = 256 * 1024


class LineReader:
    """Batched `read_line`: reads the stream in large chunks and splits the lines itself.

    `read_lines()` returns every complete line the next chunk(s) finish, in order: `bytes`
    (without the newline) or an `OversizedLine` for a line over MAX_LINE, which is consumed
    and digested as it streams by, never buffered whole. None at EOF; a partial line at EOF
    is discarded (the connection was cut mid-line; it will be replayed). Same results, line
    for line, as calling `read_line` repeatedly, at a fraction of the per-line cost.
    """

    __slots__ = ("_chunk", "_reader", "_skip", "_skip_size", "_tail", "_tail_size")

    def __init__(self, reader: asyncio.StreamReader, chunk_size: int = READ_CHUNK) -> None:
        self._reader = reader
        self._chunk = max(1, chunk_size)
        self._tail: list[bytes] = []  # pieces of the current (unterminated) line
        self._tail_size = 0
        self._skip: hashlib.blake2b | None = None  # digest of an oversized line being skipped
        self._skip_size = 0

    async def read_lines(self) -> list[bytes | OversizedLine] | None:
        """The next non-empty batch of lines, or None at EOF. Raises what the stream raises."""
        read = self._reader.read
        while True:
            chunk = await read(self._chunk)
            if not chunk:
                self._tail = []
                self._tail_size = 0
                self._skip = None
                return None
            lines = self._split(chunk)
            if lines:
                return lines

    def _split(self, chunk: bytes) -> list[bytes | OversizedLine]:
        parts: list[Any] = chunk.split(b"\n")
        rest: bytes = parts.pop()
        if not parts:  # no newline: the current line goes on
            self._extend(rest)
            return []
        first: bytes = parts[0]
        oversized = False
        if self._skip is not None:
            self._skip.update(first)
            self._skip.update(b"\n")
            parts[0] = OversizedLine(self._skip_size + len(first), self._skip.digest())
            self._skip = None
            self._skip_size = 0
        elif self._tail:
            self._tail.append(first)
            parts[0] = first = b"".join(self._tail)
            self._tail = []
            self._tail_size = 0
            oversized = len(first) > MAX_LINE
        else:
            oversized = len(first) > MAX_LINE
        if len(parts) > 1 and max(map(len, parts[1:])) > MAX_LINE:
            oversized = True
        if oversized:
            for i, p in enumerate(parts):
                if isinstance(p, bytes) and len(p) > MAX_LINE:
                    h = hashlib.blake2b(p, digest_size=8)
                    h.update(b"\n")
                    parts[i] = OversizedLine(len(p), h.digest())
        if rest:
            self._extend(rest)
        return parts

    def _extend(self, piece: bytes) -> None:
        if not piece:
            return
        if self._skip is not None:
            self._skip.update(piece)
            self._skip_size += len(piece)
            return
        self._tail.append(piece)
        self._tail_size += len(piece)
        if self._tail_size > MAX_LINE:  # over the limit before its end: stop buffering it
            h = hashlib.blake2b(digest_size=8)
            for p in self._tail:
                h.update(p)
            self._skip = h
            self._skip_size = self._tail_size
            self._tail = []
            self._tail_size = 0


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await wait_for(writer.wait_closed(), 2.0)


_BACKGROUND: set[asyncio.Task[None]] = set()


async def _drain_and_close(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, drain_timeout: float
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + drain_timeout
    try:
        while (left := deadline - loop.time()) > 0:
            try:
                chunk = await wait_for(reader.read(65536), left)
            except (TimeoutError, OSError):
                break
            if not chunk:
                break
    finally:
        await close_writer(writer)


async def send_one_line(
    endpoint: Dialable,
    security: NetworkSecurity | None,
    line: bytes,
    drain_timeout: float = 5.0,
    *,
    wait: bool = False,
) -> None:
    """Write one inbound frame on a fresh connection, as caliband-wire.md §4.3 prescribes:
    no-delay, flush, half-close, then drain the replay until EOF or a short deadline before
    closing (closing with unread replay bytes would reset the connection and can lose the frame).

    Returns once the frame is flushed to the kernel; the drain and close run in the background
    unless `wait` is set.
    """
    reader, writer = await open_endpoint(endpoint, security)
    try:
        writer.write(line if line.endswith(b"\n") else line + b"\n")
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError as e:
        await close_writer(writer)
        raise TransportError(f"sending to {describe(endpoint)} failed: {e}") from e
    if wait:
        await _drain_and_close(reader, writer, drain_timeout)
        return
    task = asyncio.get_running_loop().create_task(_drain_and_close(reader, writer, drain_timeout))
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
