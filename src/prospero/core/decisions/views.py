"""What a decision becomes for others: the `decision_pending` / `decision_resolved` events of
the agent's stream, the PermissionBroker's outcome for the driver, a one-line summary."""

from __future__ import annotations

from prospero.core.decisions.names import BY_CANCEL, BY_POLICY, BY_RESTART, BY_RULE, BY_TIMEOUT
from prospero.core.permissions import DecidedBy, PermissionOutcome
from prospero.types.decisions import Decision
from prospero.types.events import DecisionPending, DecisionResolved


def pending_event(d: Decision) -> DecisionPending:
    return DecisionPending(
        id=d.id,
        tool_call=d.tool_call,
        options=list(d.options),
        created_at=d.created_at,
        deadline=d.deadline,
        posture=d.posture,
    )


def resolved_event(d: Decision) -> DecisionResolved:
    opt = d.option(d.option_id)
    return DecisionResolved(
        id=d.id,
        tool_call=d.tool_call,
        state=d.state,
        option_id=d.option_id,
        option_kind=opt.kind if opt is not None else None,
        option_label=opt.label if opt is not None else None,
        by=d.decided_by,
        note=d.note,
        rule=d.rule,
        decided_at=d.decided_at,
    )


def _by_literal(by: str | None) -> DecidedBy:
    if by in (BY_POLICY, BY_RULE, BY_TIMEOUT, BY_CANCEL, BY_RESTART):
        return by  # type: ignore[return-value]
    return "user"


def outcome_of(d: Decision) -> PermissionOutcome:
    by = _by_literal(d.decided_by)
    if d.state in ("decided", "expired") and d.option_id is not None:
        return PermissionOutcome.select(d.option_id, by)
    return PermissionOutcome.cancelled(by)


def summary_of(d: Decision) -> str:
    what = d.tool_call.title or d.tool_call.kind or "a tool call"
    if d.state == "pending":
        return f"agent {d.agent_id} ({d.workspace}) asks permission: {what}"
    opt = d.option(d.option_id)
    answer = opt.kind if opt is not None else d.state
    return f"agent {d.agent_id} ({d.workspace}): {what}: {answer} by {d.decided_by}"
