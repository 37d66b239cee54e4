"""Prometheus text exposition (format 0.0.4) of the process Metrics.

Every counter is exported as `prospero_<name>_total` (type counter), every gauge as
`prospero_<name>` (type gauge). Well-known names are always present, at 0 until first bumped,
so dashboards and alerts do not see series appear out of nowhere.
"""

from __future__ import annotations

import re

from prospero.core import metrics as m
from prospero.core.metrics import Metrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "prospero_"

API_SSE_STREAMS = "api_sse_streams"

COUNTER_HELP: dict[str, str] = {
    m.EVENTS_APPENDED: "Events appended to the event store.",
    m.EVENTS_FENCED: "Events dropped by a fenced emitter: written under a lease this replica no longer holds.",
    m.APPEND_FAILURES: "Failed event-store appends.",
    m.UNKNOWN_FRAMES: "Agent stream frames of an unknown type (skipped).",
    m.MALFORMED_LINES: "Agent stream lines that were not valid JSON (skipped).",
    m.OVERSIZED_LINES: "Agent stream lines over the 1 MiB limit (skipped).",
    m.STREAM_GAPS: "Stream gaps detected by drivers (possible data loss).",
    m.REPOS_POLLED: "Workspace polls performed.",
    m.POLL_FAILURES: "Workspace polls that failed (caliband unreachable or protocol error).",
    m.ATTACH_RECONNECTS: "Re-attaches of agent streams after a disconnect.",
    m.BUS_LAGGED: "Times a live-bus subscriber fell behind and was healed from the store.",
    "api_requests": "HTTP requests served.",
    "api_auth_failures": "HTTP requests refused (401) for missing or wrong credentials.",
    "api_auth_rate_limited": "HTTP requests refused (429) after too many failed authentications.",
    "api_body_too_large": "HTTP requests refused for a body over the size limit.",
    "api_body_timeouts": "HTTP requests answered 408 for a body not received in time.",
    "api_header_timeouts": "HTTP connections closed for request headers not received in time.",
    "api_connections_refused": "HTTP connections or requests refused (503) over the bound.",
}

GAUGE_HELP: dict[str, str] = {
    m.ACTIVE_ATTACHES: "Agent streams currently attached.",
    API_SSE_STREAMS: "Open SSE connections.",
    "api_connections": "Open HTTP connections being served.",
}

_BAD = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(name: str) -> str:
    clean = _BAD.sub("_", name)
    if clean[:1].isdigit():
        clean = "_" + clean
    return PREFIX + clean


def _num(v: float) -> str:
    if isinstance(v, int) or float(v).is_integer():
        return str(int(v))
    return repr(float(v))


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def render(metrics: Metrics) -> str:
    counters: dict[str, float] = {k: 0 for k in COUNTER_HELP}
    counters.update(metrics.counters())
    gauges: dict[str, float] = {k: 0 for k in GAUGE_HELP}
    gauges.update(metrics.gauges())
    lines: list[str] = []
    for name in sorted(counters):
        if name in gauges:
            continue  # a name used as a gauge is exported once, as a gauge
        full = metric_name(name) + "_total"
        lines.append(f"# HELP {full} {_help(COUNTER_HELP.get(name, name.replace('_', ' ')))}")
        lines.append(f"# TYPE {full} counter")
        lines.append(f"{full} {_num(counters[name])}")
    for name in sorted(gauges):
        full = metric_name(name)
        lines.append(f"# HELP {full} {_help(GAUGE_HELP.get(name, name.replace('_', ' ')))}")
        lines.append(f"# TYPE {full} gauge")
        lines.append(f"{full} {_num(gauges[name])}")
    return "\n".join(lines) + "\n"
