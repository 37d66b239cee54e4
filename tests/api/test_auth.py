"""Bearer-token auth: on and off, probes and docs open, ?access_token only for SSE GETs, token
names recorded for audit, tokens never logged. (Scopes, sessions, rate limits: test_scopes.py.)"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import httpx
import pytest

from prospero.core.tokens import TokenTable
from tests.api.conftest import StackFactory, envelope, sse_headers

TOKENS = {"alice": "tok-alice-0123456789", "ci": "tok-ci-9876543210"}


def server_log_text(caplog: pytest.LogCaptureFixture) -> str:
    """Everything the server side logged (the test's own httpx client logs its URLs)."""
    return "\n".join(
        f"{rec.getMessage()} {rec.__dict__}"
        for rec in caplog.records
        if not rec.name.startswith(("httpx", "httpcore"))
    )


def test_match_token_returns_the_name() -> None:
    table = TokenTable.from_plaintext(TOKENS)

    def name(t: str) -> str | None:
        entry = table.match(t)
        return entry.name if entry else None

    assert name("tok-alice-0123456789") == "alice"
    assert name("tok-ci-9876543210") == "ci"
    assert name("tok-alice-012345678") is None  # prefix
    assert name("tok-alice-01234567890") is None  # longer
    assert name("") is None
    assert TokenTable.from_plaintext({}).match("x") is None


async def test_auth_off_everything_open(make_stack: StackFactory) -> None:
    stack = await make_stack()
    for path in ("/api/fleet", "/readyz", "/metrics", "/openapi.json", "/api/workspaces"):
        assert (await stack.client.get(path)).status_code == 200, path


async def test_auth_on_requires_a_valid_bearer(
    make_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    stack = await make_stack(tokens=TOKENS)
    c = stack.client
    # probes and the API description stay open
    r = await c.get("/healthz")
    assert r.status_code == 200 and r.text == "ok"
    for path in ("/readyz", "/openapi.json"):
        assert (await c.get(path)).status_code == 200, path

    for path in ("/api/fleet", "/metrics", "/api/metrics"):
        r = await c.get(path)
        body = envelope(r, 401, "unauthorized")
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert "token" in body["error"]
    envelope(await c.post("/api/workspaces", json={"name": "x", "root": "/x"}), 401, "unauthorized")
    envelope(await c.delete("/api/agents/x"), 401, "unauthorized")
    # unknown routes do not leak their existence before auth
    envelope(await c.get("/api/nope"), 401, "unauthorized")
    # wrong token, wrong scheme, empty bearer
    for header in (
        "Bearer nope",
        f"Basic {TOKENS['alice']}",
        "Bearer",
        f"Bearer {TOKENS['alice']}x",
    ):
        envelope(await c.get("/api/fleet", headers={"Authorization": header}), 401, "unauthorized")
    # either named token works; the scheme is case-insensitive
    for name, token in TOKENS.items():
        r = await c.get("/api/fleet", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, name
    r = await c.get("/api/fleet", headers={"Authorization": f"bearer {TOKENS['ci']}"})
    assert r.status_code == 200
    assert stack.runtime.metrics.get("api_auth_failures") >= 10

    # audit: the token NAME is recorded for the request, the token itself never logged
    names = [
        getattr(rec, "token_name", None)
        for rec in caplog.records
        if rec.name == "prospero.api.access"
    ]
    assert "alice" in names and "ci" in names
    text = server_log_text(caplog)
    for token in TOKENS.values():
        assert token not in text


async def test_access_token_query_only_for_sse_gets(
    make_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    stack = await make_stack(tokens=TOKENS, heartbeat=0.1)
    c = stack.client
    tok = TOKENS["alice"]
    # SSE endpoints accept ?access_token= (EventSource cannot set headers)
    for path in ("/api/agents/whoever/stream", "/api/stream"):
        async with c.stream(
            "GET", path, params={"access_token": tok}, headers=sse_headers()
        ) as resp:
            assert resp.status_code == 200, path
            lines = resp.aiter_lines()

            async def heartbeat(lines: AsyncIterator[str] = lines) -> None:
                async for line in lines:
                    if line == ": heartbeat":
                        return

            await asyncio.wait_for(heartbeat(), 10)
        r = await c.get(path, params={"access_token": "wrong"})
        envelope(r, 401, "unauthorized")
    # ... and nowhere else
    envelope(await c.get("/api/fleet", params={"access_token": tok}), 401, "unauthorized")
    envelope(await c.get("/api/agents/x/events", params={"access_token": tok}), 401, "unauthorized")
    envelope(await c.post("/api/agents/x/kill", params={"access_token": tok}), 401, "unauthorized")
    # the query string (with its token) is never written to the logs
    text = server_log_text(caplog)
    assert tok not in text
    assert "/api/stream" in text


async def test_authenticated_client_full_flow(make_stack: StackFactory) -> None:
    stack = await make_stack(tokens=TOKENS, client_token=TOKENS["ci"])
    agent_id = await stack.spawn()
    await stack.wait_finished(agent_id)
    async with httpx.AsyncClient(base_url=stack.url) as anon:
        envelope(await anon.get(f"/api/agents/{agent_id}/events"), 401, "unauthorized")
