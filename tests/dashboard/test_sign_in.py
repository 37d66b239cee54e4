"""Signing in to the dashboard with a scoped token (ADR 0010): the token is exchanged for an
HttpOnly, SameSite=Strict session cookie (never stored by the page), the fleet and its live
streams run on the cookie alone, every request says `X-Prospero-Client: dashboard`, cookie
mutations work from the page itself, and revoking the token or signing out brings the form
back."""

from __future__ import annotations

from pathlib import Path

from playwright.async_api import Request, expect

from prospero.core.tokens import Scope, TokenTable, add_token
from tests.dashboard.conftest import SessionFactory, StackFactory

API_MODULE = "/ui/js/api.js"


async def test_sign_in_with_a_token_and_live_fleet(
    make_stack: StackFactory, open_session: SessionFactory, tmp_path: Path
) -> None:
    path = tmp_path / "tokens"
    ui = add_token(path, "ui", Scope.operate)
    admin = add_token(path, "admin", Scope.admin)
    stack = await make_stack(tokens=TokenTable(path), client_token=admin)
    s = await open_session(stack)
    page = s.page
    api_requests: list[Request] = []
    page.on("request", lambda req: api_requests.append(req) if "/api/" in req.url else None)

    await s.open()
    form = page.locator("#token-form")
    await expect(form).to_be_visible()
    await expect(form).to_contain_text("Sign in")
    await s.shot("sign-in", full_page=False)

    await page.fill("#token-input", "pspo_wrong")
    await page.click('#token-form button[type="submit"]')
    await expect(page.locator("#token-form .form-error")).to_have_text("Invalid token")
    await page.fill("#token-input", ui)
    await page.click('#token-form button[type="submit"]')
    await expect(form).to_have_count(0)
    await expect(page.locator(".ws-card")).to_have_count(1)
    await expect(page.locator("#signout")).to_be_visible()
    await expect(page.locator("#signout")).to_have_attribute("title", "Signed in as ui (operate)")

    # the page keeps no token; the cookie is HttpOnly + SameSite=Strict
    storage = await page.evaluate("JSON.stringify([{...sessionStorage}, {...localStorage}])")
    assert ui not in storage
    assert "prospero_session" not in await page.evaluate("document.cookie")
    cookies = [c for c in await page.context.cookies() if c["name"] == "prospero_session"]
    assert len(cookies) == 1
    assert cookies[0]["httpOnly"] and cookies[0]["sameSite"] == "Strict"
    assert ui not in cookies[0]["value"]

    # the live fleet stream runs on the cookie (no ?access_token) and delivers changes
    await expect(page.locator("#conn")).to_have_text("live")
    agent_id = await stack.spawn("paced: signed in")
    await expect(page.locator(f'tr.agent-row[data-agent-id="{agent_id}"] .pill')).to_have_text(
        "done"
    )
    streams = [r.url for r in api_requests if "/stream" in r.url]
    assert any("/api/stream?" in u for u in streams), streams
    assert all("access_token" not in u for u in streams), streams
    assert all(
        r.headers.get("x-prospero-client") == "dashboard"
        for r in api_requests
        if r.resource_type == "fetch"
    )
    assert all("authorization" not in r.headers for r in api_requests)

    # a reload keeps the session; the per-agent stream works too
    await page.reload()
    await expect(page.locator(".ws-card")).to_have_count(1)
    assert await page.locator("#token-form").count() == 0
    await page.locator(f'tr.agent-row[data-agent-id="{agent_id}"] .agent-link').click()
    await expect(page.locator(".tl-finished")).to_be_visible()
    assert any(f"/api/agents/{agent_id}/stream?" in r.url for r in api_requests)

    # a state change from the page itself is accepted on the cookie (same-origin evidence)
    slow = await stack.spawn("slow: to be killed")
    await stack.wait_status(slow, "running", "idle")
    result = await page.evaluate(
        """async ([mod, id]) => {
             const api = await import(mod);
             try { await api.post(`/api/agents/${id}/kill`); return "ok"; }
             catch (e) { return `${e.status} ${e.kind}`; }
           }""",
        [API_MODULE, slow],
    )
    assert result == "ok"
    await stack.wait_status(slow, "killed")
    # ... within its scope: an operate session cannot add workspaces
    result = await page.evaluate(
        """async (mod) => {
             const api = await import(mod);
             try { await api.post("/api/workspaces", {name: "w", root: "/"}); return "ok"; }
             catch (e) { return `${e.status} ${e.kind}`; }
           }""",
        API_MODULE,
    )
    assert result == "403 forbidden"

    # signing out clears the cookie and brings the form back
    await page.click("#signout")
    await expect(page.locator("#token-form")).to_be_visible()
    assert not [c for c in await page.context.cookies() if c["name"] == "prospero_session"]
    assert s.log.errors == []
    assert await page.evaluate("window.__csp") == []


async def test_revoked_token_ends_the_session(
    make_stack: StackFactory, open_session: SessionFactory, tmp_path: Path
) -> None:
    path = tmp_path / "tokens"
    viewer = add_token(path, "viewer", Scope.read)
    admin = add_token(path, "admin", Scope.admin)
    stack = await make_stack(tokens=TokenTable(path), client_token=admin)
    s = await open_session(stack)
    page = s.page
    await s.open()
    await page.fill("#token-input", viewer)
    await page.click('#token-form button[type="submit"]')
    await expect(page.locator(".ws-card")).to_have_count(1)

    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("viewer ")]
    path.write_text("\n".join(lines) + "\n")
    await page.reload()
    await expect(page.locator("#token-form")).to_be_visible()
    await expect(page.locator("#sign-in-reason")).to_contain_text("revoked")
    await page.fill("#token-input", admin)
    await page.click('#token-form button[type="submit"]')
    await expect(page.locator(".ws-card")).to_have_count(1)
    assert s.log.errors == []
