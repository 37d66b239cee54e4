"""Permission decisions and workspace permission policy (ADR 0006).

- `GET /api/decisions?state=&agent=&workspace=&limit=`: decisions, oldest first.
- `GET /api/decisions/{id}`: one decision (404 when unknown).
- `POST /api/decisions/{id}` `{option_id, note?}`: answer a pending decision. 200 with the
  decided decision; 409 when it is not pending any more (answered, expired, cancelled), when
  another decider won the race, or when its request is not live; 400 for an option the agent
  did not offer; 404 for an unknown id. The caller's API token *name* ("anonymous" without
  auth) is recorded as `decided_by`.
- `GET / PUT / PATCH /api/workspaces/{ws}/policy`: the workspace's default posture, ask
  timeout and ordered rule list.

Pending and resolved decisions are also events on the agent's stream (and the fleet stream):
`decision_pending`, `decision_resolved`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.responses import Response

from prospero.api.deps import ApiState, NotReady, api_state
from prospero.api.errors import envelope
from prospero.api.responses import dump, errors, json_response
from prospero.core.decisions import DecisionService, UnknownOption, decided_by_name
from prospero.core.errors import StoreError
from prospero.types.decisions import (
    DecideBody,
    Decision,
    DecisionState,
    PolicyPatch,
    WorkspacePolicy,
)
from prospero.types.model import Agent

log = logging.getLogger(__name__)

router = APIRouter(tags=["decisions"])

State = Annotated[ApiState, Depends(api_state)]
WorkspaceName = Annotated[str, Path(min_length=1, max_length=100)]
StateFilter = Literal["pending", "decided", "expired", "cancelled", "all"]


async def fill_pending(st: ApiState, agents: Iterable[Agent]) -> None:
    """Set the `pending_decisions` of each agent view (fresh views, built for this response):
    one query of the pending decisions for all of them. Without a decisions service (or when
    the query fails, logged) they stay 0: the fleet's own view does not depend on it."""
    svc = getattr(st.runtime, "decisions", None)
    views = list(agents)
    if not isinstance(svc, DecisionService) or not views:
        return
    try:
        pending = await svc.query(state="pending")
    except StoreError as e:
        log.warning("pending decisions unknown for this response: %s", e)
        return
    counts = Counter(d.agent_id for d in pending)
    for a in views:
        a.pending_decisions = counts.get(a.id, 0)


def decisions_of(st: ApiState) -> DecisionService:
    svc = getattr(st.runtime, "decisions", None)
    if not isinstance(svc, DecisionService):
        raise NotReady()
    return svc


@router.get(
    "/api/decisions",
    operation_id="listDecisions",
    response_model=list[Decision],
    responses=errors(422, 503),
    summary="Permission decisions (oldest first); filter by state, agent, workspace",
    description=(
        "`state`: pending | decided | expired | cancelled | all (default all). `agent`: one "
        "agent's decisions (its audit). `limit` keeps the newest N. The response header "
        "`X-Prospero-Last-Ordinal` is the fleet stream's ordinal before the query: follow "
        "`/api/stream?from=<it + 1>` to see every decision event after this list."
    ),
)
async def list_decisions(
    st: State,
    state: Annotated[StateFilter, Query()] = "all",
    agent: Annotated[str | None, Query(max_length=200)] = None,
    workspace: Annotated[str | None, Query(max_length=100)] = None,
    limit: Annotated[int | None, Query(ge=1, le=10_000)] = None,
) -> Response:
    svc = decisions_of(st)
    last = await st.store.last_ordinal()
    filt: DecisionState | None = None if state == "all" else state
    items = await svc.query(state=filt, agent_id=agent, workspace=workspace, limit=limit)
    resp = json_response([dump(d) for d in items])
    resp.headers["X-Prospero-Last-Ordinal"] = str(last)
    return resp


@router.get(
    "/api/decisions/{decision_id}",
    operation_id="getDecision",
    response_model=Decision,
    responses=errors(404, 503),
)
async def get_decision(st: State, decision_id: str) -> Response:
    return json_response(await decisions_of(st).get(decision_id))


@router.post(
    "/api/decisions/{decision_id}",
    operation_id="resolveDecision",
    response_model=Decision,
    responses=errors(400, 404, 409, 422, 503),
    summary="Answer a pending decision with one of the options the agent offered",
    description=(
        "Exactly one decider wins: concurrent answers get one 200 and 409 for the rest. 409 "
        "also for a decision that is already decided, expired or cancelled; 400 for an "
        "option the agent did not offer; 404 for an unknown id. The caller's API token name "
        "(`anonymous` without auth) is recorded as `decided_by`."
    ),
)
async def decide(st: State, decision_id: str, body: DecideBody, request: Request) -> Response:
    svc = decisions_of(st)
    by = decided_by_name(getattr(request.state, "token_name", None))
    try:
        decided = await svc.decide_by_human(decision_id, body.option_id, by=by, note=body.note)
    except UnknownOption as e:
        return envelope(400, str(e), e.kind)
    return json_response(decided)


# ---- workspace policy -------------------------------------------------------------------------


def _known_workspace(st: ApiState, ws: str) -> None:
    st.manager.list_agents(ws)  # raises WorkspaceNotFound (404)


def _policy_body(policy: WorkspacePolicy) -> dict[str, Any]:
    data: dict[str, Any] = dump(policy)
    data["rules"] = [{k: v for k, v in r.items() if v is not None} for r in data["rules"]]
    return data


@router.get(
    "/api/workspaces/{workspace}/policy",
    operation_id="getWorkspacePolicy",
    response_model=WorkspacePolicy,
    responses=errors(404, 503),
    summary="The workspace's permission policy: default posture, ask timeout, ordered rules",
)
async def get_policy(st: State, workspace: WorkspaceName) -> Response:
    _known_workspace(st, workspace)
    return json_response(_policy_body(await decisions_of(st).policy(workspace)))


@router.put(
    "/api/workspaces/{workspace}/policy",
    operation_id="replaceWorkspacePolicy",
    response_model=WorkspacePolicy,
    responses=errors(404, 422, 503),
    summary="Replace the workspace's permission policy wholesale",
)
async def put_policy(st: State, workspace: WorkspaceName, body: WorkspacePolicy) -> Response:
    _known_workspace(st, workspace)
    return json_response(_policy_body(await decisions_of(st).set_policy(workspace, body)))


@router.patch(
    "/api/workspaces/{workspace}/policy",
    operation_id="patchWorkspacePolicy",
    response_model=WorkspacePolicy,
    responses=errors(404, 422, 503),
    summary="Change some fields of the workspace's permission policy (posture, timeout_s, rules)",
)
async def patch_policy(st: State, workspace: WorkspaceName, body: PolicyPatch) -> Response:
    _known_workspace(st, workspace)
    return json_response(_policy_body(await decisions_of(st).patch_policy(workspace, body)))
