"""Permission decisions and per-workspace permission policy (ADR 0006).

A *decision* is one `session/request_permission` of an agent: pending until a human, a policy
rule, a session rule, a timeout or a cancellation resolves it. A workspace's *policy* is an
ordered list of rules evaluated before a human is asked, plus the workspace's default posture
and how long a supervised ask may wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from prospero.types.events import DecisionOption, DecisionResolved, DecisionToolCall
from prospero.types.model import Posture
from prospero.types.text import FreeText, Name

DecisionState = Literal["pending", "decided", "expired", "cancelled"]
DECISION_STATES: tuple[str, ...] = ("pending", "decided", "expired", "cancelled")
RuleAction = Literal["allow", "deny", "ask"]

MAX_NOTE = 2000
MAX_RULES = 200
MAX_GLOB = 1000

# An autonomous agent has nobody to ask: its permission request is denied by policy (`by`) with
# this note, under the rule `AUTONOMOUS_RULE` (or the `ask` rule that matched it).
BY_POLICY = "policy"
AUTONOMOUS_RULE = "autonomous-default-deny"
AUTONOMOUS_NOTE = "autonomous posture: nobody to ask"


def denied_by_posture(resolved: DecisionResolved) -> bool:
    """Whether a resolved permission request was denied because its agent's posture is
    autonomous (not by a rule, a human or a timeout)."""
    return (
        resolved.state == "decided"
        and resolved.by == BY_POLICY
        and resolved.note == AUTONOMOUS_NOTE
    )


class Decision(BaseModel):
    """One permission request and, once resolved, who answered it, when, how and why."""

    model_config = ConfigDict(extra="ignore")

    id: str
    agent_id: str
    workspace: str
    session_id: str = ""
    turn: int = 0
    tool_call: DecisionToolCall = Field(default_factory=DecisionToolCall)
    options: list[DecisionOption] = Field(default_factory=list)
    created_at: str
    # RFC 3339; null = waits indefinitely (or answered at once by a rule).
    deadline: str | None = None
    state: DecisionState = "pending"
    posture: str | None = None
    # Who resolved it: an API token name ("anonymous" without auth), "policy", "rule",
    # "timeout", "cancel", "restart" or "takeover" (clustered: the agent's new owner).
    decided_by: str | None = None
    decided_at: str | None = None
    option_id: str | None = None
    note: str | None = None
    # The policy rule or session rule of an automatic answer.
    rule: str | None = None

    def option(self, option_id: str | None) -> DecisionOption | None:
        if option_id is None:
            return None
        return next((o for o in self.options if o.id == option_id), None)


def option_for(
    options: Sequence[DecisionOption], action: str, prefer: str | None = None
) -> DecisionOption | None:
    """The option that answers `allow` / `reject`: `prefer` (an option kind) if offered, else
    the `*_once` one, else the `*_always` one, else any option of that family. (The CLI and
    `core.decisions` pick their answers with this.)"""
    kinds = [k for k in (prefer, f"{action}_once", f"{action}_always") if k]
    for kind in kinds:
        for opt in options:
            if opt.kind == kind:
                return opt
    for opt in options:
        if opt.kind.startswith(f"{action}_"):
            return opt
    return None


def answer_option(
    options: Sequence[DecisionOption], family: str, always: bool
) -> DecisionOption | None:
    """The option an approve (`allow`) or deny (`reject`) answers with when none is named:
    `option_for`'s pick of `*_once` (`*_always` with `always`); None when only a broader or
    narrower option is offered (an `*_always` one without `always`, a `*_once` one with it).
    The CLI and the MCP tools answer by this rule."""
    kind = f"{family}_{'always' if always else 'once'}"
    chosen = option_for(options, family, prefer=kind)
    if chosen is not None and (
        chosen.kind == kind or (not always and not chosen.kind.endswith("_always"))
    ):
        return chosen
    return None


class DecideBody(BaseModel):
    """Body of POST /api/decisions/{id}."""

    model_config = ConfigDict(extra="forbid")

    option_id: Name = Field(min_length=1, max_length=500)
    note: FreeText | None = Field(default=None, max_length=MAX_NOTE)


class PolicyRule(BaseModel):
    """One policy rule. Every criterion given must match (globs, `fnmatch` style, `*` also
    matches `/`); a rule without criteria matches every request.

    - `kind`: the tool kind (read, edit, delete, move, search, execute, think, fetch,
      switch_mode, other; a call without a kind counts as `other`)
    - `title`: the tool call's title
    - `command`: `rawInput.command` (or `cmd`; an argv list is joined with spaces); a call
      without a command never matches a rule that names one
    - `path`: `rawInput.path` / `file_path` / `filePath` / `notebook_path` / `paths[]`; a
      call without a path never matches a rule that names one
    """

    model_config = ConfigDict(extra="forbid")

    action: RuleAction
    kind: Name | None = Field(default=None, max_length=MAX_GLOB)
    title: FreeText | None = Field(default=None, max_length=MAX_GLOB)
    command: FreeText | None = Field(default=None, max_length=MAX_GLOB)
    path: Name | None = Field(default=None, max_length=MAX_GLOB)
    # Shown in the audit; defaults to `<workspace>#<position>`.
    name: Name | None = Field(default=None, max_length=200)

    def describe(self) -> str:
        parts: list[str] = [self.action]
        for key in ("kind", "title", "command", "path"):
            value = getattr(self, key)
            if value is not None:
                parts.append(f"{key}={value!r}")
        return " ".join(parts)


class WorkspacePolicy(BaseModel):
    """GET/PUT /api/workspaces/{ws}/policy."""

    model_config = ConfigDict(extra="forbid")

    # Posture of spawns that do not choose one; null = the daemon's default (autonomous).
    posture: Posture | None = None
    # How long a supervised ask waits for a human before it is answered with the agent's
    # reject option (note "timed out"); null = indefinitely.
    timeout_s: float | None = Field(default=None, gt=0, le=30 * 24 * 3600)
    rules: list[PolicyRule] = Field(default_factory=list, max_length=MAX_RULES)


class PolicyPatch(BaseModel):
    """PATCH /api/workspaces/{ws}/policy: only the fields present change (`timeout_s: null`
    means wait indefinitely; `posture: null` means the daemon's default)."""

    model_config = ConfigDict(extra="forbid")

    posture: Posture | None = None
    timeout_s: float | None = Field(default=None, gt=0, le=30 * 24 * 3600)
    rules: list[PolicyRule] | None = Field(default=None, max_length=MAX_RULES)

    def apply(self, policy: WorkspacePolicy) -> WorkspacePolicy:
        data = policy.model_dump()
        for key in self.model_fields_set:
            if key == "rules":
                if self.rules is not None:
                    data["rules"] = [r.model_dump() for r in self.rules]
            else:
                data[key] = getattr(self, key)
        return WorkspacePolicy.model_validate(data)
