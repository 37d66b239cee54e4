"""Automations (docs/automations.md): stored spawn templates fired by a cron schedule, a
signed webhook or by hand.

- `GET /api/automations`, `GET /api/automations/{ref}` (`ref`: id or name) — `read`;
- `POST /api/automations`, `PATCH` / `DELETE /api/automations/{ref}`,
  `POST /api/automations/{ref}/rotate-secret` — `admin` (configuring);
- `POST /api/automations/{ref}/enable|disable|run` — `operate` (running things);
- `GET /api/automations/{ref}/runs` — `read`;
- `POST /api/automations/{ref}/trigger` — open: the HMAC signature is the credential.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from starlette.responses import Response

from prospero.api.deps import ApiState, NotReady, api_state
from prospero.api.errors import envelope
from prospero.api.responses import dump, empty, errors, json_response
from prospero.core.automations import AutomationService
from prospero.core.automations.service import AutomationDisabled, Replayed
from prospero.core.automations.signing import SignatureRejected
from prospero.types.automations import (
    Automation,
    AutomationCreate,
    AutomationCreated,
    AutomationPatch,
    AutomationRun,
)

router = APIRouter(tags=["automations"])

State = Annotated[ApiState, Depends(api_state)]
Ref = Annotated[str, Path(min_length=1, max_length=100, description="The automation's id or name")]


def automations_of(st: ApiState) -> AutomationService:
    svc = getattr(st.runtime, "automations", None)
    if not isinstance(svc, AutomationService):
        raise NotReady()
    return svc


@router.get(
    "/api/automations",
    operation_id="listAutomations",
    response_model=list[Automation],
    responses=errors(503),
    summary="Automations, by name (with each schedule's next fire)",
)
async def list_automations(st: State) -> Response:
    return json_response([dump(a) for a in await automations_of(st).list_all()])


@router.post(
    "/api/automations",
    operation_id="createAutomation",
    status_code=201,
    response_model=AutomationCreated,
    responses=errors(400, 409, 422, 503),
    summary="Create an automation; its webhook secret (if asked for) is shown this once",
    description=(
        "400 for an invalid cron schedule (5 fields, UTC), a prompt template with a syntax "
        "error (its offset, line and column are in the message) or an unknown workspace; 409 "
        "for a name that is taken."
    ),
)
async def create_automation(st: State, body: AutomationCreate) -> Response:
    return json_response(await automations_of(st).create(body), 201)


@router.get(
    "/api/automations/{ref}",
    operation_id="getAutomation",
    response_model=Automation,
    responses=errors(404, 503),
)
async def get_automation(st: State, ref: Ref) -> Response:
    svc = automations_of(st)
    return json_response(svc.view(await svc.resolve(ref)))


@router.patch(
    "/api/automations/{ref}",
    operation_id="patchAutomation",
    response_model=Automation,
    responses=errors(400, 404, 409, 422, 503),
    summary="Change some fields (`schedule: null` removes the schedule)",
)
async def patch_automation(st: State, ref: Ref, body: AutomationPatch) -> Response:
    return json_response(await automations_of(st).patch(ref, body))


@router.delete(
    "/api/automations/{ref}",
    operation_id="deleteAutomation",
    status_code=204,
    response_class=Response,
    responses=errors(404, 503),
    summary="Delete an automation and its run history (its agents stay)",
)
async def delete_automation(st: State, ref: Ref) -> Response:
    await automations_of(st).delete(ref)
    return empty(204)


@router.post(
    "/api/automations/{ref}/enable",
    operation_id="enableAutomation",
    response_model=Automation,
    responses=errors(404, 503),
    summary="Enable (schedule ticks missed while disabled are not fired)",
)
async def enable_automation(st: State, ref: Ref) -> Response:
    return json_response(await automations_of(st).set_enabled(ref, True))


@router.post(
    "/api/automations/{ref}/disable",
    operation_id="disableAutomation",
    response_model=Automation,
    responses=errors(404, 503),
    summary="Disable: nothing fires it (schedule, webhook, run-now) until enabled",
)
async def disable_automation(st: State, ref: Ref) -> Response:
    return json_response(await automations_of(st).set_enabled(ref, False))


def _run_response(run: AutomationRun) -> Response:
    return json_response(run, 202)


@router.post(
    "/api/automations/{ref}/run",
    operation_id="runAutomation",
    status_code=202,
    response_model=AutomationRun,
    responses=errors(404, 409, 503),
    summary="Fire now (trigger `manual`): the run, with its agent id or the spawn's error",
    description="409 `disabled` for a disabled automation.",
)
async def run_automation(st: State, ref: Ref) -> Response:
    svc = automations_of(st)
    try:
        run = await svc.run_now(ref)
    except AutomationDisabled as e:
        return envelope(409, str(e), e.kind)
    return _run_response(run)


@router.post(
    "/api/automations/{ref}/rotate-secret",
    operation_id="rotateAutomationSecret",
    response_model=AutomationCreated,
    responses=errors(404, 503),
    summary="A new webhook secret (shown this once; the old one stops verifying at once)",
    description="Also gives an automation without a webhook trigger one.",
)
async def rotate_secret(st: State, ref: Ref) -> Response:
    return json_response(await automations_of(st).rotate_secret(ref))


@router.get(
    "/api/automations/{ref}/runs",
    operation_id="listAutomationRuns",
    response_model=list[AutomationRun],
    responses=errors(404, 503),
    summary="Run history, newest first, each with the agent it spawned (or its error)",
)
async def list_runs(
    st: State, ref: Ref, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> Response:
    return json_response([dump(r) for r in await automations_of(st).runs(ref, limit)])


@router.post(
    "/api/automations/{ref}/trigger",
    operation_id="triggerAutomation",
    status_code=202,
    response_model=AutomationRun,
    responses=errors(400, 401, 404, 409, 503),
    summary="Signed webhook: fire the automation with the JSON body as `payload`",
    openapi_extra={
        "requestBody": {
            "required": False,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    },
    description=(
        "No API token: `X-Prospero-Signature: sha256=<hex>` is the credential, the "
        "HMAC-SHA256 of the raw body keyed with the automation's secret — or, when "
        "`X-Prospero-Timestamp: <unix seconds>` is sent, of `<timestamp>.` + body, and a "
        "timestamp outside the replay window is refused. 401 for a missing, malformed or "
        "forged signature or a stale timestamp, and for an unknown automation or one "
        "without a webhook (the same answer as a forged signature); 409 `disabled`; 409 "
        "`replayed` for a signature already seen within the replay window (default 300 s); "
        "400 for a body that is not a JSON object (an empty body is `{}`). Nothing fires on "
        "any of these. "
        "202: the run, with the agent it spawned or the spawn's error."
    ),
)
async def trigger_automation(
    st: State,
    ref: Ref,
    request: Request,
    x_prospero_signature: Annotated[str | None, Header(max_length=200)] = None,
    x_prospero_timestamp: Annotated[str | None, Header(max_length=40)] = None,
) -> Response:
    svc = automations_of(st)
    body = await request.body()  # raw: the signature covers these bytes
    try:
        run = await svc.webhook(ref, body, x_prospero_signature, x_prospero_timestamp)
    except SignatureRejected as e:
        return envelope(401, str(e), "unauthorized")
    except (AutomationDisabled, Replayed) as e:
        return envelope(409, str(e), e.kind)
    return _run_response(run)
