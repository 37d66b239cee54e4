"""`/docs` works offline: Swagger UI, from the package's own assets, renders the whole API in
real Chromium while every request to anywhere but prosperod itself is refused, with no
Content-Security-Policy violation and no console error; "Authorize" with a token and "Try it
out" call the API it documents."""

from __future__ import annotations

from playwright.async_api import Route, expect

from tests.dashboard.conftest import SessionFactory, StackFactory

TOKEN = "docs-token-0123456789"


async def test_docs_render_offline_under_their_csp(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack(tokens={"docs": TOKEN})
    s = await open_session(stack)
    elsewhere: list[str] = []

    async def only_prosperod(route: Route) -> None:
        if route.request.url.startswith(stack.url + "/"):
            await route.continue_()
        else:
            elsewhere.append(route.request.url)
            await route.abort()

    await s.page.route("**/*", only_prosperod)
    await s.open("docs")
    page = s.page
    spawn = page.locator("#operations-workspaces-spawnAgent")
    await expect(spawn).to_be_visible()
    await expect(page.locator("#operations-health-healthz")).to_be_visible()
    assert await page.locator(".opblock").count() >= 30
    await expect(page.locator(".btn.authorize")).to_be_visible()  # the security schemes

    # an operation opens and shows its documented errors, the envelope included
    await spawn.locator(".opblock-summary").click()
    await expect(spawn.locator(".responses-table")).to_contain_text("421")
    await expect(spawn.locator(".responses-table")).to_contain_text("host_not_allowed")
    await s.shot("docs-offline")

    # sign in with the bearer scheme, then try an operation out: it reaches the API
    await page.locator(".btn.authorize").first.click()
    dialog = page.locator(".dialog-ux")
    bearer = dialog.locator(".auth-container").filter(has_text="bearerAuth")
    await bearer.locator("input").fill(TOKEN)
    await bearer.locator("button.authorize").click()
    await dialog.locator("button.btn-done").first.click()
    fleet = page.locator("#operations-fleet-getFleet")
    await fleet.locator(".opblock-summary").click()
    await fleet.locator("button.try-out__btn").click()
    await fleet.locator("button.execute").click()
    live = fleet.locator(".live-responses-table tbody .response-col_status")
    await expect(live.first).to_contain_text("200")
    await expect(fleet.locator(".live-responses-table tbody")).to_contain_text("workspaces")

    assert elsewhere == [], elsewhere
    assert await page.evaluate("window.__csp") == []
    assert s.log.unexpected() == [], s.log.unexpected()
