"""Every metric prosperod exports: name, type, help and label names (docs/operations.md lists
the same set; a test keeps the two in step).

Exported names are `prospero_<name>` (a counter's samples end in `_total`, a histogram's in
`_bucket`, `_sum` and `_count`). A name counted somewhere but missing here is still exported
(counter or gauge, its name as help, no labels), so nothing is silently dropped.

Label values come from bounded sets: workspace names (the registry), event kinds, drive
protocols, agent statuses, run results, models as the agents report them, HTTP methods (unknown
ones read `other`) and status codes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prospero.core import metrics as m

Kind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class MetricSpec:
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = m.LATENCY_BUCKETS


def _c(help: str, *labels: str) -> MetricSpec:
    return MetricSpec("counter", help, labels)


def _g(help: str, *labels: str) -> MetricSpec:
    return MetricSpec("gauge", help, labels)


def _h(help: str, *labels: str) -> MetricSpec:
    return MetricSpec("histogram", help, labels)


SPECS: dict[str, MetricSpec] = {
    # -- the event path ----------------------------------------------------------------------
    m.EVENTS_APPENDED: _c(
        "Events committed to the event store and published, by workspace and event kind.",
        "workspace",
        "kind",
    ),
    m.APPEND_FAILURES: _c("Events whose store append failed (published anyway, loss marked)."),
    m.EVENTS_FENCED: _c(
        "Events dropped by a fenced emitter: written under a lease this replica no longer holds."
    ),
    m.INGEST_PUBLISH_SECONDS: _h(
        "Seconds from a driver handing a read's events to the emitter (the loop turn it read "
        "and normalised them) to their publish on the bus, after the store commit; by workspace.",
        "workspace",
    ),
    m.UNKNOWN_FRAMES: _c("Agent stream frames of an unknown type (skipped)."),
    m.MALFORMED_LINES: _c("Agent stream lines that were not valid JSON (skipped)."),
    m.OVERSIZED_LINES: _c("Agent stream lines over the 1 MiB limit (skipped)."),
    m.STREAM_GAPS: _c("Stream gaps detected by drivers (possible data loss)."),
    m.TRANSCRIPT_RECOVERIES: _c(
        "Reads of an agent's transcript file that recovered lines the socket no longer had."
    ),
    m.BUS_LAGGED: _c(
        "Live-bus items dropped for subscribers that fell behind (healed from the store)."
    ),
    "bus_doorbells": _c("PostgreSQL bus: NOTIFY doorbells received."),
    "bus_store_reads": _c("PostgreSQL bus: pages read from the store for live delivery."),
    "bus_listen_reconnects": _c("PostgreSQL bus: LISTEN connections re-established."),
    "events_pruned": _c("Events deleted by retention."),
    "prune_failures": _c("Retention sweeps that failed."),
    # -- agents, runs, usage -----------------------------------------------------------------
    m.AGENTS: _g(
        "Agents known to this prosperod, by workspace, status and drive protocol (at scrape).",
        "workspace",
        "status",
        "protocol",
    ),
    m.DRIVERS_ACTIVE: _g(
        "Agent drivers running in this prosperod, by workspace and drive protocol (at scrape).",
        "workspace",
        "protocol",
    ),
    m.ACTIVE_ATTACHES: _g("Agent drivers running (attached or reconnecting)."),
    m.ATTACH_RECONNECTS: _c("Re-attaches of agent streams after a disconnect."),
    m.AGENTS_FINISHED: _c(
        "Runs ended (agent_finished), by workspace and result: done, failed, killed, crashed.",
        "workspace",
        "outcome",
    ),
    m.TURNS: _c("Model turns ended (turn_finished), by workspace and model.", "workspace", "model"),
    m.TOKENS: _c(
        "Tokens used, from each turn_finished, by workspace, model and type: input, output, "
        "cache_read, cache_write.",
        "workspace",
        "model",
        "type",
    ),
    m.COST_USD: _c(
        "Cost in USD of the priced turns (turn_finished.cost_usd), by workspace and model.",
        "workspace",
        "model",
    ),
    m.WORKSPACE_UP: _g(
        "1 for a workspace whose last poll reached its caliband (healthy), else 0 (at scrape).",
        "workspace",
    ),
    m.REPOS_POLLED: _c("Workspace polls performed, by workspace.", "workspace"),
    m.POLL_FAILURES: _c(
        "Workspace polls that failed (its backend unreachable or a protocol error), by workspace.",
        "workspace",
    ),
    # -- ACP ---------------------------------------------------------------------------------
    "acp_unserved_requests": _c("ACP requests from agents answered method-not-found."),
    "acp_unknown_updates": _c("ACP session updates of an unknown type."),
    "acp_unknown_stop_reasons": _c("ACP turns ended with an unknown stop reason."),
    "acp_ignored_updates": _c("ACP session updates deliberately not mapped (e.g. plans)."),
    "acp_turns_lost": _c("ACP turns recorded lost (turn_lost)."),
    "acp_late_tool_input": _c("ACP tool inputs that arrived after the tool call finished."),
    "acp_permission_requests": _c("ACP session/request_permission calls received."),
    "acp_prompt_errors": _c("ACP session/prompt calls that failed."),
    # -- decisions ---------------------------------------------------------------------------
    "decisions_requested": _c("Permission requests evaluated."),
    "decisions_automatic": _c("Permission requests answered by a policy or session rule."),
    "decisions_asked": _c("Permission requests parked for a human."),
    "decisions_pending": _g("Decisions waiting for a human, by workspace.", "workspace"),
    "decisions_timed_out": _c("Decisions that expired (answered with the reject option)."),
    "decisions_cancelled": _c("Decisions cancelled (the turn or the agent ended)."),
    m.DECISIONS_RESOLVED: _c(
        "Decisions ended (decision_resolved), by workspace, state (decided, expired, "
        "cancelled) and the kind of option answered.",
        "workspace",
        "state",
        "option",
    ),
    "decision_store_failures": _c("Decision-store writes that failed."),
    "decision_webhook_deliveries": _c("Decision webhooks delivered."),
    "decision_webhook_retries": _c("Decision webhook deliveries retried."),
    "decision_webhook_failures": _c("Decision webhooks given up on."),
    "decision_webhook_dropped": _c("Decision webhooks dropped (queue full)."),
    "relay_calls_sent": _c("Steering and answers relayed to the replica that drives the agent."),
    # -- automations (docs/automations.md) ---------------------------------------------------
    "automation_fires": _c(
        "Automation runs fired, by trigger (schedule, webhook, manual).", "trigger"
    ),
    "automation_fire_failures": _c(
        "Automation runs whose spawn was refused (the run is failed with the error), by trigger.",
        "trigger",
    ),
    "automation_webhook_rejections": _c(
        "Automation webhook calls refused, by reason (missing, malformed, forged, stale, "
        "replayed, disabled, not_found, invalid_config).",
        "reason",
    ),
    # -- notifications (docs/notifications.md) -----------------------------------------------
    "notifications_delivered": _c("Notifications delivered (2xx), by event.", "event"),
    "notifications_failed": _c(
        "Notifications given up on (a refusal, or retries exhausted), by event.", "event"
    ),
    "notification_retries": _c("Notification POSTs retried (network error, 5xx, 408, 429)."),
    "notification_queue": _g("Notifications claimed and waiting to be sent."),
    # -- HTTP API ----------------------------------------------------------------------------
    "api_requests": _c(
        "HTTP requests served, by method and status code (0: no response was started).",
        "method",
        "code",
    ),
    "api_auth_failures": _c("HTTP requests refused (401) for missing or wrong credentials."),
    "api_auth_rate_limited": _c(
        "HTTP requests refused (429) after too many failed authentications."
    ),
    "api_body_too_large": _c("HTTP requests refused for a body over the size limit."),
    "api_body_timeouts": _c("HTTP requests answered 408 for a body not received in time."),
    "api_header_timeouts": _c("HTTP connections closed for request headers not received in time."),
    "api_connections_refused": _c("HTTP connections or requests refused (503) over the bound."),
    "api_connections": _g("Open HTTP connections being served."),
    "api_sse_streams": _g("Open SSE connections."),
    m.SSE_DELIVERY_SECONDS: _h(
        "Seconds from a live event's publish on the bus to its SSE write to the connection, by "
        "stream (agent or fleet); a page of events counts at its oldest event.",
        "stream",
    ),
}


def buckets_for(name: str) -> tuple[float, ...]:
    spec = SPECS.get(name)
    return spec.buckets if spec is not None else m.LATENCY_BUCKETS
