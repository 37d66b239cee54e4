"""The relay seam: a call addressed to the replica that drives an agent (issue 12, decision 8).

In a cluster one replica drives each ACP agent, under the agent's lease; a request that has to
act on the driver itself (an ACP prompt, end of input, `session/cancel`, a kill that concludes
the session first, the answer to a permission request waiting in that replica's memory) may
arrive at any replica. The replica that received it sends a `RelayedCall` to the owner and waits
for its `RelayOutcome`; the owner runs it exactly as if it had received the request itself, so
the exactly-one-wins rules of a single process (the store's conditional updates, the driver's
steering checks) hold across replicas.

Guarantees every implementation gives (tests/conformance/relay.py):
- a call runs at most once, and only on its target replica;
- a call nobody took by its deadline is withdrawn: the caller gets `RelayUnanswered` with
  `taken=False` and can tell the user that nothing was done;
- a call taken but not answered by its deadline gives `RelayUnanswered` with `taken=True`
  (it may have been applied: the target died or stalled meanwhile);
- the handler's `ProsperoError` reaches the caller as a `RelayedError` of the same `kind` and
  message (so the API answers the same status as on the owner); any other exception as an
  `internal` one.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from prospero.core.errors import ProsperoError

RelayOp = Literal["send_input", "end_input", "cancel_turn", "kill", "decide"]
RELAY_OPS: frozenset[str] = frozenset({"send_input", "end_input", "cancel_turn", "kill", "decide"})

# How long a caller waits for the owner by default: an ACP steering call is quick on the owner
# (it queues a prompt or sends one JSON-RPC message); a kill waits for caliband.
DEFAULT_TIMEOUT = 15.0


class RelayedCall(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    target: str  # the replica id that must run it
    agent_id: str
    op: RelayOp
    args: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def new(
        cls, target: str, agent_id: str, op: RelayOp, args: dict[str, Any] | None
    ) -> RelayedCall:
        """A call with a fresh id."""
        return cls(id=uuid.uuid4().hex, target=target, agent_id=agent_id, op=op, args=args or {})


class RelayOutcome(BaseModel):
    """What the target answered: `value` (JSON) when `ok`, else the error's kind and message."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    value: Any = None
    kind: str | None = None
    error: str | None = None

    @classmethod
    def of_error(cls, exc: BaseException) -> RelayOutcome:
        if isinstance(exc, ProsperoError):
            return cls(ok=False, kind=exc.kind, error=str(exc) or exc.kind)
        return cls(ok=False, kind="internal", error=f"{type(exc).__name__}: {exc}")

    def unwrap(self, target: str) -> Any:
        if self.ok:
            return self.value
        raise RelayedError(self.error or "the owning replica refused the call", self.kind, target)


class RelayedError(ProsperoError):
    """The target replica's handler failed: same kind and message as there."""

    def __init__(self, message: str, kind: str | None, target: str) -> None:
        super().__init__(message)
        self.kind = kind or "internal"
        self.target = target


class RelayUnanswered(ProsperoError):
    """The target replica did not answer in time. `taken`: it had taken the call (so it may
    have been applied); else the call was withdrawn and nothing was done."""

    kind = "unreachable"

    def __init__(self, call: RelayedCall, timeout: float, *, taken: bool) -> None:
        what = call.op.replace("_", " ")
        if taken:
            msg = (
                f"replica '{call.target}', which drives agent '{call.agent_id}', took the "
                f"{what} request but did not answer within {timeout:g}s; it may have been "
                "applied (look at the agent's events before retrying)"
            )
        else:
            msg = (
                f"replica '{call.target}', which drives agent '{call.agent_id}', did not take "
                f"the {what} request within {timeout:g}s; nothing was done (the agent is taken "
                "over by another replica once that replica's lease expires: retry then)"
            )
        super().__init__(msg)
        self.call = call
        self.taken = taken


Handler = Callable[[RelayedCall], Awaitable[Any]]


class CommandRelay(Protocol):
    """Calls to other replicas (see the module docstring for the guarantees)."""

    replica_id: str

    async def start(self, handler: Handler) -> None:
        """Begin taking the calls addressed to this replica; `handler` runs each one."""
        ...

    async def call(
        self,
        target: str,
        agent_id: str,
        op: RelayOp,
        args: dict[str, Any] | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Any:
        """Run `op` on `target` and return its value; raises RelayedError / RelayUnanswered."""
        ...

    async def close(self) -> None: ...
