"""Notifications (docs/notifications.md): webhook targets and their delivery log.

- `GET /api/notifications/targets`, `GET /api/notifications/targets/{ref}` (`ref`: id or
  name), `GET /api/notifications/deliveries` — `read`;
- `POST /api/notifications/targets`, `PATCH` / `DELETE /api/notifications/targets/{ref}`,
  `POST /api/notifications/targets/{ref}/test` — `admin` (configuring).

A target's URL is a secret: it is only ever shown masked (scheme, host, port).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from starlette.responses import Response

from prospero.api.deps import ApiState, NotReady, api_state
from prospero.api.responses import dump, empty, errors, json_response
from prospero.core.notify.service import NotificationService
from prospero.types.notifications import (
    Delivery,
    TargetCreate,
    TargetPatch,
    TargetView,
    TestResult,
)

router = APIRouter(tags=["notifications"])

State = Annotated[ApiState, Depends(api_state)]
Ref = Annotated[str, Path(min_length=1, max_length=100, description="The target's id or name")]


def notifications_of(st: ApiState) -> NotificationService:
    svc = getattr(st.runtime, "notifications", None)
    if not isinstance(svc, NotificationService):
        raise NotReady()
    return svc


@router.get(
    "/api/notifications/targets",
    operation_id="listNotificationTargets",
    response_model=list[TargetView],
    responses=errors(503),
    summary="Notification targets, by name (URLs masked)",
)
async def list_targets(st: State) -> Response:
    targets = await notifications_of(st).list_all()
    return json_response([dump(TargetView.of(t)) for t in targets])


@router.post(
    "/api/notifications/targets",
    operation_id="createNotificationTarget",
    status_code=201,
    response_model=TargetView,
    responses=errors(409, 422, 503),
    summary="Add a webhook target (format slack, discord or json)",
    description=(
        "422 for a URL that is not http(s) with a host, an unknown format or event name; 409 "
        "for a name that is taken."
    ),
)
async def create_target(st: State, body: TargetCreate) -> Response:
    target = await notifications_of(st).create(body)
    return json_response(TargetView.of(target), 201)


@router.get(
    "/api/notifications/targets/{ref}",
    operation_id="getNotificationTarget",
    response_model=TargetView,
    responses=errors(404, 503),
)
async def get_target(st: State, ref: Ref) -> Response:
    return json_response(TargetView.of(await notifications_of(st).resolve(ref)))


@router.patch(
    "/api/notifications/targets/{ref}",
    operation_id="patchNotificationTarget",
    response_model=TargetView,
    responses=errors(404, 409, 422, 503),
    summary="Change some fields (`events` / `workspaces` null: all)",
)
async def patch_target(st: State, ref: Ref, body: TargetPatch) -> Response:
    return json_response(TargetView.of(await notifications_of(st).patch(ref, body)))


@router.delete(
    "/api/notifications/targets/{ref}",
    operation_id="deleteNotificationTarget",
    status_code=204,
    response_class=Response,
    responses=errors(404, 503),
    summary="Delete a target and its delivery log",
)
async def delete_target(st: State, ref: Ref) -> Response:
    await notifications_of(st).delete(ref)
    return empty(204)


@router.post(
    "/api/notifications/targets/{ref}/test",
    operation_id="testNotificationTarget",
    response_model=TestResult,
    responses=errors(404, 503),
    summary="Send a test message now (one attempt): whether it was delivered, and how",
)
async def test_target(st: State, ref: Ref) -> Response:
    return json_response(await notifications_of(st).test(ref))


@router.get(
    "/api/notifications/deliveries",
    operation_id="listNotificationDeliveries",
    response_model=list[Delivery],
    responses=errors(404, 503),
    summary="The delivery log, newest first (`target`: one target's, by id or name)",
)
async def list_deliveries(
    st: State,
    target: Annotated[str | None, Query(min_length=1, max_length=100)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    rows = await notifications_of(st).deliveries(target, limit)
    return json_response([dump(d) for d in rows])
