"""Knobs of the HTTP layer (the daemon fills them from its config; tests shrink the timers)."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_BODY_BYTES = 1024 * 1024


@dataclass
class ApiSettings:
    # token name -> token; empty = no authentication.
    api_tokens: dict[str, str] = field(default_factory=dict)
    max_body_bytes: int = MAX_BODY_BYTES
    # Seconds of silence on an SSE stream before a `: heartbeat` comment line.
    heartbeat_interval: float = 15.0
    # Items buffered per SSE connection between the store/bus follower and the socket. A
    # consumer slower than this makes the follower lag; it then self-heals with a `gap` event
    # and a replay from the store, so memory per connection stays bounded.
    stream_buffer: int = 256
    # Write an access-log line per request (path only: the query string may hold a token).
    access_log: bool = True
