"""Quiet the ACP SDK's reports of an ordinary disconnect.

`agent-client-protocol` 0.12.1 logs a dropped peer connection (reset, broken pipe, a TLS
connection cut without close_notify) on the root logger at ERROR, with a full traceback, from
its receive loop, its send loop and its task supervisor. For a control plane that is ordinary
traffic: an agent exits, a peer restarts, prosperod shuts its drivers down; the driver itself
logs what the loss means (turn lost, reconnecting). `AcpDisconnectFilter`, installed on the
log handlers by prosperod (and the standalone fake caliband), turns exactly those records into
a one-line DEBUG record (dropped unless DEBUG logging is on). Anything else the SDK reports —
a parse error, an unexpected exception type — keeps its level and traceback.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

SDK_CONNECTION_MESSAGES = frozenset(
    {
        "Connection main loop failed",
        "Receive loop failed",
        "Send loop failed",
        "Background task failed",
    }
)
DISCONNECT_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,
    ssl.SSLError,
    asyncio.IncompleteReadError,
)


class AcpDisconnectFilter(logging.Filter):
    """Demote the SDK's disconnect tracebacks to one DEBUG line (see the module doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "root" or record.msg not in SDK_CONNECTION_MESSAGES:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, DISCONNECT_ERRORS):
            return True
        record.msg = f"ACP connection ended ({record.msg.lower()}): {exc!r}"
        record.args = None
        record.levelno = logging.DEBUG
        record.levelname = logging.getLevelName(logging.DEBUG)
        record.exc_info = None
        record.exc_text = None
        return logging.getLogger().isEnabledFor(logging.DEBUG)


def install(handler: logging.Handler) -> None:
    """Add the filter to `handler` once."""
    if not any(isinstance(f, AcpDisconnectFilter) for f in handler.filters):
        handler.addFilter(AcpDisconnectFilter())
