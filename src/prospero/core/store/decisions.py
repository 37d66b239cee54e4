"""The DecisionStore seam: durable permission decisions, session rules and workspace policies
(ADR 0006). SQLite (`sqlite.decisions.SqliteDecisionStore`, tables in `events.db`) is the
embedded default; PostgreSQL follows behind the same Protocol.

The one operation that must be atomic is `resolve`: a conditional update that succeeds for
exactly one caller per decision (the state goes from `pending` to a final state once). Every
decider, human or automatic, goes through it; the in-process answer to the agent only follows
a successful `resolve`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from prospero.types.decisions import Decision, DecisionState, WorkspacePolicy
from prospero.types.events import DecisionOption, DecisionToolCall


@dataclass(frozen=True)
class SessionRule:
    """An `allow_always` / `reject_always` answer, scoped to one agent's ACP session: later
    requests of that session for the same tool kind and title are answered by it."""

    agent_id: str
    session_id: str
    tool_kind: str  # "" when the call had no kind
    title: str
    action: str  # "allow" | "reject"
    option_kind: str  # the kind the human picked (allow_always | reject_always)
    decision_id: str
    created_at: str

    @property
    def name(self) -> str:
        return f"session:{self.decision_id}"


@runtime_checkable
class DecisionStore(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def insert(self, decision: Decision) -> None:
        """Store a new decision (any state; automatic ones are stored already resolved)."""
        ...

    async def get(self, decision_id: str) -> Decision | None: ...

    async def query(
        self,
        *,
        state: DecisionState | None = None,
        agent_id: str | None = None,
        workspace: str | None = None,
        limit: int | None = None,
    ) -> list[Decision]:
        """Oldest first (creation order). `limit` keeps the newest `limit` of them."""
        ...

    async def resolve(
        self,
        decision_id: str,
        *,
        state: DecisionState,
        decided_by: str,
        decided_at: str,
        option_id: str | None = None,
        note: str | None = None,
        rule: str | None = None,
    ) -> Decision | None:
        """Atomically move a *pending* decision to `state`; returns the updated decision, or
        None when it does not exist or is no longer pending (someone else resolved it)."""
        ...

    async def reattach(
        self,
        decision_id: str,
        *,
        tool_call: DecisionToolCall,
        options: list[DecisionOption],
        deadline: str | None,
    ) -> Decision | None:
        """A pending decision answered by a new request of the same tool call (the agent asked
        again after prosperod restarted and rejoined its session): refresh what the new request
        offers. None when it is no longer pending."""
        ...

    async def add_session_rule(self, rule: SessionRule) -> None:
        """Insert, replacing a rule with the same agent, session, tool kind and title."""
        ...

    async def session_rules(self, agent_id: str, session_id: str) -> list[SessionRule]: ...

    async def get_policy(self, workspace: str) -> WorkspacePolicy | None: ...

    async def put_policy(self, workspace: str, policy: WorkspacePolicy) -> None: ...
