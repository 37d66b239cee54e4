"""Process-lifetime counters and gauges, shared by the core and exported by the API."""

from __future__ import annotations

import threading
from collections import Counter


class Metrics:
    """Named counters (monotonic) and gauges. Cheap enough for the ingest hot path."""

    def __init__(self) -> None:
        self._counters: Counter[str] = Counter()
        self._gauges: dict[str, float] = {}
        self._lock = threading.Lock()

    def inc(self, name: str, by: int = 1) -> None:
        self._counters[name] += by

    def set_gauge(self, name: str, value: float) -> None:
        self._gauges[name] = value

    def add_gauge(self, name: str, by: float) -> None:
        self._gauges[name] = self._gauges.get(name, 0) + by

    def get(self, name: str) -> float:
        if name in self._gauges:
            return self._gauges[name]
        return self._counters.get(name, 0)

    def counters(self) -> dict[str, int]:
        """Monotonic counters only (for typed exports such as Prometheus text)."""
        with self._lock:
            return dict(self._counters)

    def gauges(self) -> dict[str, float]:
        with self._lock:
            return dict(self._gauges)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            out: dict[str, float] = dict(self._counters)
            out.update(self._gauges)
            return out


# Counter names used across the core (kept here so the API can document them).
EVENTS_APPENDED = "events_appended"
APPEND_FAILURES = "append_failures"
# Events a fenced emitter dropped: written under a lease this replica no longer holds.
EVENTS_FENCED = "events_fenced"
UNKNOWN_FRAMES = "unknown_frames"
MALFORMED_LINES = "malformed_lines"
OVERSIZED_LINES = "oversized_lines"
STREAM_GAPS = "stream_gaps"
REPOS_POLLED = "repos_polled"
POLL_FAILURES = "poll_failures"
ACTIVE_ATTACHES = "active_attaches"
ATTACH_RECONNECTS = "attach_reconnects"
TRANSCRIPT_RECOVERIES = "transcript_recoveries"
BUS_LAGGED = "bus_lagged"
