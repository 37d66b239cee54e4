"""Quiet the ACP SDK's reports of an ordinary disconnect.

`agent-client-protocol` 0.12.1 logs a dropped peer connection (reset, broken pipe, a TLS
connection cut without close_notify) on the root logger at ERROR, with a full traceback, from
its receive loop, its send loop and its task supervisor. For a control plane that is ordinary
traffic: an agent exits, a peer restarts, prosperod shuts its drivers down; the driver itself
logs what the loss means (turn lost, reconnecting). `AcpDisconnectFilter`, installed on the
log handlers by prosperod (and the standalone fake caliband), turns exactly those records into
a one-line DEBUG record (dropped unless DEBUG logging is on). Anything else the SDK reports —
a parse error, an unexpected exception type — keeps its level and traceback.

Likewise a `session/update` the SDK cannot validate (an update kind newer than the pinned SDK,
acp.md pitfall 3): the SDK logs it at ERROR with a traceback, while the ACP driver's raw
observer has already recorded it with one warning line (`acp_unknown_updates`). The filter
turns that SDK record into a DEBUG line too.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

from pydantic import ValidationError

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
SDK_NOTIFICATION_MESSAGE = "Unhandled error while handling notification method=%s"
# Notifications the ACP driver records itself from its raw observer.
OBSERVED_NOTIFICATIONS = frozenset({"session/update"})


def _unknown_update(record: logging.LogRecord) -> bool:
    if record.msg != SDK_NOTIFICATION_MESSAGE or not isinstance(record.args, tuple):
        return False
    exc = record.exc_info[1] if record.exc_info else None
    return (
        bool(record.args)
        and record.args[0] in OBSERVED_NOTIFICATIONS
        and isinstance(exc, ValidationError)
    )


class AcpDisconnectFilter(logging.Filter):
    """Demote the SDK's disconnect tracebacks to one DEBUG line (see the module doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "root":
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if _unknown_update(record):
            method = record.args[0] if isinstance(record.args, tuple) else "?"
            errors = exc.error_count() if isinstance(exc, ValidationError) else 0
            record.msg = f"ACP SDK dropped an unrecognised {method} ({errors} validation errors)"
        elif record.msg in SDK_CONNECTION_MESSAGES and isinstance(exc, DISCONNECT_ERRORS):
            record.msg = f"ACP connection ended ({record.msg.lower()}): {exc!r}"
        else:
            return True
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
