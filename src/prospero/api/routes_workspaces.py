"""Workspace registry and per-workspace agents (prospero-surface.md §1.2).

Local backend: workspaces are registered in prosperod's store (201 / 204, empty). k8s backend
(the FleetManager has a workspace admin): a workspace is a `Workspace` CR, which the writes
apply or delete and the operator reconciles asynchronously, so they answer 202 with the CR's
phase as it stands (`WorkspaceAccepted`); `GET` lists the CRs with their status.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path
from starlette.responses import Response

from prospero.api.deps import ApiState, api_state
from prospero.api.errors import InvalidRequest
from prospero.api.responses import clean_workspace, dump, empty, errors, json_response
from prospero.api.routes_cluster import fill_owners
from prospero.core.errors import InvalidConfig, Unsupported
from prospero.types.api import (
    AddWorkspaceBody,
    SpawnedResponse,
    SpawnRequest,
    WorkspaceSummary,
)
from prospero.types.k8s import WorkspaceAccepted, WorkspaceConfig
from prospero.types.model import Agent, RepoProviderConfigPatch

router = APIRouter(tags=["workspaces"])

State = Annotated[ApiState, Depends(api_state)]
WorkspaceName = Annotated[str, Path(min_length=1, max_length=100)]


ACCEPTED: dict[int | str, dict[str, Any]] = {
    202: {
        "model": WorkspaceAccepted,
        "description": (
            "k8s backend: the Workspace CR is applied (deleted); the operator reconciles it "
            "asynchronously. `status` is the CR's as it stands (`Pending` until the operator "
            "has written one; current once `observed_generation` equals `generation`)."
        ),
    }
}


def k8s_config(config: WorkspaceConfig) -> WorkspaceConfig:
    """The k8s backend takes no unknown key (the local backend ignores them, as it always has)."""
    unknown = config.unknown_fields()
    if unknown:
        raise InvalidRequest(
            "invalid request: "
            + "; ".join(f"config.{k}: Extra inputs are not permitted" for k in unknown)
        )
    return config


def local_config(config: WorkspaceConfig) -> WorkspaceConfig:
    k8s_only = config.k8s_fields_set()
    if k8s_only:
        raise InvalidConfig(
            f"{', '.join(k8s_only)}: field(s) of the k8s backend's Workspace CRs; this "
            "prosperod runs --fleet-backend local (a workspace is a root directory here)"
        )
    return config


@router.get("/api/workspaces", operation_id="listWorkspaces", response_model=list[WorkspaceSummary])
async def list_workspaces(st: State) -> Response:
    workspaces = await st.manager.workspace_summaries()
    return json_response([clean_workspace(dump(w)) for w in workspaces])


@router.post(
    "/api/workspaces",
    operation_id="addWorkspace",
    status_code=201,
    response_model=WorkspaceSummary,
    responses={**errors(400, 409, 422), **ACCEPTED},
    summary=(
        "Register a workspace (local: 201 with the workspace as listed, its `health` as the "
        "first reach of its caliband found it — `unreachable` with the cause and the fix when "
        "autostart or the dial failed; re-registering the same name+root is a no-op. k8s: 202, "
        "the Workspace CR is applied; the same config again is a no-op)"
    ),
)
async def add_workspace(st: State, body: AddWorkspaceBody) -> Response:
    mgr = st.manager
    if mgr.workspace_admin is not None:
        config = k8s_config(body.config)
        if body.root:
            raise InvalidConfig(
                "a k8s workspace has no root on prosperod's host: leave `root` out (its "
                "sources are config.sources, checked out in the pods)"
            )
        accepted = await mgr.apply_workspace(body.name, config, create=True)
        return json_response(accepted, 202)
    config = local_config(body.config)
    if not body.root.strip():
        raise InvalidConfig("a local workspace needs a root directory")
    await mgr.add_workspace(body.name, body.root, config.local())
    return json_response(clean_workspace(dump(mgr.workspace_summary(body.name))), 201)


@router.delete(
    "/api/workspaces/{name}",
    operation_id="removeWorkspace",
    status_code=204,
    response_class=Response,
    responses=errors(404),
    summary=(
        "Forget a workspace (local: does not stop its agents or caliband; k8s: deletes its "
        "Workspace CR)"
    ),
)
async def remove_workspace(st: State, name: WorkspaceName) -> Response:
    mgr = st.manager
    if mgr.workspace_admin is not None:
        await mgr.delete_workspace(name)
    else:
        await mgr.remove_workspace(name)
    return empty(204)


@router.put(
    "/api/workspaces/{name}/config",
    operation_id="setWorkspaceConfig",
    status_code=204,
    response_class=Response,
    responses={**errors(400, 404, 422), **ACCEPTED},
    summary=(
        "Replace the workspace's config wholesale: omitted fields are cleared (local: 204, its "
        "caliband restarted; k8s: 202, the Workspace CR re-applied for the operator to "
        "reconcile). To change some fields only: PATCH"
    ),
)
async def set_workspace_config(st: State, name: WorkspaceName, body: WorkspaceConfig) -> Response:
    mgr = st.manager
    if mgr.workspace_admin is not None:
        accepted = await mgr.apply_workspace(name, k8s_config(body), create=False)
        return json_response(accepted, 202)
    await mgr.set_workspace_config(name, local_config(body).local())
    return empty(204)


@router.patch(
    "/api/workspaces/{name}/config",
    operation_id="patchWorkspaceConfig",
    response_model=WorkspaceSummary,
    responses=errors(400, 404, 409, 422),
    summary=(
        "Change some fields of a local workspace's config (a JSON merge patch: a field given "
        "replaces it, null clears it, one left out is kept; env merges by variable, null "
        "removing one). 200 with the workspace as listed; its caliband is restarted unless "
        "nothing changed. k8s: 409, the Workspace CR is replaced whole with PUT"
    ),
)
async def patch_workspace_config(
    st: State, name: WorkspaceName, body: RepoProviderConfigPatch
) -> Response:
    mgr = st.manager
    if mgr.workspace_admin is not None:
        raise Unsupported(
            "a k8s workspace's config is its Workspace CR, replaced whole: PUT "
            f"/api/workspaces/{name}/config (prospero workspace config {name} --file FILE.json)"
        )
    await mgr.patch_workspace_config(name, body)
    return json_response(clean_workspace(dump(mgr.workspace_summary(name))))


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
