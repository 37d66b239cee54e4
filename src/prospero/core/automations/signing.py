"""Webhook signatures of automations (docs/automations.md).

`X-Prospero-Signature: sha256=<hex>` is HMAC-SHA256 keyed with the automation's secret over
the raw request body, or — when the sender also sends `X-Prospero-Timestamp: <unix seconds>` —
over `"<timestamp>." + body`; a timestamp further than the replay window from now is refused.
The comparison is `hmac.compare_digest`. Every refusal is a `SignatureRejected` naming its
reason (`missing`, `malformed`, `forged`, `stale`); nothing about the expected value leaks.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from prospero.core.errors import ProsperoError

SIGNATURE_HEADER = "X-Prospero-Signature"
TIMESTAMP_HEADER = "X-Prospero-Timestamp"
_SIG = re.compile(r"sha256=([0-9a-fA-F]{64})")
_TS = re.compile(r"[0-9]{1,12}")


class SignatureRejected(ProsperoError):
    kind = "unauthorized"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def sign(secret: str, body: bytes, timestamp: int | str | None = None) -> str:
    """The header value a sender sends: `sha256=<hex>`."""
    msg = body if timestamp is None else f"{timestamp}.".encode() + body
    return "sha256=" + hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def verify(
    secret: str,
    body: bytes,
    signature: str | None,
    timestamp: str | None,
    *,
    now: float,
    window: float,
) -> str:
    """The signature's hex digest (the replay key) when it is valid; else SignatureRejected."""
    if signature is None or not signature.strip():
        raise SignatureRejected("missing", f"missing {SIGNATURE_HEADER} header")
    m = _SIG.fullmatch(signature.strip())
    if m is None:
        raise SignatureRejected(
            "malformed", f"malformed {SIGNATURE_HEADER}: expected sha256=<64 hex digits>"
        )
    given = m.group(1).lower()
    ts: str | None = None
    if timestamp is not None:
        ts = timestamp.strip()
        if not _TS.fullmatch(ts):
            raise SignatureRejected(
                "malformed", f"malformed {TIMESTAMP_HEADER}: expected unix seconds"
            )
    expected = sign(secret, body, ts)[len("sha256=") :]
    if not hmac.compare_digest(expected.encode(), given.encode()):
        raise SignatureRejected("forged", "webhook signature does not match")
    if ts is not None and abs(now - int(ts)) > window:
        raise SignatureRejected(
            "stale", f"{TIMESTAMP_HEADER} is outside the {window:.0f} s replay window"
        )
    return given
