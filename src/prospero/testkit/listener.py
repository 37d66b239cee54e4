"""The listener scaffolding every fake shares: `fake_agent` (NDJSON worker), `fake_acp` (ACP
agent endpoint) and `fake_caliband` (control plane) admit connections the same way, as
caliban does (caliband-wire.md §1.3):

- Unix: no handshake at all.
- TCP: the TLS handshake (bounded: `HANDSHAKE_BOUND` seconds), then, when a token is set, the
  `{"bearer": "<token>"}` preamble line: read up to the first newline and at most
  `PREAMBLE_MAX` bytes (a longer line is refused before its end), within the same bound,
  compared in constant time. Any failure drops the connection without a word (the transport
  is aborted; nothing is written back).

`listen_tcp` / `listen_unix` open the servers with these rules; `admit` runs the preamble
check on an accepted connection.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson

from prospero.core.aio import wait_for

PREAMBLE_MAX = 4096
HANDSHAKE_BOUND = 10.0

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def tcp_addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def read_bearer_preamble(reader: asyncio.StreamReader, token: str) -> bool:
    """Read the `{"bearer": ...}` line byte by byte (never past its newline, max 4096 bytes)
    and compare it with `token` in constant time."""
    buf = bytearray()
    while True:
        b = await reader.read(1)
        if not b:
            return False
        if b == b"\n":
            break
        buf += b
        if len(buf) >= PREAMBLE_MAX:
            return False
    try:
        obj = orjson.loads(bytes(buf))
    except orjson.JSONDecodeError:
        return False
    bearer = obj.get("bearer") if isinstance(obj, dict) else None
    if not isinstance(bearer, str):
        return False
    return hmac.compare_digest(bearer.encode(), token.encode())


async def admit(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str | None
) -> bool:
    """The bearer check of an accepted connection (`token=None`: nothing to check). On
    failure the connection is dropped silently and False is returned (callers count it)."""
    if token is None:
        return True
    try:
        ok = await wait_for(read_bearer_preamble(reader, token), HANDSHAKE_BOUND)
    except (TimeoutError, OSError, ssl.SSLError, asyncio.IncompleteReadError):
        ok = False
    if not ok:
        writer.transport.abort()
    return ok


async def listen_tcp(
    handler: Handler,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    *,
    limit: int,
) -> asyncio.Server:
    """A TCP server (port 0 = ephemeral) with a bounded TLS handshake; `ssl_context=None`
    serves plaintext, which only a fake allows."""
    return await asyncio.start_server(
        handler,
        host=host,
        port=port,
        ssl=ssl_context,
        ssl_handshake_timeout=HANDSHAKE_BOUND if ssl_context else None,
        limit=limit,
    )


async def listen_unix(handler: Handler, path: str, *, limit: int) -> tuple[asyncio.Server, int]:
    """A Unix server at `path` (parent dirs made); returns it with the socket's inode, so the
    owner unlinks only its own socket at exit."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    server = await asyncio.start_unix_server(handler, path=path, limit=limit)
    return server, os.stat(path).st_ino


def bound_port(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])
