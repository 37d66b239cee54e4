"""Which stored events become notifications, and their payloads per target format. Pure: a
stored event's JSON in, a `Notice` and a body out.

- `decision_pending`: a human is asked to approve a tool call;
- `agent_finished`: the run's outcome reads done (or killed: stopped by an operator);
- `agent_failed`: it reads failed or crashed;
- `budget_warning`: 80 % of a cap (the agent's own, or its workspace's daily cap);
- `budget_exceeded`: the agent was stopped at a cap. Its run then ends with the outcome
  `budget_exceeded`: that `agent_finished` is the same stop and is not notified again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prospero.types.events import BUDGET_EXCEEDED, run_result
from prospero.types.notifications import NotifyFormat

# The stored kinds that may notify.
SOURCE_KINDS = frozenset(
    {"decision_pending", "agent_finished", "budget_warning", "budget_exceeded"}
)
DISCORD_MAX = 2000
SLACK_MAX = 3000


@dataclass(frozen=True)
class Notice:
    """One notification, whichever target it goes to."""

    event: str  # a NotifyEvent, or "test"
    ordinal: int | None
    workspace: str
    agent_id: str
    summary: str  # one line, plain text
    data: dict[str, Any]  # the stored event (or a test's description)
    link: str | None = None
    ts: str = ""  # when the event happened (RFC 3339, as stored)


def _amount(limit: str, value: Any) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"${v:.4f}" if limit == "usd" else f"{int(v):,} tokens"


def _whose(kind: dict[str, Any]) -> str:
    return "its workspace's daily budget" if kind.get("scope") == "workspace_day" else "its budget"


def notice_of(ordinal: int, event: dict[str, Any], public_url: str | None = None) -> Notice | None:
    """The notification a stored event makes, or None."""
    kind = event.get("kind")
    if not isinstance(kind, dict):
        return None
    tag = kind.get("kind")
    agent = str(event.get("agent_id") or "")
    ws = str(event.get("repo") or "")
    who = f"agent {agent} in {ws}"
    name: str
    if tag == "decision_pending":
        raw_call = kind.get("tool_call")
        call: dict[str, Any] = raw_call if isinstance(raw_call, dict) else {}
        title = str(call.get("title") or call.get("kind") or "a tool call")
        name, summary = "decision_pending", f"{who} asks permission: {title}"
    elif tag == "agent_finished":
        outcome = str(kind.get("outcome") or "")
        if outcome == BUDGET_EXCEEDED:
            return None  # notified at its budget_exceeded
        result = run_result(outcome)
        detail = f": {kind['detail']}" if kind.get("detail") else ""
        cost = kind.get("cost_usd")
        spent = f" (${float(cost):.4f})" if isinstance(cost, int | float) else ""
        if result in ("failed", "crashed"):
            name, summary = "agent_failed", f"{who} {result} ({outcome}){detail}"
        else:
            verb = "was killed" if result == "killed" else "finished"
            name, summary = "agent_finished", f"{who} {verb} ({outcome}){spent}{detail}"
    elif tag in ("budget_warning", "budget_exceeded"):
        limit = str(kind.get("limit") or "usd")
        spent, cap = _amount(limit, kind.get("spent")), _amount(limit, kind.get("cap"))
        if tag == "budget_warning":
            name, summary = "budget_warning", f"{who} has spent {spent} of {_whose(kind)} ({cap})"
        else:
            name = "budget_exceeded"
            summary = f"{who} was stopped at {_whose(kind)}: spent {spent} of a {cap} cap"
    else:
        return None
    link = f"{public_url.rstrip('/')}/#/agents/{agent}" if public_url and agent else None
    return Notice(name, ordinal, ws, agent, summary, event, link, str(event.get("ts") or ""))


def test_notice(target_name: str, public_url: str | None = None) -> Notice:
    summary = f"Prospero test notification for target '{target_name}': delivery works"
    return Notice("test", None, "", "", summary, {"test": True}, public_url or None)


_TITLES = {
    "decision_pending": "Decision pending",
    "agent_finished": "Agent finished",
    "agent_failed": "Agent failed",
    "budget_warning": "Budget warning",
    "budget_exceeded": "Stopped at its budget",
    "test": "Test",
}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def payload(fmt: NotifyFormat, notice: Notice, sent_at: str) -> dict[str, Any]:
    """The JSON body POSTed to a target of this format."""
    title = _TITLES.get(notice.event, notice.event)
    text = f"[Prospero] {title}: {notice.summary}"
    if fmt == "slack":
        line = f"{text} <{notice.link}|open>" if notice.link else text
        return {"text": _cut(line, SLACK_MAX)}
    if fmt == "discord":
        line = f"{text}\n{notice.link}" if notice.link else text
        return {"content": _cut(line, DISCORD_MAX), "allowed_mentions": {"parse": []}}
    return {
        "event": notice.event,
        "summary": notice.summary,
        "workspace": notice.workspace or None,
        "agent_id": notice.agent_id or None,
        "ordinal": notice.ordinal,
        "link": notice.link,
        "data": notice.data,
        "sent_at": sent_at,
    }
