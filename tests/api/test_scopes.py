"""Scoped tokens over real HTTP (ADR 0010): the route table, 401/403, the per-IP auth-failure
limit (429), the dashboard's session cookie, the audit log."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.routing import Mount

from prospero.api.auth import ROUTE_TABLE, SESSION_COOKIE, classify, required_scope
from prospero.core.tokens import Scope, TokenTable, add_token
from prospero.daemon.config import load_config
from prospero.daemon.main import api_auth
from tests.api.conftest import Stack, StackFactory, envelope, sse_headers
from tests.support import wait_until

READ, OPERATE, ADMIN = Scope.read, Scope.operate, Scope.admin
OPEN = None

# Every route the app serves, classified on purpose: a new route fails
# `test_every_route_is_classified` until it is added here (and, unless it fits a rule, to
# auth.ROUTE_TABLE, where it would otherwise need `admin`).
EXPECTED: dict[tuple[str, str], Scope | None] = {
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/"): OPEN,
    ("GET", "/ui/{path:path}"): OPEN,
    ("GET", "/openapi.json"): OPEN,
    ("GET", "/docs"): OPEN,
    ("GET", "/docs/oauth2-redirect"): OPEN,
    ("GET", "/docs/{name}"): OPEN,
    ("GET", "/redoc"): OPEN,
    ("GET", "/api/session"): OPEN,
    ("POST", "/api/session"): OPEN,
    ("DELETE", "/api/session"): OPEN,
    ("GET", "/metrics"): READ,
    ("GET", "/api/metrics"): READ,
    ("GET", "/api/capabilities"): READ,
    ("GET", "/api/cluster"): READ,
    ("GET", "/api/fleet"): READ,
    ("GET", "/api/stream"): READ,
    ("GET", "/api/usage"): READ,
    ("GET", "/api/dashboard/summary"): READ,
    ("GET", "/api/workspaces"): READ,
    ("GET", "/api/workspaces/{workspace}/agents"): READ,
    ("GET", "/api/workspaces/{workspace}/policy"): READ,
    ("GET", "/api/agent-ids/{prefix}"): READ,
    ("GET", "/api/agents/{agent_id}"): READ,
    ("GET", "/api/agents/{agent_id}/events"): READ,
    ("GET", "/api/agents/{agent_id}/stream"): READ,
    ("GET", "/api/decisions"): READ,
    ("GET", "/api/decisions/{decision_id}"): READ,
    ("POST", "/api/workspaces/{workspace}/agents"): OPERATE,
    ("DELETE", "/api/agents/{agent_id}"): OPERATE,
    ("POST", "/api/agents/{agent_id}/kill"): OPERATE,
    ("POST", "/api/agents/{agent_id}/adopt"): OPERATE,
    ("POST", "/api/agents/{agent_id}/respawn"): OPERATE,
    ("POST", "/api/agents/{agent_id}/input"): OPERATE,
    ("POST", "/api/agents/{agent_id}/end-input"): OPERATE,
    ("POST", "/api/agents/{agent_id}/cancel"): OPERATE,
    ("POST", "/api/agents/{agent_id}/drain"): OPERATE,
    ("POST", "/api/decisions/{decision_id}"): OPERATE,
    ("GET", "/mcp"): OPERATE,
    ("POST", "/mcp"): OPERATE,
    ("DELETE", "/mcp"): OPERATE,
    ("POST", "/api/workspaces"): ADMIN,
    ("DELETE", "/api/workspaces/{name}"): ADMIN,
    ("PUT", "/api/workspaces/{name}/config"): ADMIN,
    ("PATCH", "/api/workspaces/{name}/config"): ADMIN,
    ("PUT", "/api/workspaces/{workspace}/policy"): ADMIN,
    ("PATCH", "/api/workspaces/{workspace}/policy"): ADMIN,
    ("GET", "/api/automations"): READ,
    ("GET", "/api/automations/{ref}"): READ,
    ("GET", "/api/automations/{ref}/runs"): READ,
    ("POST", "/api/automations/{ref}/trigger"): OPEN,
    ("POST", "/api/automations/{ref}/enable"): OPERATE,
    ("POST", "/api/automations/{ref}/disable"): OPERATE,
    ("POST", "/api/automations/{ref}/run"): OPERATE,
    ("POST", "/api/automations"): ADMIN,
    ("PATCH", "/api/automations/{ref}"): ADMIN,
    ("DELETE", "/api/automations/{ref}"): ADMIN,
    ("POST", "/api/automations/{ref}/rotate-secret"): ADMIN,
    ("GET", "/api/notifications/targets"): READ,
    ("GET", "/api/notifications/targets/{ref}"): READ,
    ("GET", "/api/notifications/deliveries"): READ,
    ("POST", "/api/notifications/targets"): ADMIN,
    ("PATCH", "/api/notifications/targets/{ref}"): ADMIN,
    ("DELETE", "/api/notifications/targets/{ref}"): ADMIN,
    ("POST", "/api/notifications/targets/{ref}/test"): ADMIN,
}


def app_routes(app: FastAPI) -> set[tuple[str, str]]:
    """(method, path template) of every route the app serves (HEAD folded into GET)."""
    out: set[tuple[str, str]] = set()

    def walk(routes: Any, prefix: str = "") -> None:
        for r in routes:
            inner = getattr(r, "original_router", None)  # FastAPI's lazily included router
            if inner is not None:
                walk(inner.routes, prefix)
            elif isinstance(r, Mount):
                out.add(("GET", prefix + r.path + "/{path:path}"))
            else:
                for m in getattr(r, "methods", None) or ():
                    if m != "HEAD":
                        out.add((m, prefix + r.path))

    walk(app.routes)
    return out


def concrete(template: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", template.replace("{path:path}", "app.js"))


async def test_every_route_is_classified(make_stack: StackFactory) -> None:
    stack = await make_stack(workspace=False)
    routes = app_routes(stack.server.app)
    unlisted = sorted(routes - set(EXPECTED))
    assert not unlisted, f"classify these routes in EXPECTED (and auth.ROUTE_TABLE): {unlisted}"
    for (method, template), scope in EXPECTED.items():
        path = concrete(template)
        assert classify(method, path) is not None, (method, template)
        assert required_scope(method, path) == scope, (method, template)
        if method == "GET":
            assert required_scope("HEAD", path) == scope, template


def test_unknown_routes_fail_closed_to_admin() -> None:
    for method, path in [
        ("POST", "/api/agents"),
        ("PUT", "/api/fleet"),
        ("OPTIONS", "/api/fleet"),
        ("GET", "/nope"),
        ("POST", "/api/future/thing"),
        ("DELETE", "/api/decisions/x"),
        ("POST", "/healthz"),
        ("GET", "/api/agents/x/kill/../../../workspaces"),  # a GET under /api/ stays read
    ]:
        expected = READ if method == "GET" and path.startswith("/api/") else ADMIN
        assert required_scope(method, path) == expected, (method, path)
    assert all(r.template.startswith("/") for r in ROUTE_TABLE)


# ------------------------------------------------------------------------------ live stacks


def scoped_table(tmp: Path) -> tuple[TokenTable, dict[str, str], Path]:
    path = tmp / "tokens"
    tokens = {name: add_token(path, name, Scope[name]) for name in ("read", "operate", "admin")}
    return TokenTable(path), tokens, path


async def scoped_stack(
    make_stack: StackFactory, tmp_path: Path, **kw: Any
) -> tuple[Stack, dict[str, str], Path]:
    table, tokens, path = scoped_table(tmp_path)
    stack = await make_stack(tokens=table, client_token=tokens["admin"], **kw)
    return stack, tokens, path


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def call(
    c: httpx.AsyncClient, method: str, path: str, headers: dict[str, str]
) -> httpx.Response:
    if path.endswith("/stream"):
        async with c.stream("GET", path, headers={**sse_headers(), **headers}) as resp:
            return resp
    body: Any = {} if method in ("POST", "PUT", "PATCH") else None
    return await c.request(method, path, json=body, headers=headers)


async def test_scope_matrix(make_stack: StackFactory, tmp_path: Path) -> None:
    stack, tokens, _ = await scoped_stack(make_stack, tmp_path)
    agent = await stack.spawn("slow")
    anon = httpx.AsyncClient(base_url=stack.url, timeout=20, headers={"X-Prospero-Client": "t"})
    try:
        for (method, template), need in sorted(EXPECTED.items(), key=str):
            if template in ("/api/session", "/docs/oauth2-redirect"):
                continue
            path = (
                concrete(template)
                .replace("/agents/x", f"/agents/{agent}")
                .replace("/workspaces/x/", "/workspaces/ws/")
            )
            if method == "DELETE" and template == "/api/workspaces/{name}":
                path = "/api/workspaces/nope"
            if need is None:
                r = await call(anon, method, path, {})
                if template == "/api/automations/{ref}/trigger":
                    # open to tokens: its 401 is the missing webhook signature's (an unknown
                    # automation is answered as a known one), and a token does not change it
                    assert r.status_code == 401 and "X-Prospero-Signature" in r.text, r.text
                    r2 = await call(anon, method, path, bearer(tokens[ADMIN.name]))
                    assert (r2.status_code, r2.json()) == (r.status_code, r.json())
                    continue
                assert r.status_code not in (401, 403), (method, path, r.status_code)
                continue
            r = await call(anon, method, path, {})
            assert r.status_code == 401, (method, path, r.status_code)
            for held in (READ, OPERATE, ADMIN):
                r = await call(anon, method, path, bearer(tokens[held.name]))
                if held < need:
                    body = envelope(r, 403, "forbidden")
                    assert f"'{need.name}'" in body["error"] and f"'{held.name}'" in body["error"]
                else:
                    assert r.status_code not in (401, 403), (method, path, held, r.text)
        # the agent was only touched by tokens allowed to
        r = await anon.get(f"/api/agents/{agent}", headers=bearer(tokens["read"]))
        assert r.status_code in (200, 404)
    finally:
        await anon.aclose()


async def test_operate_can_run_agents_but_not_workspaces(
    make_stack: StackFactory, tmp_path: Path
) -> None:
    stack, tokens, _ = await scoped_stack(make_stack, tmp_path)
    c = stack.client
    op = bearer(tokens["operate"])
    r = await c.post(
        "/api/workspaces/ws/agents", json={"prompt": "hi", "isolation": "shared"}, headers=op
    )
    assert r.status_code == 201, r.text
    agent = r.json()["agent_id"]
    await stack.wait_finished(agent)
    r = await c.get(f"/api/agents/{agent}/events", headers=bearer(tokens["read"]))
    assert r.status_code == 200 and r.json()
    envelope(
        await c.post("/api/workspaces", json={"name": "w2", "root": str(tmp_path)}, headers=op),
        403,
        "forbidden",
    )
    envelope(await c.delete("/api/workspaces/ws", headers=op), 403, "forbidden")
    assert (await c.get("/api/workspaces", headers=op)).status_code == 200
    ws = [w["name"] for w in (await c.get("/api/workspaces")).json()]
    assert "ws" in ws
    envelope(
        await c.post(f"/api/agents/{agent}/kill", headers=bearer(tokens["read"])), 403, "forbidden"
    )


async def test_tokens_file_changes_apply_without_restart(
    make_stack: StackFactory, tmp_path: Path
) -> None:
    stack, tokens, path = await scoped_stack(make_stack, tmp_path)
    c = stack.client
    late = add_token(path, "late", Scope.read)
    assert (await c.get("/api/fleet", headers=bearer(late))).status_code == 200
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("late ")]
    path.write_text("\n".join(lines) + "\n")
    envelope(await c.get("/api/fleet", headers=bearer(late)), 401, "unauthorized")
    assert (await c.get("/api/fleet", headers=bearer(tokens["read"]))).status_code == 200
    await c.aclose()


async def test_prospero_api_token_env_is_admin(make_stack: StackFactory, tmp_path: Path) -> None:
    _, tokens, path = scoped_table(tmp_path)
    data = tmp_path / "data"
    cfg = load_config(
        ["--api-tokens-file", str(path), "--data-dir", str(data)],
        {"PROSPERO_API_TOKEN": "env-secret-123"},
    )
    table, key = api_auth(cfg)
    assert key is not None and len(key) == 32 and (data / "session.key").exists()
    stack = await make_stack(tokens=table)
    c = stack.client
    r = await c.post(
        "/api/workspaces",
        json={"name": "w2", "root": str(tmp_path)},
        headers=bearer("env-secret-123"),
    )
    assert r.status_code == 201, r.text
    r = await c.get("/api/session", headers=bearer("env-secret-123"))
    assert r.json() == {"name": "env", "scope": "admin", "via": "bearer"}
    r = await c.get("/api/session", headers=bearer(tokens["operate"]))
    assert r.json() == {"name": "operate", "scope": "operate", "via": "bearer"}


# ------------------------------------------------------------------------------ rate limit


async def test_auth_failures_are_rate_limited_per_ip(
    make_stack: StackFactory, tmp_path: Path
) -> None:
    stack, tokens, _ = await scoped_stack(
        make_stack, tmp_path, api={"auth_failure_limit": 3, "auth_failure_window": 60.0}
    )
    c = stack.client
    # requests without credentials are not guesses: never limited
    for _ in range(6):
        envelope(await c.get("/api/fleet", headers={"Authorization": ""}), 401, "unauthorized")
    for _ in range(3):
        envelope(await c.get("/api/fleet", headers=bearer("pspo_guess")), 401, "unauthorized")
    r = await c.get("/api/fleet", headers=bearer(tokens["admin"]))  # even a good token now
    envelope(r, 429, "rate_limited")
    assert 1 <= int(r.headers["retry-after"]) <= 60
    envelope(await c.post("/api/session", json={"token": tokens["admin"]}), 429, "rate_limited")
    assert (await c.get("/healthz")).status_code == 200  # open routes are not limited
    assert stack.runtime.metrics.get("api_auth_rate_limited") >= 2
    # another client address is unaffected
    other = httpx.AsyncClient(
        base_url=stack.url,
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        timeout=20,
    )
    try:
        assert (await other.get("/api/fleet", headers=bearer(tokens["read"]))).status_code == 200
    finally:
        await other.aclose()


async def test_a_foreign_page_can_neither_test_tokens_nor_lock_the_user_out(
    make_stack: StackFactory, tmp_path: Path
) -> None:
    stack, tokens, _ = await scoped_stack(
        make_stack, tmp_path, api={"auth_failure_limit": 3, "auth_failure_window": 60.0}
    )
    c = httpx.AsyncClient(base_url=stack.url, timeout=20)  # no default credentials
    foreign = {"Origin": "http://evil.test", "Sec-Fetch-Site": "cross-site"}
    # an EventSource from another site: refused whether the guessed token is right or wrong
    for token in ("pspo_guess", tokens["admin"]):
        r = await c.get(f"/api/stream?access_token={token}", headers=foreign)
        envelope(r, 403, "cross_origin")
    # a foreign page's wrong credentials (e.g. a tossed cookie) do not spend the IP's budget
    for _ in range(6):
        r = await c.get("/api/fleet", headers={**foreign, "Cookie": f"{SESSION_COOKIE}=forged"})
        envelope(r, 401, "unauthorized")
    assert (await c.get("/api/fleet", headers=bearer(tokens["read"]))).status_code == 200


async def test_rate_limit_window_frees_up(make_stack: StackFactory, tmp_path: Path) -> None:
    stack, tokens, _ = await scoped_stack(
        make_stack, tmp_path, api={"auth_failure_limit": 2, "auth_failure_window": 0.5}
    )
    c = stack.client
    for _ in range(2):
        envelope(await c.post("/api/session", json={"token": "pspo_wrong"}), 401, "unauthorized")
    envelope(await c.get("/api/fleet", headers=bearer(tokens["read"])), 429, "rate_limited")

    async def free() -> bool:
        r = await c.get("/api/fleet", headers=bearer(tokens["read"]))
        return r.status_code == 200

    await wait_until(free, 10, interval=0.1, what="rate limit window over")


# ------------------------------------------------------------------------------ sessions


def cookie_of(resp: httpx.Response) -> tuple[str, str]:
    raw = resp.headers["set-cookie"]
    value = raw.split(";", 1)[0].split("=", 1)[1]
    return raw, value


def with_cookie(value: str, **extra: str) -> dict[str, str]:
    return {"Cookie": f"{SESSION_COOKIE}={value}", **extra}


async def test_session_cookie_sign_in_and_out(make_stack: StackFactory, tmp_path: Path) -> None:
    stack, tokens, path = await scoped_stack(make_stack, tmp_path)
    anon = httpx.AsyncClient(base_url=stack.url, timeout=20)
    try:
        envelope(await anon.get("/api/session"), 401, "unauthorized")
        envelope(await anon.post("/api/session", json={"token": "nope"}), 401, "unauthorized")
        envelope(await anon.post("/api/session", json={}), 422, "invalid_request")
        r = await anon.post("/api/session", json={"token": tokens["operate"]})
        assert r.status_code == 204, r.text
        raw, value = cookie_of(r)
        attrs = [a.strip().lower() for a in raw.split(";")[1:]]
        assert "httponly" in attrs and "samesite=strict" in attrs and "path=/" in attrs
        assert "secure" not in attrs  # plain http here
        assert any(a.startswith("max-age=") and int(a[8:]) > 0 for a in attrs)
        assert tokens["operate"] not in raw
        anon.cookies.clear()

        r = await anon.get("/api/session", headers=with_cookie(value))
        assert r.json() == {"name": "operate", "scope": "operate", "via": "cookie"}
        assert (await anon.get("/api/fleet", headers=with_cookie(value))).status_code == 200
        # the live stream works with the cookie alone
        async with anon.stream(
            "GET", "/api/stream", headers={**sse_headers(), **with_cookie(value)}
        ) as resp:
            assert resp.status_code == 200
        # scope still applies to cookie sessions
        same = {"Origin": stack.url, "Sec-Fetch-Site": "same-origin"}
        envelope(
            await anon.post(
                "/api/workspaces",
                json={"name": "w", "root": "/"},
                headers=with_cookie(value, **same),
            ),
            403,
            "forbidden",
        )
        # tampering with the payload or the signature -> 401
        head, payload, sig = value.split(".")
        for bad in (
            f"{head}.{payload}x.{sig}",
            f"{head}.{payload}.{sig[:-2]}AA",
            f"{head}.{payload}",
            "garbage",
        ):
            envelope(await anon.get("/api/fleet", headers=with_cookie(bad)), 401, "unauthorized")
        # sign out clears the cookie
        r = await anon.delete("/api/session", headers={"X-Prospero-Client": "t"})
        assert r.status_code == 204
        assert "max-age=0" in r.headers["set-cookie"].lower()
        # removing the token from the file ends its sessions
        lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("operate ")]
        path.write_text("\n".join(lines) + "\n")
        body = envelope(
            await anon.get("/api/fleet", headers=with_cookie(value)), 401, "unauthorized"
        )
        assert "revoked" in body["error"]
    finally:
        await anon.aclose()


async def test_session_expires(make_stack: StackFactory, tmp_path: Path) -> None:
    stack, tokens, _ = await scoped_stack(make_stack, tmp_path, api={"session_ttl": 1.0})
    anon = httpx.AsyncClient(base_url=stack.url, timeout=20)
    try:
        _, value = cookie_of(await anon.post("/api/session", json={"token": tokens["read"]}))
        anon.cookies.clear()

        async def expired() -> bool:
            r = await anon.get("/api/fleet", headers=with_cookie(value))
            return r.status_code == 401 and "expired" in r.json()["error"]

        await wait_until(expired, 10, interval=0.2, what="session expired")
    finally:
        await anon.aclose()


async def test_cookie_mutations_need_same_origin_evidence(
    make_stack: StackFactory, tmp_path: Path
) -> None:
    stack, tokens, _ = await scoped_stack(make_stack, tmp_path)
    agent = await stack.spawn("slow")
    anon = httpx.AsyncClient(base_url=stack.url, timeout=20)
    try:
        _, value = cookie_of(await anon.post("/api/session", json={"token": tokens["operate"]}))
        anon.cookies.clear()
        # passes the OriginGuard (a non-simple header, nothing cross-site) but carries no
        # positive same-origin evidence: refused for a cookie session
        r = await anon.post(
            f"/api/agents/{agent}/kill", headers=with_cookie(value, **{"X-Prospero-Client": "x"})
        )
        envelope(r, 403, "cross_origin")
        assert (await stack.client.get(f"/api/agents/{agent}")).json()["status"] != "killed"
        # with an Origin equal to its own origin the cookie session may change state
        r = await anon.post(
            f"/api/agents/{agent}/kill",
            headers=with_cookie(value, **{"X-Prospero-Client": "x", "Origin": stack.url}),
        )
        assert r.status_code in (200, 202, 204), r.text
    finally:
        await anon.aclose()


async def test_https_session_cookie_is_secure(make_stack: StackFactory, tmp_path: Path) -> None:
    from prospero.api.auth import Authenticator, SessionSigner
    from prospero.api.settings import ApiSettings

    table, tokens, _ = scoped_table(tmp_path)
    auth = Authenticator(ApiSettings(tokens=table))
    entry = table.match(tokens["read"])
    assert entry is not None
    header = auth.signer.set_cookie_header(auth.signer.issue(entry), secure=True).decode()
    assert header.endswith("; Secure")
    assert SessionSigner.clear_cookie_header(True).decode().endswith("; Secure")
    # a cookie signed with another key (another prosperod, or a forger) is refused
    other = SessionSigner(b"k" * 32, 60)
    ident, _, forged = auth.signer.verify(other.issue(entry), table)
    assert ident is None and forged


# ------------------------------------------------------------------------------ audit


async def test_audit_names_the_token(
    make_stack: StackFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="prospero.audit")
    stack, tokens, _ = await scoped_stack(make_stack, tmp_path)
    c = stack.client
    r = await c.post(
        "/api/workspaces/ws/agents",
        json={"prompt": "hi", "isolation": "shared"},
        headers=bearer(tokens["operate"]),
    )
    assert r.status_code == 201
    await c.post("/api/workspaces", json={"name": "w", "root": "/"}, headers=bearer(tokens["read"]))
    await c.get("/api/fleet", headers=bearer(tokens["read"]))
    records = [rec for rec in caplog.records if rec.name == "prospero.audit"]
    seen = [(rec.actor, rec.method, rec.path, rec.status) for rec in records]  # type: ignore[attr-defined]
    assert ("operate", "POST", "/api/workspaces/ws/agents", 201) in seen
    assert ("read", "POST", "/api/workspaces", 403) in seen
    assert not any(m == "GET" for _a, m, _p, _s in seen)  # reads are not audited
    text = "\n".join(f"{rec.getMessage()} {rec.__dict__}" for rec in records)
    for token in tokens.values():
        assert token not in text
