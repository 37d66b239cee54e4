"""`create_app(runtime)`: the FastAPI application of prosperod.

The API layer is thin: every behaviour lives in the FleetManager and the stores; handlers only
translate HTTP to calls and core errors to the `{error, kind}` envelope.

Middleware, outermost first: access log -> dashboard assets -> bearer auth -> body limit
-> SSE disconnect guard -> FastAPI.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import FastAPI

from prospero.api import (
    routes_agents,
    routes_dashboard,
    routes_decisions,
    routes_fleet,
    routes_health,
    routes_workspaces,
)
from prospero.api.auth import AuthMiddleware
from prospero.api.deps import ApiState, AppRuntime
from prospero.api.errors import install_error_handlers
from prospero.api.middleware import (
    AccessLogMiddleware,
    BodyLimitMiddleware,
    StreamDisconnectGuard,
)
from prospero.api.settings import ApiSettings


def _version() -> str:
    try:
        return version("prospero")
    except PackageNotFoundError:
        return "0.0.0"


DESCRIPTION = """
Control plane for fleets of caliban coding agents.

Errors are `{"error": "<message>", "kind": "<code>"}`. When API tokens are configured every
endpoint except `/healthz` needs `Authorization: Bearer <token>`; the two SSE endpoints also
accept `?access_token=<token>` because a browser EventSource cannot set headers.
"""


def create_app(runtime: AppRuntime, settings: ApiSettings | None = None) -> FastAPI:
    if settings is None:
        config: Any = getattr(runtime, "config", None)
        settings = ApiSettings(api_tokens=dict(getattr(config, "api_tokens", {}) or {}))
    app = FastAPI(
        title="prosperod",
        version=_version(),
        description=DESCRIPTION,
        openapi_url="/openapi.json",
    )
    state = ApiState(runtime, settings)
    app.state.api = state
    install_error_handlers(app)
    app.include_router(routes_health.router)
    app.include_router(routes_fleet.router)
    app.include_router(routes_workspaces.router)
    app.include_router(routes_agents.router)
    app.include_router(routes_decisions.router)
    routes_dashboard.install_routes(app)
    # add_middleware prepends: the last one added is the outermost.
    app.add_middleware(StreamDisconnectGuard)
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=settings.max_body_bytes, metrics=runtime.metrics
    )
    app.add_middleware(AuthMiddleware, tokens=settings.api_tokens, metrics=runtime.metrics)
    # The dashboard's static files hold no data: served before bearer auth (the page asks for a
    # token when the API answers 401).
    app.add_middleware(routes_dashboard.DashboardAssets)
    app.add_middleware(AccessLogMiddleware, metrics=runtime.metrics, enabled=settings.access_log)
    return app


def api_state_of(app: FastAPI) -> ApiState:
    state: ApiState = app.state.api
    return state
