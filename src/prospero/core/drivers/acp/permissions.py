"""The ACP permission bridge: `session/request_permission` → `PermissionBroker` → answer.

Also the duck-typed client object the SDK calls for agent → client messages (acp.md pitfall
5): updates are recorded by the driver's raw observer, so `session_update` does nothing;
`fs/*`, `terminal/*` and extension methods raise method-not-found.

The bridge answers `cancelled` on its own when the turn is cancelled or the session ends
(`end()`: a closed driver, a session found not resumable, a kill) while a decision is pending,
as ACP requires, and counts the requests being decided (`idle`) so a closing driver can let
those answers out before it cuts the connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import acp
from acp import schema as s

from prospero.core.metrics import Metrics
from prospero.core.permissions import (
    PermissionBroker,
    PermissionOption,
    PermissionOutcome,
    PermissionRequest,
    PermissionToolCall,
)

log = logging.getLogger(__name__)

ACP_PERMISSION_REQUESTS = "acp_permission_requests"


@dataclass
class PermissionContext:
    """What the driver knows about the request beyond its params."""

    title: str
    kind: str | None
    input: Any
    posture: str | None
    turn: int
    workspace: str
    cancelled: asyncio.Event  # the turn's cancel signal
    flush: Callable[[], Awaitable[None]] | None


class PermissionBridge:
    def __init__(self, agent_id: str, broker: PermissionBroker, metrics: Metrics) -> None:
        self.agent_id = agent_id
        self.broker = broker
        self.metrics = metrics
        self.waiting = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self._ended = asyncio.Event()

    def end(self) -> None:
        """The session ended (or the driver closed): pending requests answer `cancelled`."""
        self._ended.set()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    async def answer(
        self,
        session_id: str,
        tool_call: s.ToolCallUpdate,
        options: list[s.PermissionOption],
        ctx: PermissionContext,
    ) -> s.RequestPermissionResponse:
        self.waiting += 1
        self.idle.clear()
        try:
            return await self._decide(session_id, tool_call, options, ctx)
        finally:
            self.waiting -= 1
            if not self.waiting:
                self.idle.set()

    async def _decide(
        self,
        session_id: str,
        tool_call: s.ToolCallUpdate,
        options: list[s.PermissionOption],
        ctx: PermissionContext,
    ) -> s.RequestPermissionResponse:
        self.metrics.inc(ACP_PERMISSION_REQUESTS)
        agent = self.agent_id
        request = PermissionRequest(
            agent_id=agent,
            session_id=session_id,
            tool_call=PermissionToolCall(
                id=tool_call.tool_call_id, title=ctx.title, kind=ctx.kind, input=ctx.input
            ),
            options=tuple(PermissionOption(o.option_id, o.name, o.kind) for o in options),
            posture=ctx.posture,
            turn=ctx.turn,
            workspace=ctx.workspace,
            flush=ctx.flush,
        )
        outcome = PermissionOutcome.cancelled("cancel")
        if not ctx.cancelled.is_set() and not self._ended.is_set():
            decide = asyncio.ensure_future(self.broker.decide(request))
            waiter = asyncio.ensure_future(ctx.cancelled.wait())
            ender = asyncio.ensure_future(self._ended.wait())
            try:
                await asyncio.wait({decide, waiter, ender}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for f in (decide, waiter, ender):
                    if not f.done():
                        f.cancel()
            if decide.done() and not decide.cancelled():
                exc = decide.exception()
                if exc is not None:
                    log.warning(
                        "agent %s: permission broker failed: %r; answering cancelled", agent, exc
                    )
                else:
                    outcome = decide.result()
        offered = {o.option_id for o in options}
        if outcome.decision == "selected" and outcome.option_id not in offered:
            log.warning(
                "agent %s: broker chose option %r the agent did not offer; answering cancelled",
                agent,
                outcome.option_id,
            )
            outcome = PermissionOutcome.cancelled(outcome.by)
        log.info(
            "agent %s: permission for tool call %s (%s): %s%s by %s",
            agent,
            request.tool_call.id,
            request.tool_call.title,
            outcome.decision,
            f" {outcome.option_id}" if outcome.option_id else "",
            outcome.by,
        )
        if outcome.decision == "selected" and outcome.option_id is not None:
            return s.RequestPermissionResponse(
                outcome=s.AllowedOutcome(outcome="selected", option_id=outcome.option_id)
            )
        return s.RequestPermissionResponse(outcome=s.DeniedOutcome(outcome="cancelled"))


def _unserved(method: str) -> Callable[..., Awaitable[Any]]:
    """An AcpClient method for an agent -> client request it does not serve: method-not-found."""

    async def refuse(self: AcpClient, **params: Any) -> Any:
        raise acp.RequestError.method_not_found(method)

    return refuse


class AcpClient:
    """What the SDK calls for agent → client messages (see the module docstring)."""

    def __init__(
        self,
        on_permission: Callable[
            [str, s.ToolCallUpdate, list[s.PermissionOption]],
            Awaitable[s.RequestPermissionResponse],
        ],
    ) -> None:
        self._on_permission = on_permission

    async def session_update(self, session_id: str, update: Any, **meta: Any) -> None:
        return None

    async def request_permission(
        self,
        session_id: str,
        tool_call: s.ToolCallUpdate,
        options: list[s.PermissionOption],
        **meta: Any,
    ) -> s.RequestPermissionResponse:
        return await self._on_permission(session_id, tool_call, options)

    read_text_file = _unserved("fs/read_text_file")
    write_text_file = _unserved("fs/write_text_file")
    create_terminal = _unserved("terminal/create")
    terminal_output = _unserved("terminal/output")
    release_terminal = _unserved("terminal/release")
    wait_for_terminal_exit = _unserved("terminal/wait_for_exit")
    kill_terminal = _unserved("terminal/kill")

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise acp.RequestError.method_not_found(f"_{method}")

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None
