"""The Notifications page: add a target through the form (its URL shown masked), click Test
and see the receiver's answer (and the receiver got the POST), a refused test shows its
status, the delivery log lists both, the toggle disables it, Remove removes it."""

from __future__ import annotations

import re

from playwright.async_api import expect

from tests.dashboard.conftest import SessionFactory, StackFactory
from tests.receiver import Receiver
from tests.support import wait_until


async def test_add_test_and_remove_a_target(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    rx = await Receiver().start()
    try:
        stack = await make_stack()
        s = await open_session(stack)
        page = s.page
        await s.open("#/notifications")
        await expect(page.locator('[data-nav="notifications"]')).to_have_class(re.compile("active"))
        await expect(page.locator('[data-testid="targets"]')).to_contain_text("No targets")

        form = page.locator("#notify-form")
        await form.locator('input[name="name"]').fill("ops")
        await form.locator('input[name="url"]').fill(rx.url)
        await form.locator('select[name="format"]').select_option("discord")
        await form.locator('input[value="agent_finished"]').uncheck()
        await form.locator('[data-action="add-target"]').click()
        row = page.locator('tr[data-target="ops"]')
        await expect(row).to_be_visible()
        await expect(row).to_contain_text("discord")
        await expect(row).to_contain_text(rx.url.split("/hooks")[0] + "/…")
        await expect(row).not_to_contain_text("secretpart")
        await expect(row).not_to_contain_text("agent_finished,")
        got = (await stack.client.get("/api/notifications/targets/ops")).json()
        assert "agent_finished" not in got["events"] and len(got["events"]) == 4

        await row.locator('[data-action="test"]').click()
        result = row.locator('[data-testid="test-result"]')
        await expect(result).to_have_text("delivered (HTTP 200)")
        assert rx.bodies and rx.bodies[0]["content"].startswith("[Prospero] Test:")
        rx.statuses.append(404)
        await row.locator('[data-action="test"]').click()
        await expect(result).to_contain_text("failed: HTTP 404")
        log = page.locator('[data-testid="deliveries"] tr[data-event="test"]')
        await expect(log).to_have_count(2)
        await expect(log.first).to_have_attribute("data-state", "failed")

        # a bad URL: the API's error in the form
        await form.locator('input[name="name"]').fill("bad")
        await form.locator('input[name="url"]').fill("ftp://host/x")
        await form.locator('[data-action="add-target"]').click()
        await expect(form.locator(".form-error")).to_contain_text("http:// or https://")

        await row.locator('[data-action="toggle"]').uncheck()

        async def disabled() -> bool:
            t = (await stack.client.get("/api/notifications/targets/ops")).json()
            return t["enabled"] is False

        await wait_until(disabled, 10, what="the target disabled")
        await page.locator('tr[data-target="ops"] [data-action="remove"]').click()
        await expect(page.locator('[data-testid="targets"]')).to_contain_text("No targets")
        # the console errors are the browser's lines for the bad URL's 422
        assert [c for c in s.log.unexpected() if "422" not in c] == []
        s.log.console.clear()
        await s.assert_clean()
    finally:
        await rx.stop()
