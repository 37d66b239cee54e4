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
turn events (per turn, like /api/usage; the finish event gives the outcome) and the
store's last ordinal, where the fleet SSE stream is resumed from. The totals are kept
incrementally against the store's ordinal (`TotalsCache`): a refresh is one
`EventStore.scan_kinds` read of what was stored since the last one (only the folded kinds,
filtered in the store, folded from their stored JSON without building models), so an idle
fleet's refresh costs one small query whatever the number of agents, never one round trip per
agent.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import mimetypes
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from prospero.api.deps import ApiState, api_state
from prospero.core.store.base import EventStore
from prospero.types.events import AgentFinished, FleetEvent, TurnFinished
from prospero.types.summary import AgentTotals, DashboardSummary

log = logging.getLogger(__name__)


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


# One agent's totals as the body carries them: `AgentTotals`' JSON form, in its field order
# (the cache keeps and writes these dicts directly; `AgentTotals` documents them).
_EMPTY_TOTALS: dict[str, Any] = AgentTotals().model_dump(mode="json")


def _nadd_int(a: int | None, b: Any) -> int | None:
    if type(b) is not int:
        return a
    return (a or 0) + b


def fold_row(totals: dict[str, Any], seq: int, raw: bytes) -> None:
    """`fold` of one stored event given as its kind's JSON (`EventStore.scan_kinds` rows):
    the same totals, without building the models. A row that is not a readable kind is
    skipped (as the store's replay skips it)."""
    try:
        k = orjson.loads(raw)
    except orjson.JSONDecodeError:
        log.warning("dashboard totals: skipping unreadable stored event (seq %s)", seq)
        return
    if type(k) is not dict:
        return
    if seq > totals["seq"]:
        totals["seq"] = seq
    tag = k.get("kind")
    if tag == "turn_finished":
        totals["turns"] += 1
        totals["model"] = k.get("model") or totals["model"]
        usage = k.get("usage")
        if type(usage) is dict:
            totals["input_tokens"] = _nadd_int(totals["input_tokens"], usage.get("input_tokens"))
            totals["output_tokens"] = _nadd_int(totals["output_tokens"], usage.get("output_tokens"))
        cost = k.get("cost_usd")
        if type(cost) is float or type(cost) is int:
            totals["cost_usd"] = round((totals["cost_usd"] or 0.0) + cost, 10)
    elif tag == "agent_finished":
        totals["outcome"] = k.get("outcome") or None
        totals["model"] = k.get("model") or totals["model"]


@dataclass
class TotalsCache:
    """Per-agent totals kept incrementally against the store's ordinal: each refresh is one
    `scan_kinds` read of what was stored since the last one (the folded kinds of every
    stream, the heads of the streams that moved), plus, for an agent seen for the first
    time, its older folded events. An idle fleet's refresh costs one small query, whatever
    the number of agents."""

    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    ordinal: int = 0  # every tracked agent is folded up to this store ordinal
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def refresh(
        self, store: EventStore, agent_ids: list[str]
    ) -> tuple[int, dict[str, dict[str, Any]]]:
        """(the store's last ordinal the totals cover, agent id -> a copy of its totals in
        `AgentTotals`' JSON form), in `agent_ids` order."""
        async with self.lock:
            ids = list(dict.fromkeys(agent_ids))
            keep = set(ids)
            for gone in [a for a in self.agents if a not in keep]:
                del self.agents[gone]
            known = list(self.agents)
            scan = await store.scan_kinds(
                ids,
                FOLDED_KINDS,
                after_ordinal=self.ordinal if known else 0,
                known=known,
            )
            agents = self.agents
            for agent_id in ids:
                if agent_id not in agents:
                    agents[agent_id] = dict(_EMPTY_TOTALS)
            for agent_id, seq, raw in scan.rows:
                fold_row(agents[agent_id], seq, raw)
            for agent_id, head in scan.heads.items():
                totals = agents.get(agent_id)
                if totals is not None and head > totals["seq"]:
                    totals["seq"] = head
            self.ordinal = max(self.ordinal, scan.last_ordinal)
            return scan.last_ordinal, {a: dict(agents[a]) for a in ids}


async def render_summary(store: EventStore, agent_ids: list[str], cache: TotalsCache) -> Response:
    """The summary body (`DashboardSummary`'s JSON) for these agents, refreshing `cache`."""
    last, totals = await cache.refresh(store, agent_ids)
    return Response(
        orjson.dumps({"last_ordinal": last, "agents": totals}), media_type="application/json"
    )


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
        "`last_ordinal` is read with the totals, in the same snapshot: resume "
        "`GET /api/stream?from=last_ordinal+1` to see everything after it. Totals cover each agent's events up to its `seq`; a live event "
        "with a higher seq is not yet in the totals."
    ),
)
async def summary(st: State, request: Request) -> Response:
    # The snapshot's agents, in its order, without building 500 agent views.
    return await render_summary(st.store, st.manager.agent_ids(), _cache(request))


__all__ = [
    "CSP",
    "AgentTotals",
    "DashboardAssets",
    "DashboardSummary",
    "asset_response",
    "install_routes",
    "load_assets",
    "router",
]
