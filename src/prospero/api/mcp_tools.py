"""The tools of the MCP server at `/mcp` (issue 15 item 1; mounting: `api/mcp_server.py`).

Every tool calls the core operation its REST route calls (`FleetManager`, the event store,
`DecisionService`), never the HTTP API, so a tool obeys the same rules: the same request
models validate its input (`SpawnRequest`, `Name`, `FreeText`), the same cluster relay
forwards an operation to the replica that owns the agent, and the caller's token name is
recorded as a decision's `decided_by`. Results are the API's DTOs (`prospero.types.mcp`).

A failure is a tool error result (`isError: true`) whose text says what went wrong and its
kind, as the REST envelope does (`agent 'x' not found (not_found)`); never a crash. Every
state-changing call writes one `prospero.audit` line (actor, tool, target, outcome), on top
of the HTTP layer's line for the POST that carried it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field, ValidationError

from prospero.api.deps import ApiState
from prospero.api.routes_agents import MAX_CURSOR
from prospero.api.routes_cluster import fill_owners
from prospero.api.routes_decisions import decisions_of, fill_pending
from prospero.core.decisions import decided_by_name
from prospero.core.errors import AgentNotFound, Conflict, ProsperoError
from prospero.core.subscription import RawPage, follow_stream
from prospero.types.api import RespawnedResponse, SpawnRequest
from prospero.types.decisions import Decision, DecisionState, answer_option
from prospero.types.events import AgentFinished, FleetEvent, run_result
from prospero.types.mcp import (
    EVENTS_DEFAULT_LIMIT,
    EVENTS_MAX_LIMIT,
    SPAWN_MAX_WAIT_S,
    AgentAction,
    AgentActionResult,
    AgentEventsPage,
    AgentList,
    DecisionList,
    SpawnResult,
    WorkspaceList,
)
from prospero.types.model import Agent, AgentStatus, DriveProtocol, Posture
from prospero.types.text import FreeText, Name

audit_log = logging.getLogger("prospero.audit")
log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

# ------------------------------------------------------------------------------ parameters

AgentId = Annotated[Name, Field(min_length=1, max_length=200, description="The agent's id.")]
DecisionId = Annotated[Name, Field(min_length=1, max_length=200, description="The decision id.")]
WorkspaceName = Annotated[Name, Field(min_length=1, max_length=100, description="Workspace name.")]
Note = Annotated[FreeText | None, Field(max_length=2000, description="Stored with the answer.")]
Always = Annotated[
    bool,
    Field(description="Pick the *_always option: the answer also covers later identical asks."),
]
OptionId = Annotated[
    Name | None,
    Field(max_length=500, description="Answer with exactly this option id."),
]
StateFilter = Literal["pending", "decided", "expired", "cancelled", "all"]

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)


# ------------------------------------------------------------------------------ plumbing


def _caller(ctx: Context | None) -> dict[str, Any]:
    """What the HTTP layer recorded about the caller of this request (`api/auth.py`)."""
    request = None
    if ctx is not None:
        try:
            request = ctx.request_context.request
        except ValueError:  # no request (not over HTTP)
            request = None
    scope = getattr(request, "scope", None)
    state = scope.get("state") if isinstance(scope, dict) else None
    return state if isinstance(state, dict) else {}


def tool_error(exc: ProsperoError) -> ToolError:
    """A core error as the tool error the caller reads: the REST envelope's message + kind."""
    kind = getattr(exc, "kind", "internal")
    message = str(exc) or kind.replace("_", " ")
    if kind == "internal":
        message = f"internal error: {message}"
    return ToolError(f"{message} ({kind})")


def invalid(exc: ValidationError) -> ToolError:
    """A request model's refusal (e.g. `SpawnRequest`), as the REST 422 words it."""
    errors = exc.errors()
    parts = [f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}" for e in errors[:5]]
    if len(errors) > 5:
        parts.append(f"(+{len(errors) - 5} more)")
    return ToolError(f"invalid request: {'; '.join(parts)} (invalid_request)")


def guarded(
    name: str, *, audited: bool = False, rename: dict[str, str] | None = None
) -> Callable[[F], F]:
    """Wrap a tool: core errors become tool errors (never a crash), arguments given under an
    alias reach their parameter (`from` -> `from_`), and a state-changing call is audited.
    The wrapper keeps the tool's signature (`functools.wraps`: the SDK builds the input
    schema from it)."""
    renames = rename or {}

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        async def run(*args: Any, **kwargs: Any) -> Any:
            for alias, param in renames.items():
                if alias in kwargs:
                    kwargs[param] = kwargs.pop(alias)
            outcome = "ok"
            try:
                return await fn(*args, **kwargs)
            except ProsperoError as e:
                outcome = getattr(e, "kind", "internal")
                raise tool_error(e) from e
            except ValidationError as e:
                outcome = "invalid_request"
                raise invalid(e) from e
            except ToolError:
                outcome = "refused"
                raise
            finally:
                if audited:
                    _audit(name, kwargs, outcome)

        return run  # type: ignore[return-value]

    return decorate


def _audit(tool: str, kwargs: dict[str, Any], outcome: str) -> None:
    state = _caller(kwargs.get("ctx"))
    actor = decided_by_name(state.get("token_name"))
    target = next(
        (str(kwargs[k]) for k in ("agent_id", "decision_id", "workspace") if kwargs.get(k)), "-"
    )
    audit_log.info(
        "MCP %s %s -> %s by %s",
        tool,
        target,
        outcome,
        actor,
        extra={
            "actor": actor,
            "scope": state.get("token_scope"),
            "via": state.get("token_via"),
            "method": "MCP",
            "path": f"/mcp#{tool}",
            "status": outcome,
            "target": target,
        },
    )


def pick_option(decision: Decision, family: str, always: bool, option_id: str | None) -> str:
    """The option an approve (family `allow`) or deny (`reject`) answers with: `option_id`
    exactly (it must be of that family), else the family's `*_once` option (`*_always` with
    `always`), refused when only a broader or narrower one is offered — the CLI's rule."""
    listing = ", ".join(f"{o.id} ({o.kind})" for o in decision.options) or "none"
    verb = "approve" if family == "allow" else "deny"
    if option_id is not None:
        found = decision.option(option_id)
        if found is None:
            raise ToolError(
                f"decision '{decision.id}' has no option '{option_id}' (offered: {listing})"
            )
        if not found.kind.startswith(f"{family}_"):
            raise ToolError(
                f"option '{option_id}' is a {found.kind} option: {verb} answers with a "
                f"{family}_* option (offered: {listing})"
            )
        return found.id
    kind = f"{family}_{'always' if always else 'once'}"
    chosen = answer_option(decision.options, family, always)
    if chosen is not None:
        return chosen.id
    hint = "" if always else f"; always=true picks {family}_always"
    raise ToolError(
        f"decision '{decision.id}' offers no {kind} option (offered: {listing}){hint}; "
        "choose one with option_id"
    )


# ------------------------------------------------------------------------------ the tools


class ProsperoTools:
    """The tools, bound to one app's state (`ApiState`)."""

    def __init__(self, state: ApiState) -> None:
        self.st = state

    def register(self, server: MCPServer) -> None:
        tools: list[tuple[Callable[..., Awaitable[Any]], ToolAnnotations]] = [
            (self.list_workspaces, READ_ONLY),
            (self.list_agents, READ_ONLY),
            (self.agent_status, READ_ONLY),
            (self.agent_events, READ_ONLY),
            (self.spawn, WRITE),
            (self.send_input, WRITE),
            (self.end_input, WRITE),
            (self.cancel_turn, WRITE),
            (self.kill, DESTRUCTIVE),
            (self.respawn, WRITE),
            (self.list_decisions, READ_ONLY),
            (self.approve, WRITE),
            (self.deny, WRITE),
        ]
        for fn, hints in tools:
            server.add_tool(fn, name=fn.__name__, annotations=hints, structured_output=True)

    async def _views(self, agents: list[Agent]) -> list[Agent]:
        await fill_owners(self.st, agents)
        await fill_pending(self.st, agents)
        return agents

    @guarded("list_workspaces")
    async def list_workspaces(self) -> WorkspaceList:
        """List the registered workspaces: name, root, health, agent count, config."""
        return WorkspaceList(workspaces=await self.st.manager.workspace_summaries())

    @guarded("list_agents")
    async def list_agents(
        self,
        workspace: Annotated[
            Name | None, Field(max_length=100, description="Only this workspace.")
        ] = None,
        status: Annotated[
            AgentStatus | None, Field(description="Only agents in this status.")
        ] = None,
    ) -> AgentList:
        """List agents (every workspace's, or one's), oldest first, optionally by status."""
        mgr = self.st.manager
        if workspace is not None:
            agents = sorted(mgr.list_agents(workspace), key=lambda a: a.started_at)
        else:
            agents = [a for ws in mgr.snapshot().workspaces for a in ws.agents]
        if status is not None:
            agents = [a for a in agents if a.status == status]
        return AgentList(agents=await self._views(agents))

    @guarded("agent_status")
    async def agent_status(self, agent_id: AgentId) -> Agent:
        """One agent: status, workspace, protocol, posture, outcome, pending decisions."""
        (agent,) = await self._views([self.st.manager.get_agent(agent_id)])
        return agent

    @guarded("agent_events", rename={"from": "from_"})
    async def agent_events(
        self,
        agent_id: AgentId,
        from_: Annotated[
            int,
            Field(
                alias="from",
                ge=0,
                le=MAX_CURSOR,
                description="First seq to return (next_from of the previous page).",
            ),
        ] = 0,
        limit: Annotated[
            int,
            Field(
                ge=1,
                le=EVENTS_MAX_LIMIT,
                description=f"Events per page (at most {EVENTS_MAX_LIMIT}).",
            ),
        ] = EVENTS_DEFAULT_LIMIT,
    ) -> AgentEventsPage:
        """A page of an agent's stored events (seq >= from), oldest first. `truncated`: more
        follow, ask again with from = next_from. `finished`: the page ends with agent_finished."""
        store = self.st.store
        raw = await store.replay_raw(agent_id, from_, limit + 1)
        if not raw:
            try:
                self.st.manager.get_agent(agent_id)
            except AgentNotFound:
                if await store.high_water(agent_id) == 0:
                    raise
        page = raw[:limit]
        events = [FleetEvent.model_validate_json(e.data) for e in page]
        return AgentEventsPage(
            agent_id=agent_id,
            events=events,
            truncated=len(raw) > limit,
            next_from=page[-1].seq + 1 if page else from_,
            finished=any(e.kind == "agent_finished" for e in page),
        )

    @guarded("spawn", audited=True)
    async def spawn(
        self,
        workspace: WorkspaceName,
        prompt: Annotated[
            FreeText, Field(min_length=1, max_length=1_000_000, description="The task.")
        ],
        ctx: Context,
        label: Annotated[Name | None, Field(max_length=200)] = None,
        drive_protocol: Annotated[
            DriveProtocol, Field(description="ndjson (caliban) or acp.")
        ] = "ndjson",
        posture: Annotated[
            Posture | None,
            Field(
                description="supervised: permission asks wait for approve/deny (ACP only).",
            ),
        ] = None,
        interactive: Annotated[
            bool, Field(description="Keep input open: send_input / end_input.")
        ] = False,
        model: Annotated[Name | None, Field(max_length=200)] = None,
        isolation: Annotated[
            Literal["worktree", "shared"],
            Field(description="worktree (own git worktree) or shared."),
        ] = "worktree",
        budget_usd: Annotated[
            float | None,
            Field(gt=0, le=1_000_000, description="Stop the agent once its turns cost more (USD)."),
        ] = None,
        budget_tokens: Annotated[
            int | None,
            Field(gt=0, le=10**12, description="Stop the agent once its turns used more tokens."),
        ] = None,
        wait_seconds: Annotated[
            float,
            Field(
                ge=0,
                le=SPAWN_MAX_WAIT_S,
                description=(
                    "Wait up to this long for the run to finish and return how it ended "
                    f"(0: return at once; at most {SPAWN_MAX_WAIT_S:g})."
                ),
            ),
        ] = 0,
    ) -> SpawnResult:
        """Spawn an agent in a workspace; optionally wait for it to finish."""
        req = SpawnRequest(
            prompt=prompt,
            label=label,
            model=model,
            isolation="shared" if isolation == "shared" else None,
            interactive=interactive,
            drive_protocol=drive_protocol,
            posture=posture,
            budget_usd=budget_usd,
            budget_tokens=budget_tokens,
        )
        spawned = await self.st.manager.spawn(workspace, req)
        result = SpawnResult(**spawned.model_dump())
        if wait_seconds <= 0:
            return result
        start = time.monotonic()
        finish = await self._wait_finished(spawned.agent_id, wait_seconds)
        result.waited_s = round(time.monotonic() - start, 3)
        if finish is not None:
            result.finished = True
            result.finish = finish
            result.status = AgentStatus(run_result(finish.outcome))
        else:
            try:
                result.status = self.st.manager.get_agent(spawned.agent_id).status
            except AgentNotFound:  # not listed yet
                result.status = None
        return result

    async def _wait_finished(self, agent_id: str, timeout: float) -> AgentFinished | None:
        """The agent's agent_finished event once it is stored or published, or None when the
        run has not ended within `timeout` seconds."""
        async with follow_stream(self.st.store, self.st.bus, agent_id, 0) as follower:
            try:
                async with asyncio.timeout(timeout):
                    async for item in follower:
                        if not isinstance(item, RawPage):
                            continue
                        for ev in item.events:
                            if ev.kind == "agent_finished":
                                kind = FleetEvent.model_validate_json(ev.data).kind
                                assert isinstance(kind, AgentFinished)
                                return kind
            except TimeoutError:
                return None
        return None

    def _accepted(self, agent_id: str, action: AgentAction) -> AgentActionResult:
        return AgentActionResult(agent_id=agent_id, action=action)

    @guarded("send_input", audited=True)
    async def send_input(
        self,
        agent_id: AgentId,
        text: Annotated[
            FreeText, Field(min_length=1, max_length=1_000_000, description="Input text.")
        ],
        ctx: Context,
    ) -> AgentActionResult:
        """Send input to an interactive agent (its next user message)."""
        await self.st.manager.send_input(agent_id, text)
        return self._accepted(agent_id, "send_input")

    @guarded("end_input", audited=True)
    async def end_input(self, agent_id: AgentId, ctx: Context) -> AgentActionResult:
        """Close an interactive agent's input: it finishes its current work and ends."""
        await self.st.manager.end_input(agent_id)
        return self._accepted(agent_id, "end_input")

    @guarded("cancel_turn", audited=True)
    async def cancel_turn(self, agent_id: AgentId, ctx: Context) -> AgentActionResult:
        """Cancel an ACP agent's current turn (an NDJSON agent has no turn to cancel)."""
        await self.st.manager.cancel_turn(agent_id)
        return self._accepted(agent_id, "cancel_turn")

    @guarded("kill", audited=True)
    async def kill(self, agent_id: AgentId, ctx: Context) -> AgentActionResult:
        """Kill a live agent (it finishes with outcome `killed`)."""
        await self.st.manager.kill(agent_id)
        return self._accepted(agent_id, "kill")

    @guarded("respawn", audited=True)
    async def respawn(self, agent_id: AgentId, ctx: Context) -> RespawnedResponse:
        """Respawn an agent with the same spec; returns the new agent's id."""
        return RespawnedResponse(agent_id=await self.st.manager.respawn(agent_id))

    @guarded("list_decisions")
    async def list_decisions(
        self,
        state: Annotated[
            StateFilter, Field(description="Which decisions (default pending).")
        ] = "pending",
        agent_id: Annotated[Name | None, Field(max_length=200)] = None,
        workspace: Annotated[Name | None, Field(max_length=100)] = None,
        limit: Annotated[int | None, Field(ge=1, le=10_000, description="The newest N.")] = None,
    ) -> DecisionList:
        """Permission decisions (default: those waiting for a human), oldest first."""
        filt: DecisionState | None = None if state == "all" else state
        items = await decisions_of(self.st).query(
            state=filt, agent_id=agent_id, workspace=workspace, limit=limit
        )
        return DecisionList(decisions=items)

    async def _answer(
        self,
        decision_id: str,
        family: str,
        always: bool,
        option_id: str | None,
        note: str | None,
        ctx: Context,
    ) -> Decision:
        svc = decisions_of(self.st)
        current = await svc.get(decision_id)
        if current.state != "pending":
            by = f" by {current.decided_by}" if current.decided_by else ""
            raise Conflict(f"decision '{decision_id}' is already {current.state}{by}")
        chosen = pick_option(current, family, always, option_id)
        by_name = decided_by_name(_caller(ctx).get("token_name"))
        return await svc.decide_by_human(decision_id, chosen, by=by_name, note=note)

    @guarded("approve", audited=True)
    async def approve(
        self,
        decision_id: DecisionId,
        ctx: Context,
        always: Always = False,
        option_id: OptionId = None,
        note: Note = None,
    ) -> Decision:
        """Allow a pending permission request (allow_once; always: allow_always)."""
        return await self._answer(decision_id, "allow", always, option_id, note, ctx)

    @guarded("deny", audited=True)
    async def deny(
        self,
        decision_id: DecisionId,
        ctx: Context,
        always: Always = False,
        option_id: OptionId = None,
        note: Note = None,
    ) -> Decision:
        """Reject a pending permission request (reject_once; always: reject_always)."""
        return await self._answer(decision_id, "reject", always, option_id, note, ctx)


__all__ = ["ProsperoTools", "pick_option", "tool_error"]
