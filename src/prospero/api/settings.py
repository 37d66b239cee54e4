"""Knobs of the HTTP layer (the daemon fills them from its config; tests shrink the timers)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prospero.core.tokens import TokenTable

MAX_BODY_BYTES = 1024 * 1024


@dataclass
class ApiSettings:
    # API authentication (api/auth.py): the token table (no token source = auth off), the HMAC
    # key of dashboard session cookies (None = random per process), the session lifetime (s),
    # and the per-client-IP bound on failed authentication attempts: `auth_failure_limit`
    # failures within `auth_failure_window` seconds answer 429 (0 = no limit).
    tokens: TokenTable = field(default_factory=TokenTable)
    session_key: bytes | None = None
    session_ttl: float = 12 * 3600.0
    auth_failure_limit: int = 20
    auth_failure_window: float = 60.0
    max_body_bytes: int = MAX_BODY_BYTES
    # Seconds of silence on an SSE stream before a `: heartbeat` comment line.
    heartbeat_interval: float = 15.0
    # Write an access-log line per request (path only: the query string may hold a token).
    access_log: bool = True
    # Slow clients (api/h11_protocol.py, BodyLimitMiddleware): seconds a request gets for its
    # request line + headers (from connection open / the previous response's end; trickled
    # bytes do not extend it) and for its whole body; concurrent connections beyond the bound
    # are refused with 503.
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 2048
    # Host allowlist beyond the loopback names (api/guard.py): names, IPs, `*.suffix`, or `*`
    # (= no check, unsafe); public origins (`https://host[:port]`, from --public-url) are
    # accepted as same-origin and their hosts are allowed.
    allowed_hosts: list[str] = field(default_factory=list)
    public_origins: list[str] = field(default_factory=list)
