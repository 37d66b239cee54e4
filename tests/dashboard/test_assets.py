"""The dashboard is served from the package with a strict CSP, exact-match asset lookup, no
auth needed for the (data-free) assets, and no way for the code to parse data as HTML."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from prospero.api import routes_dashboard
from tests.dashboard.conftest import StackFactory

DASHBOARD = Path(routes_dashboard.__file__).with_name("dashboard")

CSP_DIRECTIVES = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "connect-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'none'",
    "frame-ancestors": "'none'",
}


def parse_csp(value: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in value.split(";"):
        name, _, rest = part.strip().partition(" ")
        if name:
            out[name] = rest.strip()
    return out


async def test_index_and_assets_with_csp(make_stack: StackFactory) -> None:
    stack = await make_stack(workspaces=())
    c = stack.client
    r = await c.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    csp = parse_csp(r.headers["content-security-policy"])
    for name, value in CSP_DIRECTIVES.items():
        assert csp.get(name) == value, (name, csp)
    assert "unsafe-inline" not in r.headers["content-security-policy"]
    assert "unsafe-eval" not in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"
    # every script and stylesheet the page names is served with the right type and the CSP
    refs = re.findall(r'(?:src|href)="(/ui/[^"]+)"', r.text)
    assert "/ui/js/main.js" in refs and "/ui/app.css" in refs
    for ref in refs:
        a = await c.get(ref)
        assert a.status_code == 200, ref
        assert "content-security-policy" in a.headers
    js = await c.get("/ui/js/main.js")
    assert js.headers["content-type"].startswith("text/javascript")
    assert (await c.get("/ui/app.css")).headers["content-type"].startswith("text/css")
    # revalidation
    again = await c.get("/ui/app.css", headers={"If-None-Match": js.headers["etag"]})
    assert again.status_code == 200
    etag = (await c.get("/ui/app.css")).headers["etag"]
    assert (await c.get("/ui/app.css", headers={"If-None-Match": etag})).status_code == 304


async def test_unknown_and_traversal_paths_are_404(make_stack: StackFactory) -> None:
    stack = await make_stack(workspaces=())
    async with httpx.AsyncClient(base_url=stack.url) as c:
        for path in (
            "/ui/nope.js",
            "/ui/../routes_dashboard.py",
            "/ui/%2e%2e/routes_dashboard.py",
            "/ui/js/../../app.py",
            "/ui/",
            "/ui/js",
        ):
            r = await c.get(path)
            assert r.status_code == 404, path


async def test_assets_open_but_api_needs_token(make_stack: StackFactory) -> None:
    stack = await make_stack(tokens={"ui": "tok-dash-0123456789"}, workspaces=())
    async with httpx.AsyncClient(base_url=stack.url) as anon:
        assert (await anon.get("/")).status_code == 200
        assert (await anon.get("/ui/js/main.js")).status_code == 200
        assert (await anon.get("/api/fleet")).status_code == 401
        assert (await anon.get("/api/dashboard/summary")).status_code == 401
        # the asset bypass covers GET/HEAD of asset paths only
        # (X-Prospero-Client: past the same-origin guard, which would answer 403 first)
        r = await anon.post("/ui/js/main.js", headers={"X-Prospero-Client": "test"})
        assert r.status_code == 401
    r = await stack.client.get("/api/dashboard/summary")
    assert r.status_code == 200 and r.json() == {
        "last_ordinal": r.json()["last_ordinal"],
        "agents": {},
    }


def test_no_inline_script_or_style_and_no_html_sinks() -> None:
    index = (DASHBOARD / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", index), "inline <script>"
    assert "<style" not in index and " style=" not in index
    assert not re.search(r"\son[a-z]+=", index), "inline event handler"
    sinks = re.compile(
        r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|"
        r"createContextualFragment|DOMParser|setAttribute\(\s*['\"]style"
    )
    files = sorted(DASHBOARD.rglob("*.js"))
    assert len(files) >= 10
    for f in files:
        text = f.read_text()
        assert not sinks.search(text), f"{f.name}: {sinks.search(text)}"


def test_every_packaged_file_is_served() -> None:
    table = routes_dashboard.load_assets()
    on_disk = {
        "/ui/" + p.relative_to(DASHBOARD).as_posix()
        for p in DASHBOARD.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert on_disk <= set(table), on_disk - set(table)
    assert table["/"] is table["/ui/index.html"]
