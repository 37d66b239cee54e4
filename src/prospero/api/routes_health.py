"""Liveness, readiness, metrics and capabilities (prospero-surface.md §1.7)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import PlainTextResponse, Response

from prospero.api import metrics_text
from prospero.api.deps import ApiState, api_state
from prospero.api.responses import json_response
from prospero.core import metrics as m
from prospero.types.api import Capabilities, MetricsSnapshot, Readiness

router = APIRouter(tags=["health"])

State = Annotated[ApiState, Depends(api_state)]


@router.get(
    "/healthz",
    operation_id="healthz",
    response_class=PlainTextResponse,
    summary="Liveness (always open)",
)
async def healthz() -> PlainTextResponse:
    return PlainTextResponse("ok")


@router.get(
    "/readyz",
    operation_id="readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "not ready (same body)"}},
    summary="Readiness: the store accepts writes",
)
async def readyz(st: State) -> Response:
    ready = await st.manager.readiness()
    return json_response(ready, 200 if ready.ready else 503)


@router.get(
    "/api/metrics",
    operation_id="getMetrics",
    response_model=MetricsSnapshot,
    summary="Process metrics as JSON",
)
async def metrics_json(st: State) -> Response:
    snap = st.metrics.snapshot()
    base = {
        k: snap.get(k, 0)
        for k in (
            m.EVENTS_APPENDED,
            m.APPEND_FAILURES,
            m.UNKNOWN_FRAMES,
            m.REPOS_POLLED,
            m.ACTIVE_ATTACHES,
        )
    }
    out = {**{k: _int_or_float(v) for k, v in snap.items()}, **{k: int(v) for k, v in base.items()}}
    return json_response(out)


def _int_or_float(v: float) -> int | float:
    return int(v) if float(v).is_integer() else v


@router.get(
    "/metrics",
    operation_id="getPrometheusMetrics",
    response_class=PlainTextResponse,
    summary="Process metrics in Prometheus text format",
)
async def metrics_prometheus(st: State, request: Request) -> Response:
    body, content_type = metrics_text.render(st.metrics, request.headers.get("accept", ""))
    return Response(body, headers={"Content-Type": content_type})


@router.get("/api/capabilities", operation_id="getCapabilities", response_model=Capabilities)
async def capabilities(st: State) -> Response:
    mgr = st.manager
    protocols = [p for p in mgr.driver_factory_names() if p == "ndjson" or mgr.config.allow_acp]
    return json_response(
        Capabilities(
            admin=True,
            # k8s: workspace writes are reconciled by the operator (202)
            async_workspace_ops=mgr.workspace_admin is not None,
            drive_protocols=protocols,
        )
    )
