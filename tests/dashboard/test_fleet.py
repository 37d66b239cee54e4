"""Fleet overview in Chromium: workspaces with health, agents with status, protocol,
posture, age, tokens and cost, filters, and live updates through the fleet stream."""

from __future__ import annotations

import re

from playwright.async_api import expect

from tests.dashboard.conftest import SessionFactory, StackFactory


async def test_fleet_overview_live_and_filters(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack(workspaces=("ws", "docs"))
    await stack.add_workspace("offline", fake=False)  # no caliband: unreachable
    tools = await stack.spawn("tools: summarise the README", label="readme-tools")
    other = await stack.spawn("hello", ws="docs", label="docs-hello")
    await stack.wait_status(tools, "done")
    await stack.wait_status(other, "done")

    s = await open_session(stack)
    await s.open()
    page = s.page
    cards = page.locator(".ws-card")
    await expect(cards).to_have_count(3)
    await expect(page.locator('.ws-card[data-workspace="ws"] .health-healthy')).to_be_visible()
    await expect(
        page.locator('.ws-card[data-workspace="offline"] .health-unreachable')
    ).to_be_visible()
    await expect(page.locator(".stat").first).to_contain_text("3")
    await expect(page.locator(".stats")).to_contain_text("1 unreachable")

    row = page.locator(f'tr.agent-row[data-agent-id="{tools}"]')
    await expect(row).to_be_visible()
    await expect(row.locator(".col-agent")).to_contain_text("readme-tools")
    await expect(row.locator(".col-status .pill")).to_have_text("done")
    await expect(row.locator(".col-proto")).to_have_text("ndjson")
    await expect(row.locator(".col-model")).to_have_text("claude-sonnet-4-6")
    await expect(row.locator(".col-age")).to_have_text(re.compile(r"^\d+s$"))
    # tool_run_script: 812+64 and 901+12 tokens over two turns (RunEnd reports 1713/76)
    await expect(row.locator(".col-tokens")).to_have_text("1.8k")
    await expect(row.locator(".col-cost")).not_to_have_text("—")
    await s.shot("fleet")

    # live: an agent spawned elsewhere (API) shows up and runs to done without a reload
    live = await stack.spawn("paced: stream", label="live-one")
    live_row = page.locator(f'tr.agent-row[data-agent-id="{live}"]')
    await expect(live_row).to_be_visible()
    await expect(live_row.locator(".col-status .pill")).to_have_text("running")
    await expect(live_row.locator(".col-status .pill")).to_have_text("done")
    await expect(live_row.locator(".col-tokens")).not_to_have_text("—")

    # filters: text, status, workspace, protocol
    search = page.get_by_placeholder("Filter by id, label, model…")
    await search.fill("docs-hello")
    await expect(page.locator("tr.agent-row")).to_have_count(1)
    await expect(page.locator(f'tr.agent-row[data-agent-id="{other}"]')).to_be_visible()
    await search.fill("")
    await page.select_option('select[name="status"]', "active")
    await expect(page.locator("tr.agent-row")).to_have_count(0)
    await page.select_option('select[name="status"]', "done")
    await expect(page.locator("tr.agent-row")).to_have_count(3)
    await page.select_option('select[name="workspace"]', "docs")
    await expect(cards).to_have_count(1)
    await page.select_option('select[name="protocol"]', "acp")
    await expect(page.locator("tr.agent-row")).to_have_count(0)
    await page.get_by_role("button", name="Clear").click()
    await expect(page.locator("tr.agent-row")).to_have_count(3)
    await expect(cards).to_have_count(3)

    # a row opens the agent page
    await row.click()
    await expect(page).to_have_url(f"{stack.url}/#/agents/{tools}")
    await expect(page.locator(".agent-title")).to_have_text("readme-tools")
    await s.assert_clean()
