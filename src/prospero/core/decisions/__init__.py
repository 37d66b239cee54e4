"""Permission decisions: the PermissionBroker prosperod gives its ACP drivers (ADR 0006).

Every `session/request_permission` of an agent becomes a durable *decision* (the
`DecisionStore`; SQLite tables in `events.db`). `DecisionService.decide()` answers it, in
this order:

1. the workspace *policy* (an ordered rule list: allow / deny / ask by tool kind, title glob,
   command glob, path glob; the first matching rule wins) — `allow` / `deny` answer at once,
   recorded as decided by `policy` with the rule's name;
2. the agent session's *always rules*: a human's earlier `allow_always` / `reject_always`
   answer for the same tool kind and title in the same ACP session answers at once, recorded
   as decided by `rule` (`session:<decision id>`);
3. the *posture* (the spawn's, else the workspace default, else `autonomous`): an
   autonomous agent has nobody to ask, so the request is denied by policy
   (rule `autonomous-default-deny`, or the `ask` rule that matched);
4. a supervised agent's request waits for a human: a `decision_pending` event on the agent's
   stream (and fleet SSE), optional webhooks, `GET /api/decisions?state=pending`. The first
   `decide_by_human()` wins (an atomic conditional update in the store, then the in-process
   future the driver awaits); everyone after gets a conflict. A workspace timeout answers with
   the agent's reject option (`expired`, by `timeout`, note "timed out"); a cancelled turn, a
   killed agent or a lost connection resolves it `cancelled`.

Every resolution is stored (who, when, option, note, rule) and announced as a
`decision_resolved` event, so the agent's history carries the audit.

Restarts: a decision still pending when prosperod stops stays pending in the store (its
JSON-RPC request belonged to the old connection and cannot be answered any more). The next
prosperod holds it for `rejoin_grace` seconds: if the rejoined session asks again for the same
tool call, the new request takes the decision over (same id, still pending); otherwise it is
resolved `cancelled` by `restart`.

Clustered (several replicas on one PostgreSQL database, ADR 0012; `DecisionConfig.clustered`):
a decision pending in the shared store may be waiting on a live replica, so none is taken for
an orphan at start. Only the replica that owns an agent drives it and asks for it; when that
replica dies, the one that takes the agent over cancels, as its ACP driver loads the agent's
stored state, the agent's decisions still pending and not live in it (`cancel_stored`: by
`takeover`, with the lost turn in the note), and forgets the agent's cached session rules.
Workspace policies are read from the store at each use instead of cached (another replica may
have changed them).

The package: `policy` (the rule list, its evaluation, the cached policies), `session_rules`
(always-rules per ACP session), `waiting` (the wait for a human answer), `webhooks`, `views`
(events, broker outcome, summary of a decision), `names` (metric names, who decided, notes),
`errors`, and `service` (DecisionService, which ties them together).
"""

from __future__ import annotations

from prospero.core.decisions.errors import DecisionConflict, DecisionNotFound, UnknownOption
from prospero.core.decisions.names import (
    ANONYMOUS,
    AUTONOMOUS_RULE,
    BY_CANCEL,
    BY_POLICY,
    BY_RESTART,
    BY_RULE,
    BY_TAKEOVER,
    BY_TIMEOUT,
    CANCELLED_NOTE,
    DECISION_STORE_FAILURES,
    DECISION_WEBHOOK_DELIVERIES,
    DECISION_WEBHOOK_DROPPED,
    DECISION_WEBHOOK_FAILURES,
    DECISION_WEBHOOK_RETRIES,
    DECISIONS_ASKED,
    DECISIONS_AUTOMATIC,
    DECISIONS_CANCELLED,
    DECISIONS_PENDING,
    DECISIONS_REQUESTED,
    DECISIONS_TIMED_OUT,
    DEFAULT_POSTURE,
    RESTART_NOTE,
    TIMED_OUT,
    decided_by_name,
)
from prospero.core.decisions.policy import (
    PolicyMatch,
    WorkspacePolicies,
    command_of,
    evaluate_policy,
    paths_of,
    rule_matches,
    rule_name,
)
from prospero.core.decisions.service import (
    DecisionConfig,
    DecisionService,
    EmitterLike,
    new_decision_id,
)
from prospero.core.decisions.session_rules import SessionRules
from prospero.core.decisions.views import outcome_of, pending_event, resolved_event, summary_of
from prospero.core.decisions.waiting import LiveDecision, wait_for_answer
from prospero.core.decisions.webhooks import WebhookNotifier
from prospero.types.decisions import option_for

__all__ = [
    "ANONYMOUS",
    "AUTONOMOUS_RULE",
    "BY_CANCEL",
    "BY_POLICY",
    "BY_RESTART",
    "BY_RULE",
    "BY_TAKEOVER",
    "BY_TIMEOUT",
    "CANCELLED_NOTE",
    "DECISIONS_ASKED",
    "DECISIONS_AUTOMATIC",
    "DECISIONS_CANCELLED",
    "DECISIONS_PENDING",
    "DECISIONS_REQUESTED",
    "DECISIONS_TIMED_OUT",
    "DECISION_STORE_FAILURES",
    "DECISION_WEBHOOK_DELIVERIES",
    "DECISION_WEBHOOK_DROPPED",
    "DECISION_WEBHOOK_FAILURES",
    "DECISION_WEBHOOK_RETRIES",
    "DEFAULT_POSTURE",
    "RESTART_NOTE",
    "TIMED_OUT",
    "DecisionConfig",
    "DecisionConflict",
    "DecisionNotFound",
    "DecisionService",
    "EmitterLike",
    "LiveDecision",
    "PolicyMatch",
    "SessionRules",
    "UnknownOption",
    "WebhookNotifier",
    "WorkspacePolicies",
    "command_of",
    "decided_by_name",
    "evaluate_policy",
    "new_decision_id",
    "option_for",
    "outcome_of",
    "paths_of",
    "pending_event",
    "resolved_event",
    "rule_matches",
    "rule_name",
    "summary_of",
    "wait_for_answer",
]
