"""Workspace registry and per-workspace agents (prospero-surface.md §1.2)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path
from starlette.responses import Response

from prospero.api.deps import ApiState, api_state
from prospero.api.responses import clean_workspace, dump, empty, errors, json_response
from prospero.api.routes_cluster import fill_owners
from prospero.core.errors import InvalidConfig
from prospero.types.api import (
    AddWorkspaceBody,
    SpawnedResponse,
    SpawnRequest,
    WorkspaceSummary,
)
from prospero.types.model import Agent, RepoProviderConfig

router = APIRouter(tags=["workspaces"])

State = Annotated[ApiState, Depends(api_state)]
WorkspaceName = Annotated[str, Path(min_length=1, max_length=100)]


@router.get("/api/workspaces", operation_id="listWorkspaces", response_model=list[WorkspaceSummary])
async def list_workspaces(st: State) -> Response:
    return json_response([clean_workspace(dump(w)) for w in st.manager.list_workspaces()])


@router.post(
    "/api/workspaces",
    operation_id="addWorkspace",
    status_code=201,
    response_class=Response,
    responses=errors(400, 409, 422),
    summary="Register a workspace (201, empty body; re-registering the same name+root is a no-op)",
)
async def add_workspace(st: State, body: AddWorkspaceBody) -> Response:
    if not body.root.strip():
        raise InvalidConfig("a local workspace needs a root directory")
    await st.manager.add_workspace(body.name, body.root, body.config)
    return empty(201)


@router.delete(
    "/api/workspaces/{name}",
    operation_id="removeWorkspace",
    status_code=204,
    response_class=Response,
    responses=errors(404),
    summary="Forget a workspace (does not stop its agents or caliband)",
)
async def remove_workspace(st: State, name: WorkspaceName) -> Response:
    await st.manager.remove_workspace(name)
    return empty(204)


@router.put(
    "/api/workspaces/{name}/config",
    operation_id="setWorkspaceConfig",
    status_code=204,
    response_class=Response,
    responses=errors(400, 404, 422),
    summary="Replace the workspace's provider config wholesale and restart its caliband",
)
async def set_workspace_config(
    st: State, name: WorkspaceName, body: RepoProviderConfig
) -> Response:
    await st.manager.set_workspace_config(name, body)
    return empty(204)


@router.get(
    "/api/workspaces/{workspace}/agents",
    operation_id="listAgents",
    response_model=list[Agent],
    responses=errors(404),
)
async def list_agents(st: State, workspace: WorkspaceName) -> Response:
    agents = sorted(st.manager.list_agents(workspace), key=lambda a: a.started_at)
    await fill_owners(st, agents)
    return json_response([dump(a) for a in agents])


@router.post(
    "/api/workspaces/{workspace}/agents",
    operation_id="spawnAgent",
    status_code=201,
    response_model=SpawnedResponse,
    responses=errors(400, 404, 409, 422, 502, 503),
    summary='Spawn an agent (only isolation "shared" disables the worktree)',
)
async def spawn(st: State, workspace: WorkspaceName, body: SpawnRequest) -> Response:
    resp = await st.manager.spawn(workspace, body)
    return json_response(resp, 201)
