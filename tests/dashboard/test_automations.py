"""The Automations page: create one through the form (its webhook secret shown once), run it
now, and follow the run in its history to the agent it spawned."""

from __future__ import annotations

import re

from playwright.async_api import expect

from tests.dashboard.conftest import SessionFactory, StackFactory


async def test_create_run_now_and_follow_the_run(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack()
    s = await open_session(stack)
    page = s.page
    await s.open("#/automations")
    await expect(page.locator('[data-nav="automations"]')).to_have_class(re.compile("active"))
    await expect(page.locator('[data-testid="automations"]')).to_contain_text("No automations")

    form = page.locator("#automation-form")
    await form.locator('input[name="name"]').fill("triage")
    await form.locator('textarea[name="prompt"]').fill("hello from {{automation.name}}")
    await form.locator('input[name="schedule"]').fill("0 3 * * *")
    await form.locator('input[name="webhook"]').check()
    await form.locator('input[name="worktree"]').uncheck()  # the workspace is no git repo
    await form.locator('[data-action="create-automation"]').click()
    secret = page.locator('[data-testid="secret-value"]')
    await expect(secret).to_have_text(re.compile(r"^[0-9a-f]{64}$"))

    row = page.locator('tr[data-automation="triage"]')
    await expect(row).to_be_visible()
    await expect(row).to_contain_text("0 3 * * *")
    await expect(row.locator('[data-testid="next-fire"]')).not_to_have_text("—")
    # a bad schedule: the API's error in the form
    await form.locator('input[name="name"]').fill("bad")
    await form.locator('textarea[name="prompt"]').fill("x")
    await form.locator('input[name="schedule"]').fill("* *")
    await form.locator('[data-action="create-automation"]').click()
    await expect(form.locator(".form-error")).to_contain_text("5 fields")

    # disable / enable through the toggle
    toggle = row.locator('[data-action="toggle"]')
    await toggle.uncheck()
    await expect(row.locator('[data-testid="next-fire"]')).to_have_text("—")
    auto = (await stack.client.get("/api/automations/triage")).json()
    assert auto["enabled"] is False
    await page.locator('tr[data-automation="triage"] [data-action="toggle"]').check()
    await expect(row.locator('[data-testid="next-fire"]')).not_to_have_text("—")

    await page.locator('tr[data-automation="triage"] [data-action="run-now"]').click()
    run_link = page.locator('[data-testid="automation-runs"] [data-testid="run-agent"]')
    await expect(run_link).to_have_count(1)
    runs = (await stack.client.get("/api/automations/triage/runs")).json()
    assert len(runs) == 1 and runs[0]["trigger"] == "manual"
    agent_id = runs[0]["agent_id"]
    assert agent_id
    await run_link.click()
    await expect(page).to_have_url(re.compile(rf"#/agents/{agent_id}$"))
    await stack.wait_status(agent_id, "done")
    # the one console error is the browser's line for the bad schedule's 400
    assert [c for c in s.log.unexpected() if "400" not in c] == []
    assert len(s.log.console) == 1
    s.log.console.clear()
    await s.assert_clean()
