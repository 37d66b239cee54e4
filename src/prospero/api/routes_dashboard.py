"""The web dashboard served by prosperod at `/` (prospero-surface.md §6; issue 6).

Everything ships inside the package (`prospero/api/dashboard/`: `index.html`, plain ES modules,
CSS; no build step, no CDN). Assets are read once into an exact-match table keyed by URL path
(`/` and `/ui/<relative path>`), so a path that is not a known file — traversal included — is a
404, never a filesystem lookup.

Every dashboard response carries a strict Content-Security-Policy (no inline script or style,
same-origin connections only), `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`
and `Cache-Control: no-cache` with an ETag (a reload revalidates; an unchanged file answers 304).

Authentication: the assets hold no data, so they are public even when API tokens are
configured — the page shows a sign-in form when the API answers 401 and exchanges the token for
an HttpOnly session cookie (`POST /api/session`; the page never keeps the token), which then
authenticates its fetches and EventSources.
`DashboardAssets` is a pure-ASGI middleware placed outside the bearer-auth middleware that
answers GET/HEAD for exactly the asset paths and hands everything else on; the same responses
are also registered as routes by `install_routes` (so the app lists `/`).

`GET /api/dashboard/summary` (behind auth like any API call) gives what the fleet overview
needs beyond `/api/fleet`: per-agent token/cost/turn totals folded from the agents' stored
turn events (per turn, like /api/usage; the finish event gives the outcome) (filtered by kind in the store, cached per agent with the stream's
high-water mark, so refreshes only read new events) and the
store's last ordinal, where the fleet SSE stream is resumed from.
"""

from __future__ import annotations

import asyncio
import hashlib
import mimetypes
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from pydantic import BaseModel, Field
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from prospero.api.deps import ApiState, api_state
from prospero.api.responses import json_response
from prospero.core.store.base import EventStore
from prospero.types.events import AgentFinished, FleetEvent, TurnFinished


def content_security_policy(script_src: str = "'self'") -> str:
    """The dashboard's policy; `/docs` differs only in allowing its inline script by hash."""
    return "; ".join(
        [
            "default-src 'self'",
            f"script-src {script_src}",
            "style-src 'self'",
            "img-src 'self' data:",
            "font-src 'self'",
            "connect-src 'self'",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )


CSP = content_security_policy()

ASSET_PREFIX = "/ui/"
INDEX_PATHS = frozenset({"/", "/index.html"})
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".json": "application/json",
    ".png": "image/png",
    ".ico": "image/x-icon",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def _content_type(name: str) -> str | None:
    dot = name.rfind(".")
    if dot < 0:
        return None
    return _TYPES.get(name[dot:].lower()) or mimetypes.guess_type(name)[0]


def _walk(node: Traversable, rel: str, out: dict[str, Asset]) -> None:
    for child in node.iterdir():
        name = child.name
        if name.startswith(".") or name == "__pycache__":
            continue
        path = f"{rel}{name}"
        if child.is_dir():
            _walk(child, f"{path}/", out)
            continue
        ctype = _content_type(name)
        if ctype is None:
            continue
        body = child.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        out[ASSET_PREFIX + path] = Asset(body, ctype, etag)


def load_assets() -> dict[str, Asset]:
    """URL path -> asset, for every file under `prospero/api/dashboard/` (read once)."""
    table: dict[str, Asset] = {}
    root = resources.files("prospero.api").joinpath("dashboard")
    if root.is_dir():
        _walk(root, "", table)
    index = table.get(ASSET_PREFIX + "index.html")
    if index is not None:
        for p in INDEX_PATHS:
            table[p] = index
    return table


ASSETS: dict[str, Asset] = load_assets()


def security_headers() -> dict[str, str]:
    return {
        "Content-Security-Policy": CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
        "Cross-Origin-Opener-Policy": "same-origin",
    }


def _not_found() -> Response:
    return Response(
        b'{"error":"no such dashboard asset","kind":"not_found"}',
        status_code=404,
        media_type="application/json",
        headers=security_headers(),
    )


def asset_response(path: str, if_none_match: str | None = None) -> Response:
    asset = ASSETS.get(path)
    if asset is None:
        return _not_found()
    headers = {**security_headers(), "Cache-Control": "no-cache", "ETag": asset.etag}
    if if_none_match is not None and asset.etag in {t.strip() for t in if_none_match.split(",")}:
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.content_type, headers=headers)


def is_asset_path(path: str) -> bool:
    return path in INDEX_PATHS or path.startswith(ASSET_PREFIX)


class DashboardAssets:
    """Serve the dashboard's static files ahead of bearer auth (they hold no data)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] in ("GET", "HEAD")
            and is_asset_path(scope["path"])
        ):
            inm: str | None = None
            for key, value in scope.get("headers", ()):
                if key == b"if-none-match":
                    inm = bytes(value).decode("latin-1")
            await asset_response(scope["path"], inm)(scope, receive, send)
            return
        await self.app(scope, receive, send)


router = APIRouter(tags=["dashboard"])


async def index(request: Request) -> Response:
    return asset_response("/", request.headers.get("if-none-match"))


async def ui_asset(request: Request, path: str) -> Response:
    return asset_response(ASSET_PREFIX + path, request.headers.get("if-none-match"))


def install_routes(app: FastAPI) -> None:
    """Register the dashboard's routes on the app itself (so `app.routes` lists `/`) and the
    summary endpoint. `DashboardAssets` must be added separately, outside bearer auth."""
    app.add_api_route("/", index, methods=["GET"], include_in_schema=False)
    app.add_api_route("/ui/{path:path}", ui_asset, methods=["GET"], include_in_schema=False)
    app.include_router(router)


# ------------------------------------------------------------------------ per-agent totals


class AgentTotals(BaseModel):
    """Token, cost and turn totals of one agent, folded from its stored events.

    Sums of its `turn_finished` events, counted as each turn ends whatever the agent's state
    (running, idle, killed): the same per-turn accounting as /api/usage. `agent_finished`
    gives the outcome (and model) only: its own totals would count the turns twice, and miss
    turns it does not know of. Null = nothing reported (never a fake 0)."""

    seq: int = 0  # last folded event seq
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    turns: int = 0
    outcome: str | None = None
    model: str | None = None  # the model the agent last reported using


class DashboardSummary(BaseModel):
    last_ordinal: int = 0
    agents: dict[str, AgentTotals] = Field(default_factory=dict)


def _nadd(a: int | None, b: int | None) -> int | None:
    if b is None:
        return a
    return (a or 0) + b


# The only kinds `fold` reads.
FOLDED_KINDS = frozenset({"turn_finished", "agent_finished"})


def fold(totals: AgentTotals, events: list[FleetEvent]) -> None:
    for ev in events:
        totals.seq = max(totals.seq, ev.seq)
        k = ev.kind
        if isinstance(k, TurnFinished):
            totals.turns += 1
            totals.model = k.model or totals.model
            if k.usage is not None:
                totals.input_tokens = _nadd(totals.input_tokens, k.usage.input_tokens)
                totals.output_tokens = _nadd(totals.output_tokens, k.usage.output_tokens)
            if k.cost_usd is not None:
                totals.cost_usd = round((totals.cost_usd or 0.0) + k.cost_usd, 10)
        elif isinstance(k, AgentFinished):
            totals.outcome = k.outcome or None
            totals.model = k.model or totals.model


@dataclass
class TotalsCache:
    agents: dict[str, AgentTotals] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    page: int = 2000

    async def refresh(self, store: EventStore, agent_ids: list[str]) -> dict[str, AgentTotals]:
        async with self.lock:
            keep = set(agent_ids)
            for gone in [a for a in self.agents if a not in keep]:
                del self.agents[gone]
            for agent_id in agent_ids:
                totals = self.agents.setdefault(agent_id, AgentTotals())
                # Everything up to `head` is stored now; only the folded kinds are read.
                head = await store.high_water(agent_id)
                if head <= totals.seq:
                    continue
                while True:
                    batch = await store.replay(
                        agent_id, totals.seq + 1, self.page, kinds=FOLDED_KINDS
                    )
                    if batch:
                        fold(totals, batch)
                    if len(batch) < self.page:
                        break
                totals.seq = max(totals.seq, head)
            return {a: self.agents[a].model_copy() for a in agent_ids}


def _cache(request: Request) -> TotalsCache:
    found: Any = getattr(request.app.state, "dashboard_totals", None)
    if isinstance(found, TotalsCache):
        return found
    cache = TotalsCache()
    request.app.state.dashboard_totals = cache
    return cache


State = Annotated[ApiState, Depends(api_state)]


@router.get(
    "/api/dashboard/summary",
    operation_id="getDashboardSummary",
    response_model=DashboardSummary,
    summary="Dashboard helper: per-agent token/cost/turn totals and the fleet stream position",
    description=(
        "`last_ordinal` is read first: resume `GET /api/stream?from=last_ordinal+1` to see "
        "everything after it. Totals cover each agent's events up to its `seq`; a live event "
        "with a higher seq is not yet in the totals."
    ),
)
async def summary(st: State, request: Request) -> Response:
    store = st.store
    last = await store.last_ordinal()
    snapshot = st.manager.snapshot()
    ids = [a.id for ws in snapshot.workspaces for a in ws.agents]
    totals = await _cache(request).refresh(store, ids)
    return json_response(DashboardSummary(last_ordinal=last, agents=totals))


__all__ = ["CSP", "DashboardAssets", "asset_response", "install_routes", "load_assets", "router"]
