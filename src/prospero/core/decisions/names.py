"""The names a decision is recorded with: metric names, who resolved it, the rule and notes
of the automatic answers, and the audit name of an API caller."""

from __future__ import annotations

# The names the CLI reads back too live in the types (re-exported here).
from prospero.types.decisions import AUTONOMOUS_NOTE as AUTONOMOUS_NOTE
from prospero.types.decisions import AUTONOMOUS_RULE as AUTONOMOUS_RULE
from prospero.types.decisions import BY_POLICY as BY_POLICY
from prospero.types.model import Posture

# Metric names.
DECISIONS_REQUESTED = "decisions_requested"
DECISIONS_ASKED = "decisions_asked"
DECISIONS_AUTOMATIC = "decisions_automatic"
DECISIONS_TIMED_OUT = "decisions_timed_out"
DECISIONS_CANCELLED = "decisions_cancelled"
DECISIONS_PENDING = "decisions_pending"  # gauge
DECISION_STORE_FAILURES = "decision_store_failures"
DECISION_WEBHOOK_DELIVERIES = "decision_webhook_deliveries"
DECISION_WEBHOOK_RETRIES = "decision_webhook_retries"
DECISION_WEBHOOK_FAILURES = "decision_webhook_failures"
DECISION_WEBHOOK_DROPPED = "decision_webhook_dropped"

# Who resolved a decision, besides an API token name (`BY_POLICY`: prospero.types.decisions).
BY_RULE = "rule"
BY_TIMEOUT = "timeout"
BY_CANCEL = "cancel"
BY_RESTART = "restart"
# Clustered: the replica that drove the agent stopped; the one that took the agent over ended it.
BY_TAKEOVER = "takeover"
ANONYMOUS = "anonymous"

DEFAULT_POSTURE: Posture = "autonomous"
TIMED_OUT = "timed out"
CANCELLED_NOTE = (
    "the agent's request ended before a decision (turn cancelled, connection lost or driver "
    "stopped)"
)
RESTART_NOTE = (
    "prosperod restarted while the decision was pending and the rejoined session did not ask again"
)


def decided_by_name(token_name: str | None) -> str:
    """The audit name of an API caller: its token's name, or "anonymous" without auth."""
    return token_name or ANONYMOUS
