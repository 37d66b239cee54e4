"""`create_app(runtime)`: the FastAPI application of prosperod.

The API layer is thin: every behaviour lives in the FleetManager and the stores; handlers only
translate HTTP to calls and core errors to the `{error, kind}` envelope.

Middleware, outermost first (each sees only what the ones before it let through):

1. access log — every request gets its line, refusals included;
2. HostGuard — 421 for a Host that is not allowed (DNS rebinding), before anything else answers;
3. HeadAdapter — HEAD answered wherever GET is;
4. dashboard assets — static files, no data, served without credentials;
5. OriginGuard — 403 for a state-changing request that is, or may be, cross-site;
6. auth — tokens and scopes (401/403);
7. body limit (+ body read timeout) — 413/408;
8. SSE disconnect guard — then FastAPI's routes.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

import prospero
from prospero.api import (
    routes_agents,
    routes_automations,
    routes_cluster,
    routes_dashboard,
    routes_decisions,
    routes_fleet,
    routes_health,
    routes_notifications,
    routes_session,
    routes_workspaces,
)
from prospero.api.auth import Authenticator, AuthMiddleware
from prospero.api.deps import ApiState, AppRuntime
from prospero.api.docs import install_docs
from prospero.api.errors import install_error_handlers
from prospero.api.guard import HostGuard, OriginGuard
from prospero.api.head import HeadAdapter
from prospero.api.mcp_server import install_mcp
from prospero.api.middleware import (
    AccessLogMiddleware,
    BodyLimitMiddleware,
    BodySendExtension,
    StreamDisconnectGuard,
)
from prospero.api.openapi import install_openapi
from prospero.api.settings import ApiSettings
from prospero.core.tokens import TokenTable


def _version() -> str:
    return prospero.__version__


DESCRIPTION = """
Control plane for fleets of caliban coding agents.

Errors are `{"error": "<message>", "kind": "<code>"}`. When API tokens are configured
(`prosperod --api-tokens-file`, `prospero token new`), every endpoint except the probes,
`/api/session`, the docs and the dashboard's files needs a token with a large enough scope
(`read < operate < admin`: reads and streams `read`; spawn, agent operations and decisions
`operate`; workspaces, config and policy `admin`), sent as `Authorization: Bearer <token>`, as
`?access_token=<token>` on the two SSE endpoints (a browser EventSource cannot set headers), or
as the `prospero_session` cookie that `POST /api/session` sets for the dashboard. 401 without
valid credentials, 403 `forbidden` with too small a scope, 429 `rate_limited` after repeated
failures.

Requests whose `Host` is not loopback or configured (`prosperod --allowed-host`, `--public-url`)
get 421 `host_not_allowed`. A state-changing request (POST, PUT, PATCH, DELETE) must carry
`Content-Type: application/json`, `Authorization: Bearer <token>` or `X-Prospero-Client: <name>`,
and must not say it comes from another site (`Origin`, `Sec-Fetch-Site`); else 403 `cross_origin`.
"""


def create_app(runtime: AppRuntime, settings: ApiSettings | None = None) -> FastAPI:
    if settings is None:
        config: Any = getattr(runtime, "config", None)
        settings = ApiSettings(
            tokens=TokenTable(
                getattr(config, "api_tokens_file", None), getattr(config, "api_tokens", {}) or {}
            )
        )
        settings.allowed_hosts = list(getattr(config, "allowed_hosts", []) or [])
        public_url = getattr(config, "public_url", None)
        settings.public_origins = [public_url] if public_url else []
    app = FastAPI(
        title="prosperod",
        version=_version(),
        description=DESCRIPTION,
        openapi_url="/openapi.json",
        docs_url=None,  # docs.install_docs: packaged assets, not a CDN
        redoc_url=None,
    )
    state = ApiState(runtime, settings)
    app.state.api = state
    install_error_handlers(app)
    app.include_router(routes_health.router)
    app.include_router(routes_fleet.router)
    app.include_router(routes_workspaces.router)
    app.include_router(routes_agents.router)
    app.include_router(routes_decisions.router)
    app.include_router(routes_session.router)
    app.include_router(routes_cluster.router)
    app.include_router(routes_automations.router)
    app.include_router(routes_notifications.router)
    install_mcp(app, state)  # /mcp: the MCP server (streamable HTTP), behind the same layers
    routes_dashboard.install_routes(app)
    install_docs(app)
    install_openapi(app)
    # add_middleware prepends: the last one added is the outermost.
    app.add_middleware(StreamDisconnectGuard)
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        metrics=runtime.metrics,
        body_timeout=settings.body_timeout,
    )
    app.state.auth = Authenticator(settings, runtime.metrics)
    app.add_middleware(AuthMiddleware, auth=app.state.auth)
    app.add_middleware(OriginGuard, public_origins=settings.public_origins)
    # The dashboard's static files hold no data: served before bearer auth (the page asks for a
    # token when the API answers 401).
    app.add_middleware(routes_dashboard.DashboardAssets)
    app.add_middleware(HeadAdapter)
    app.add_middleware(
        HostGuard, allowed_hosts=settings.allowed_hosts, public_origins=settings.public_origins
    )
    app.add_middleware(AccessLogMiddleware, metrics=runtime.metrics, enabled=settings.access_log)
    app.add_middleware(BodySendExtension)
    return app


def api_state_of(app: FastAPI) -> ApiState:
    state: ApiState = app.state.api
    return state
