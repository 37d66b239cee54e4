"""The permission seam: who answers an agent's request to run a tool (ADR 0011 decision 5).

An ACP agent asks its driver with `session/request_permission`; the driver turns that into a
protocol-neutral `PermissionRequest` and awaits a `PermissionBroker`. The broker's
`PermissionOutcome` goes back to the agent as the ACP response.

`PolicyBroker` is the bare default (a driver built without a broker): it never allows. It
selects the first `reject_*` option the agent offers (a clean "no" the agent can act on), else
answers `cancelled`. prosperod injects `prospero.core.decisions.DecisionService` instead
(pending decisions for supervised agents, workspace policy, session rules; ADR 0006) through
`prospero.core.drivers.acp.acp_driver_factory(broker=...)` or `AcpDriver(..., broker=...)`.

A broker may take as long as it likes (a human deciding): the driver answers `cancelled` on
its own when the turn is cancelled or the session ends while the decision is pending. A broker
that stores its decisions may also implement `StoredDecisions`, which a driver starting from
stored state calls for the decisions asked through a connection that is gone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

PermissionKind = Literal["allow_once", "allow_always", "reject_once", "reject_always"]
Decision = Literal["selected", "cancelled"]
DecidedBy = Literal["policy", "user", "rule", "timeout", "cancel", "transport", "restart"]


@dataclass(frozen=True)
class PermissionOption:
    """One answer the agent offers. `option_id` is agent-chosen and opaque."""

    option_id: str
    label: str
    # allow_once | allow_always | reject_once | reject_always (an unknown kind is kept as is)
    kind: str

    @property
    def allows(self) -> bool:
        return self.kind.startswith("allow_")

    @property
    def rejects(self) -> bool:
        return self.kind.startswith("reject_")


@dataclass(frozen=True)
class PermissionToolCall:
    """The tool call the request is about, as merged so far (title/kind/input may be richer
    than the earlier `tool_call` announced, or the call may not have been announced at all)."""

    id: str
    title: str = ""
    kind: str | None = None
    input: Any = None


@dataclass(frozen=True)
class PermissionRequest:
    agent_id: str
    session_id: str
    tool_call: PermissionToolCall
    options: tuple[PermissionOption, ...]
    # The agent's posture (AgentMeta.posture); None when the spawn did not say.
    posture: str | None = None
    # 0-based index of the prompt turn that raised it.
    turn: int = 0
    # The JSON-RPC id of the agent's request (unique per connection, for correlation/logs).
    request_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # The agent's workspace ("" when the driver does not know it).
    workspace: str = ""
    # Waits (bounded) until the events the driver queued before this request have reached
    # its sink, so a broker's own events on the agent's stream follow them. None = nothing to
    # wait for.
    flush: Callable[[], Awaitable[None]] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class PermissionOutcome:
    decision: Decision
    option_id: str | None = None
    by: DecidedBy = "policy"

    @classmethod
    def select(cls, option_id: str, by: DecidedBy = "policy") -> PermissionOutcome:
        return cls("selected", option_id, by)

    @classmethod
    def cancelled(cls, by: DecidedBy = "policy") -> PermissionOutcome:
        return cls("cancelled", None, by)


@runtime_checkable
class PermissionBroker(Protocol):
    async def decide(self, request: PermissionRequest) -> PermissionOutcome: ...


@runtime_checkable
class StoredDecisions(Protocol):
    """Optional capability of a broker whose decisions outlive the request that asked
    (prosperod's `DecisionService`: they are stored). A driver that starts an agent from its
    stored resume state — after a restart or, clustered, after taking the agent over from
    another replica — calls `cancel_stored` once, before it opens the session: the agent's
    decisions still pending in the store that no request of this process waits on were asked
    through a connection that is gone. What the broker does with them (and that it may
    leave them to a grace period) is its own rule; it returns how many it resolved."""

    async def cancel_stored(self, agent_id: str, reason: str) -> int: ...


def first_reject(options: tuple[PermissionOption, ...]) -> PermissionOption | None:
    """The first `reject_once`, else the first `reject_always`, else None."""
    for kind in ("reject_once", "reject_always"):
        for opt in options:
            if opt.kind == kind:
                return opt
    return None


class PolicyBroker:
    """Default deny, whatever the posture (see the module docstring)."""

    def __init__(self) -> None:
        self.decisions = 0

    async def decide(self, request: PermissionRequest) -> PermissionOutcome:
        self.decisions += 1
        opt = first_reject(request.options)
        if opt is None:
            return PermissionOutcome.cancelled("policy")
        return PermissionOutcome.select(opt.option_id, "policy")
