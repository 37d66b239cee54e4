"""Usage charts, the workspace config editor, adding a workspace and the theme switch."""

from __future__ import annotations

from typing import Any

from playwright.async_api import expect

from tests.dashboard.conftest import SessionFactory, StackFactory
from tests.support import wait_until


async def test_usage_charts_and_windows(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack(workspaces=("ws", "docs"))
    a = await stack.spawn("tools: read")
    b = await stack.spawn("hello", ws="docs")
    k = await stack.spawn("slow: until killed", ws="docs")
    await stack.wait_status(k, "running")
    assert (await stack.client.post(f"/api/agents/{k}/kill")).status_code == 202
    for agent in (a, b):
        await stack.wait_status(agent, "done")
    await stack.wait_status(k, "killed")

    async def killed_turn_counted() -> bool:
        # Usage is per turn: the killed agent's one finished turn counts too (docs: 1 + 1).
        groups = (await stack.client.get("/api/usage")).json()["groups"]
        return any(g["workspace"] == "docs" and g["turns"] == 2 for g in groups)

    await wait_until(killed_turn_counted, 20, what="the killed agent's turn in /api/usage")

    s = await open_session(stack)
    page = s.page
    streams: list[str] = []
    page.on("request", lambda req: streams.append(req.url) if "/api/usage" in req.url else None)
    await s.open("#/usage")
    await expect(page.locator(".usage-table tbody tr")).to_have_count(2)
    ws_row = page.locator('.usage-table tr[data-workspace="ws"]')
    await expect(ws_row.locator("td").nth(1)).to_have_text("1.7k")  # RunEnd: 1713 in
    docs_row = page.locator('.usage-table tr[data-workspace="docs"]')
    await expect(docs_row.locator("td").nth(6)).to_have_text("1")  # done
    await expect(docs_row.locator("td").nth(8)).to_have_text("1")  # killed
    charts = page.locator("figure.chart")
    await expect(charts).to_have_count(9)  # ... and one per outcome, over budget included
    await expect(
        page.locator('figure.chart svg[aria-label="Tokens per day"] rect.bar')
    ).to_have_count(2)
    await expect(page.locator('figure.chart svg[aria-label="killed"] rect.bar')).to_have_count(1)
    await expect(
        page.locator('figure.chart svg[aria-label="Spend per day (USD)"] path.area')
    ).to_have_count(1)
    tip = await page.locator('svg[aria-label="Turns per day"] rect.bar title').first.text_content()
    assert tip and "turns: 4" in tip  # ws 2 + docs 1 + the killed agent's 1
    await s.shot("usage")

    await page.click('.seg-btn[data-days="30"]')
    await expect(page.locator('.seg-btn[data-days="30"]')).to_have_attribute("aria-pressed", "true")
    await expect(page.locator(".usage-table tbody tr")).to_have_count(2)
    assert any("days=30" in u for u in streams), streams
    await page.click('.seg-btn[data-days="1"]')
    await expect(page.locator('.seg-btn[data-days="1"]')).to_have_attribute("aria-pressed", "true")
    await page.select_option('.page-actions select[aria-label="workspace"]', "docs")
    await expect(page.locator(".usage-table tbody tr")).to_have_count(1)
    await s.assert_clean()


async def test_workspace_config_editor(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack(workspaces=("ws", "cfg"))
    s = await open_session(stack)
    page = s.page
    await s.open()
    await (
        page.locator('.ws-card[data-workspace="cfg"]').get_by_role("link", name="Configure").click()
    )
    form = page.locator("#ws-config-form")
    await expect(form).to_be_visible()
    await page.fill('input[name="provider"]', "ollama")
    await page.fill('input[name="base_url"]', "http://gpu:11434")
    await page.click('[data-action="add-env"]')
    await page.click('[data-action="add-env"]')
    keys = page.locator(".env-key")
    vals = page.locator(".env-value")
    await keys.nth(0).fill("OLLAMA_KEEP_ALIVE")
    await vals.nth(0).fill("5m")
    await keys.nth(1).fill("HTTP_PROXY")
    await vals.nth(1).fill("http://proxy:3128")
    await s.shot("workspace-config")
    await page.click('[data-action="save"]')
    await expect(page.locator(".banner-ok")).to_contain_text("Saved cfg")
    rows = {w["name"]: w for w in (await stack.client.get("/api/workspaces")).json()}
    assert rows["cfg"]["config"] == {
        "provider": "ollama",
        "base_url": "http://gpu:11434",
        "env": {"OLLAMA_KEEP_ALIVE": "5m", "HTTP_PROXY": "http://proxy:3128"},
    }
    assert stack.fakes["cfg"].shutdown_count == 1

    # a server-side refusal is shown on the form (a keyless provider with a key env var)
    await page.fill('input[name="api_key_from_env"]', "SOME_KEY")
    await page.click('[data-action="save"]')
    await expect(form.locator(".form-error")).to_be_visible()

    # the editor reopens with the saved values; removing a row clears that variable
    await page.reload()
    await expect(page.locator('input[name="provider"]')).to_have_value("ollama")
    await expect(page.locator(".env-row")).to_have_count(2)
    await page.locator(".env-row").nth(1).get_by_role("button", name="Remove variable").click()
    await page.fill('input[name="base_url"]', "")
    await page.click('[data-action="save"]')
    await expect(page.locator(".banner-ok").last).to_contain_text("Saved cfg")
    rows = {w["name"]: w for w in (await stack.client.get("/api/workspaces")).json()}
    assert rows["cfg"]["config"] == {"provider": "ollama", "env": {"OLLAMA_KEEP_ALIVE": "5m"}}

    # without a reload: a variable added, saved, then removed is removed too
    async def config_is(want: dict[str, Any]) -> bool:
        rows = {w["name"]: w for w in (await stack.client.get("/api/workspaces")).json()}
        return bool(rows["cfg"]["config"] == want)

    await page.click('[data-action="add-env"]')
    await page.locator(".env-key").nth(1).fill("EXTRA")
    await page.locator(".env-value").nth(1).fill("1")
    await page.click('[data-action="save"]')
    extra = {"provider": "ollama", "env": {"OLLAMA_KEEP_ALIVE": "5m", "EXTRA": "1"}}
    await wait_until(lambda: config_is(extra), 10, what="EXTRA saved")
    await page.locator(".env-row").nth(1).get_by_role("button", name="Remove variable").click()
    await page.click('[data-action="save"]')
    kept = {"provider": "ollama", "env": {"OLLAMA_KEEP_ALIVE": "5m"}}
    await wait_until(lambda: config_is(kept), 10, what="EXTRA removed")

    # a provider key prosperod's environment lacks is saved, with a warning that says so
    await page.fill('input[name="provider"]', "anthropic")
    await page.fill('input[name="api_key_from_env"]', "PROSPERO_TEST_NO_SUCH_KEY")
    await page.click('[data-action="save"]')
    warned = page.locator(".banner-warn").last
    await expect(warned).to_contain_text("provider 'anthropic' needs ANTHROPIC_API_KEY")
    await expect(warned).to_contain_text("set PROSPERO_TEST_NO_SUCH_KEY in prosperod's environment")

    # remove the workspace (confirmed)
    await page.click('[data-action="remove-workspace"]')
    await page.click('dialog.modal [data-action="confirm"]')
    await expect(page).to_have_url(f"{stack.url}/#/")
    await expect(page.locator(".ws-card")).to_have_count(1)
    assert [w["name"] for w in (await stack.client.get("/api/workspaces")).json()] == ["ws"]
    assert s.log.errors == []


async def test_add_workspace_from_the_fleet_page(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack(workspaces=())
    s = await open_session(stack)
    page = s.page
    await s.open()
    await expect(page.locator(".empty-title")).to_have_text("No workspaces yet")
    await s.shot("fleet-empty", full_page=False)
    await page.get_by_role("button", name="Add workspace").first.click()
    root = stack.tmp / "newws"
    root.mkdir()
    await page.fill('.add-ws input[name="name"]', "newws")
    await page.fill('.add-ws input[name="root"]', str(root))
    await page.click('.add-ws button[type="submit"]')
    await expect(page.locator('.ws-card[data-workspace="newws"]')).to_be_visible()
    # no caliband serves it (autostart is off): the add says so, with the cause and the fix,
    # and the card shows it unreachable, without a launch button
    added = page.locator(".banner-error").last
    await expect(added).to_contain_text("Workspace newws added, but its caliband is unreachable")
    await expect(added).to_contain_text("autostart is off")
    await expect(
        page.locator('.ws-card[data-workspace="newws"] .health-unreachable')
    ).to_be_visible()
    await expect(
        page.locator('.ws-card[data-workspace="newws"]').get_by_role("link", name="Launch agent")
    ).to_have_count(0)
    assert s.log.errors == []


async def test_theme_cycles_and_persists(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack()
    agent_id = await stack.spawn("tools: read")
    await stack.wait_status(agent_id, "done")
    s = await open_session(stack)
    page = s.page
    await s.open()
    html = page.locator("html")
    toggle = page.locator("#theme-toggle")
    await expect(html).to_have_attribute("data-theme", "system")
    await expect(toggle).to_have_text("Theme: System")
    await toggle.click()
    await expect(html).to_have_attribute("data-theme", "light")
    await toggle.click()
    await expect(html).to_have_attribute("data-theme", "dark")
    await expect(toggle).to_have_text("Theme: Dark")
    bg = await page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert bg == "rgb(14, 17, 22)", bg
    await page.reload()
    await expect(html).to_have_attribute("data-theme", "dark")
    await expect(page.locator(".ws-card")).to_have_count(1)
    await s.shot("fleet-dark", full_page=False)
    await page.goto(f"{stack.url}/#/agents/{agent_id}")
    await expect(page.locator(".tl-finished")).to_be_visible()
    await page.locator(".tl-tool .tool-row").click()
    await s.shot("agent-dark", full_page=False)
    await toggle.click()
    await expect(html).to_have_attribute("data-theme", "system")
    assert await page.evaluate("localStorage.getItem('prospero.theme')") == "system"
    await s.assert_clean()
