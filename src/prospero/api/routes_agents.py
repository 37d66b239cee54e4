"""Per-agent operations, history and the per-agent SSE stream (prospero-surface.md §1.2, §1.5)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query
from starlette.responses import Response

from prospero.api.deps import ApiState, api_state
from prospero.api.errors import InvalidRequest
from prospero.api.responses import empty, errors, json_response
from prospero.api.routes_cluster import fill_owners
from prospero.api.routes_decisions import fill_pending
from prospero.api.sse import (
    SSE_RESPONSES,
    SseResponse,
    StreamSession,
    agent_frame,
)
from prospero.core.errors import AgentNotFound
from prospero.core.subscription import follow_stream
from prospero.types.agent_ids import (
    MAX_CANDIDATES,
    AgentIdResolution,
    AgentRef,
    AmbiguousAgentId,
)
from prospero.types.api import AdoptBody, AgentInputBody, RespawnedResponse
from prospero.types.events import FleetEvent
from prospero.types.model import Agent
from prospero.types.text import control_char_in_name, describe_bad_char

router = APIRouter(tags=["agents"])

State = Annotated[ApiState, Depends(api_state)]
FromQuery = Annotated[int, Query(alias="from", ge=0, le=2**62, description="first seq/ordinal")]


# The bound of `?from` (FromQuery): cursors stay far inside SQLite's signed 64-bit INTEGER.
MAX_CURSOR = 2**62
_MAX_CURSOR_DIGITS = len(str(MAX_CURSOR))
# What the OpenAPI document promises is accepted: up to 18 digits stays below MAX_CURSOR (the
# server also takes 19-digit values up to the bound; anything else is a 422).
LAST_EVENT_ID_SCHEMA: dict[str, Any] = {"pattern": "^[0-9]{0,18}$"}


def parse_last_event_id(value: str | None) -> int | None:
    """The `Last-Event-ID` header as a cursor in [0, MAX_CURSOR], None when absent or blank;
    anything else is a 422 (never an OverflowError further down)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if (
        not text.isascii()
        or not text.isdigit()
        or len(text.lstrip("0")) > _MAX_CURSOR_DIGITS
        or int(text) > MAX_CURSOR
    ):
        raise InvalidRequest(
            f"Last-Event-ID must be an integer between 0 and {MAX_CURSOR}, got {text[:40]!r}"
        )
    return int(text)


def agent_resume(
    from_: FromQuery = 0,
    last_event_id: Annotated[
        str | None,
        Header(description="resume after this seq", json_schema_extra=LAST_EVENT_ID_SCHEMA),
    ] = None,
) -> int:
    """First seq to send: `Last-Event-ID + 1` when the header is present, else `from`."""
    last = parse_last_event_id(last_event_id)
    return last + 1 if last is not None else from_


@router.get(
    "/api/agents/{agent_id}", operation_id="getAgent", response_model=Agent, responses=errors(404)
)
async def get_agent(st: State, agent_id: str) -> Response:
    agent = st.manager.get_agent(agent_id)
    await fill_owners(st, [agent])
    await fill_pending(st, [agent])
    return json_response(agent)


async def agent_refs(st: ApiState, prefix: str) -> dict[str, AgentRef]:
    """Every agent whose id starts with `prefix`: those the fleet lists now (with their
    status), then those only Prospero's own metadata knows (spawned or adopted here)."""
    refs: dict[str, AgentRef] = {}
    manager = st.manager
    for agent_id in manager.agent_ids():
        if agent_id.startswith(prefix):
            try:
                a = manager.get_agent(agent_id)
            except AgentNotFound:  # gone between the two reads
                continue
            refs[agent_id] = AgentRef(
                agent_id=agent_id, workspace=a.workspace, status=a.status, label=a.label
            )
    for meta in await manager.agents.list_meta():
        if meta.agent_id.startswith(prefix) and meta.agent_id not in refs:
            refs[meta.agent_id] = AgentRef(agent_id=meta.agent_id, workspace=meta.workspace)
    return refs


@router.get(
    "/api/agent-ids/{prefix}",
    operation_id="resolveAgentId",
    response_model=AgentIdResolution,
    responses={
        **errors(404),
        409: {"model": AmbiguousAgentId, "description": "The prefix starts several ids"},
    },
    summary="Resolve a unique prefix of an agent id (404: none; 409: several, listed)",
    description=(
        "Matches the agents the fleet lists now and every agent this control plane spawned "
        "or adopted. An id given in full resolves to itself (also when only its stored "
        "history knows it), even when longer ids start with it. A 409 `ambiguous` is the "
        "error envelope plus `prefix`, `candidates` (sorted by id, at most "
        f"{MAX_CANDIDATES}) and `more` (how many were left out)."
    ),
)
async def resolve_agent_id(st: State, prefix: str) -> Response:
    bad = control_char_in_name(prefix)
    if bad is not None:
        raise InvalidRequest(f"agent id {describe_bad_char(*bad)}")
    refs = await agent_refs(st, prefix)
    exact = refs.get(prefix)
    if exact is None and not refs and await st.store.high_water(prefix) > 0:
        exact = AgentRef(agent_id=prefix)
    if exact is not None:
        return json_response(AgentIdResolution(prefix=prefix, agent=exact, exact=True))
    if not refs:
        raise AgentNotFound(prefix)
    if len(refs) == 1:
        (only,) = refs.values()
        return json_response(AgentIdResolution(prefix=prefix, agent=only, exact=False))
    ordered = [refs[k] for k in sorted(refs)]
    shown = ordered[:MAX_CANDIDATES]
    listing = ", ".join(r.agent_id for r in shown)
    more = len(ordered) - len(shown)
    tail = f" and {more} more" if more else ""
    body = AmbiguousAgentId(
        error=f"agent id prefix '{prefix}' is ambiguous: it starts {listing}{tail}",
        prefix=prefix,
        candidates=shown,
        more=more,
    )
    return json_response(body, status=409)


@router.delete(
    "/api/agents/{agent_id}",
    operation_id="removeAgent",
    status_code=204,
    response_class=Response,
    responses=errors(404, 409, 503),
    summary="Remove an agent (caliband rm); history stays readable via /events",
)
async def remove_agent(
    st: State, agent_id: str, force: Annotated[bool, Query()] = False
) -> Response:
    await st.manager.remove(agent_id, force=force)
    return empty(204)


@router.get(
    "/api/agents/{agent_id}/events",
    operation_id="listAgentEvents",
    response_model=list[FleetEvent],
    responses=errors(404),
    summary="Stored history (seq >= from); 404 only if there is none and the agent is not live",
)
async def agent_events(
    st: State,
    agent_id: str,
    from_: FromQuery = 0,
    limit: Annotated[int | None, Query(ge=1, le=100_000)] = None,
) -> Response:
    # History leaves the store as JSON bytes, spliced into one array (never re-parsed).
    events = await st.store.replay_raw(agent_id, from_, limit)
    if not events:
        try:
            st.manager.get_agent(agent_id)
        except AgentNotFound:
            if await st.store.high_water(agent_id) == 0:
                raise
    body = b"[" + b",".join([e.data for e in events]) + b"]"
    return Response(content=body, media_type="application/json")


async def agent_session(
    st: State, agent_id: str, start: Annotated[int, Depends(agent_resume)]
) -> AsyncIterator[StreamSession]:
    """The connection's follower, released when the response ends (even on disconnect)."""
    bad = control_char_in_name(agent_id)
    if bad is not None:  # no agent can have such an id: refuse rather than wait forever
        raise InvalidRequest(f"agent id {describe_bad_char(*bad)}")
    follower = follow_stream(st.store, st.bus, agent_id, start, close_on_finish=True)
    session = st.hub.open(follower, agent_frame)
    try:
        yield session
    finally:
        await session.close()


@router.get(
    "/api/agents/{agent_id}/stream",
    operation_id="streamAgentEvents",
    response_class=Response,  # an SseResponse; documented as FastAPI documents SSE
    responses=SSE_RESPONSES,
    summary="SSE: replay then tail one agent's events; closes after agent_finished",
    description=(
        "Each event is an unnamed message `data: <FleetEvent>` with `id: <seq>`. Resume with "
        "`?from=N` (seq >= N) or the `Last-Event-ID` header (after that seq; wins over `from`). "
        "A slow consumer gets a named `gap` event `{skipped, last_seq}` followed by the missed "
        "events. Unknown agent ids are not an error: the stream waits. With API auth on, "
        "`?access_token=` is accepted here (EventSource cannot set headers)."
    ),
)
async def agent_stream(
    agent_id: str, session: Annotated[StreamSession, Depends(agent_session)]
) -> Response:
    return SseResponse(session)


@router.post(
    "/api/agents/{agent_id}/kill",
    operation_id="killAgent",
    status_code=202,
    response_class=Response,
    responses=errors(404, 409, 503),
    summary="Kill a live agent (ends with agent_finished `killed`); 409 for a finished one",
)
async def kill(st: State, agent_id: str) -> Response:
    await st.manager.kill(agent_id)
    return empty(202)


@router.post(
    "/api/agents/{agent_id}/adopt",
    operation_id="adoptAgent",
    response_model=Agent,
    responses=errors(404, 409, 422, 503),
    summary="Drive an agent this control plane did not spawn (an ACP agent is otherwise only listed)",
    description=(
        "Records in Prospero's own metadata that this control plane drives the agent (and with "
        "which protocol, default: what caliband's record says), then starts its driver. "
        "Idempotent for an agent already driven here; 409 for a finished agent."
    ),
)
async def adopt(st: State, agent_id: str, body: AdoptBody | None = None) -> Response:
    agent = await st.manager.adopt(agent_id, body.drive_protocol if body is not None else None)
    await fill_owners(st, [agent])
    return json_response(agent)


@router.post(
    "/api/agents/{agent_id}/respawn",
    operation_id="respawnAgent",
    response_model=RespawnedResponse,
    responses=errors(404, 409, 503),
    summary="Respawn with the same spec; returns the new agent id",
)
async def respawn(st: State, agent_id: str) -> Response:
    new_id = await st.manager.respawn(agent_id)
    return json_response(RespawnedResponse(agent_id=new_id))


@router.post(
    "/api/agents/{agent_id}/input",
    operation_id="sendAgentInput",
    status_code=202,
    response_class=Response,
    responses=errors(404, 409, 422, 503),
)
async def send_input(st: State, agent_id: str, body: AgentInputBody) -> Response:
    await st.manager.send_input(agent_id, body.text)
    return empty(202)


@router.post(
    "/api/agents/{agent_id}/end-input",
    operation_id="endAgentInput",
    status_code=202,
    response_class=Response,
    responses=errors(404, 409, 503),
)
async def end_input(st: State, agent_id: str) -> Response:
    await st.manager.end_input(agent_id)
    return empty(202)


@router.post(
    "/api/agents/{agent_id}/cancel",
    operation_id="cancelAgentTurn",
    status_code=202,
    response_class=Response,
    responses=errors(404, 409, 503),
    summary="Cancel the current turn (ACP agents; 409 for NDJSON agents)",
)
async def cancel(st: State, agent_id: str) -> Response:
    await st.manager.cancel_turn(agent_id)
    return empty(202)


@router.post(
    "/api/agents/{agent_id}/drain",
    operation_id="drainAgent",
    status_code=202,
    response_class=Response,
    responses=errors(404),
    summary="End input, wait up to timeout_ms for the agent to finish, then kill (background)",
)
async def drain(
    st: State,
    agent_id: str,
    timeout_ms: Annotated[int, Query(ge=0, le=24 * 3600 * 1000)] = 30_000,
) -> Response:
    st.manager.get_agent(agent_id)  # 404 now, not in the background
    st.spawn_background(st.manager.drain(agent_id, timeout_ms / 1000), name=f"drain-{agent_id}")
    return empty(202)
