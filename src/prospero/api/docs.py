"""Swagger UI at `/docs`, from packaged assets: it works with no network.

FastAPI's stock `/docs` loads Swagger UI from a CDN, so it is blank offline (and on any
machine that may not reach the CDN). The assets here come from the `fastapi-offline` package
(a PyPI wheel that ships Swagger UI's `swagger-ui-bundle.js` and `swagger-ui.css`; only its
files are used, not its app factory), are read once on first use and served under `/docs/…`
with an ETag. The page is FastAPI's own `get_swagger_ui_html` pointed at those local paths,
with the online validator badge off (`validatorUrl: null`), so nothing it loads leaves the
server.

The page gets its own Content-Security-Policy (the dashboard's is untouched): scripts from
this origin plus the page's one inline bootstrap script, pinned by its SHA-256 hash;
connections to this origin only ("Try it out" calls the API it documents).

Open like `/openapi.json`: the page holds no data; "Try it out" calls carry the token the
user types into "Authorize".
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.responses import Response

from prospero.api.errors import envelope
from prospero.api.routes_dashboard import content_security_policy

DOCS_PATH = "/docs"
ASSET_PACKAGE = "fastapi_offline"
ASSET_FILES: dict[str, str] = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon.png": "image/png",
}


@dataclass(frozen=True)
class DocsAsset:
    body: bytes
    content_type: str
    etag: str


def _etag(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def _inline_script_hashes(html: str) -> list[str]:
    out: list[str] = []
    for m in re.finditer(r"<script>(.*?)</script>", html, flags=re.S):
        digest = hashlib.sha256(m.group(1).encode()).digest()
        out.append("'sha256-" + base64.b64encode(digest).decode() + "'")
    return out


def docs_csp(html: str) -> str:
    return content_security_policy("'self' " + " ".join(_inline_script_hashes(html)))


class DocsSite:
    """The `/docs` page and its assets, built once on first use."""

    def __init__(self, title: str, openapi_url: str) -> None:
        self.title = title
        self.openapi_url = openapi_url
        self._assets: dict[str, DocsAsset] | None = None
        self.csp = ""

    def assets(self) -> dict[str, DocsAsset]:
        if self._assets is None:
            table: dict[str, DocsAsset] = {}
            root = resources.files(ASSET_PACKAGE).joinpath("static")
            for name, ctype in ASSET_FILES.items():
                body = root.joinpath(name).read_bytes()
                table[f"{DOCS_PATH}/{name}"] = DocsAsset(body, ctype, _etag(body))
            html = get_swagger_ui_html(
                openapi_url=self.openapi_url,
                title=f"{self.title} — API",
                swagger_js_url=f"{DOCS_PATH}/swagger-ui-bundle.js",
                swagger_css_url=f"{DOCS_PATH}/swagger-ui.css",
                swagger_favicon_url=f"{DOCS_PATH}/favicon.png",
                swagger_ui_parameters={"validatorUrl": None},
            ).body
            page = DocsAsset(bytes(html), "text/html; charset=utf-8", _etag(bytes(html)))
            table[DOCS_PATH] = page
            self.csp = docs_csp(page.body.decode())
            self._assets = table
        return self._assets

    def respond(self, path: str, if_none_match: str | None) -> Response:
        asset = self.assets().get(path)
        if asset is None:
            return envelope(404, "no such docs asset", "not_found")
        headers = {
            "Cache-Control": "no-cache",
            "ETag": asset.etag,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        }
        if path == DOCS_PATH:
            headers |= {
                "Content-Security-Policy": self.csp,
                "X-Frame-Options": "DENY",
                "Cross-Origin-Opener-Policy": "same-origin",
            }
        if if_none_match is not None and asset.etag in {
            t.strip() for t in if_none_match.split(",")
        }:
            return Response(status_code=304, headers=headers)
        return Response(asset.body, media_type=asset.content_type, headers=headers)


def install_docs(app: FastAPI) -> None:
    """`GET /docs` and `GET /docs/{asset}` (not in the schema). The app must be created with
    `docs_url=None, redoc_url=None` (FastAPI's CDN-loaded pages)."""
    site = DocsSite(app.title, app.openapi_url or "/openapi.json")

    async def docs_page(request: Request) -> Response:
        return site.respond(DOCS_PATH, request.headers.get("if-none-match"))

    async def docs_asset(request: Request, name: str) -> Response:
        return site.respond(f"{DOCS_PATH}/{name}", request.headers.get("if-none-match"))

    app.add_api_route(DOCS_PATH, docs_page, methods=["GET"], include_in_schema=False)
    app.add_api_route(DOCS_PATH + "/{name}", docs_asset, methods=["GET"], include_in_schema=False)


__all__ = ["DOCS_PATH", "DocsSite", "install_docs"]
