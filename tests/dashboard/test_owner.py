"""The owner badge in Chromium: a clustered prosperod on a real PostgreSQL database shows
"driven by <replica>" on the fleet row and the agent page of the agent it drives; an owner made
of markup is shown as text; a standalone view shows no badge at all."""

from __future__ import annotations

from playwright.async_api import expect

from prospero.core.cluster import ClusterInfo
from prospero.core.leases import MemoryLeases
from tests.dashboard.conftest import XSS, SessionFactory, StackFactory
from tests.support import wait_until


async def test_owner_badge_on_fleet_and_agent_pages(
    make_stack: StackFactory, open_session: SessionFactory, pg_dsn: str
) -> None:
    stack = await make_stack(
        database_url=pg_dsn, replica_id="dash-r1", lease_ttl=1.0, heartbeat_interval=0.25
    )
    agent = await stack.spawn("hello", label="owned", interactive=True)

    async def driven() -> bool:
        r = await stack.client.get(f"/api/agents/{agent}")
        return r.status_code == 200 and r.json()["owner"] == "dash-r1"

    await wait_until(driven, 15.0, interval=0.05, what="dash-r1 drives the agent")

    s = await open_session(stack)
    await s.open()
    page = s.page
    row = page.locator(f'tr.agent-row[data-agent-id="{agent}"]')
    await expect(row.locator(".tag-owner")).to_have_text("driven by dash-r1")
    await s.shot("fleet-owner")
    await row.click()
    head = page.locator(".agent-tags .tag-owner")
    await expect(head).to_have_text("driven by dash-r1")

    # Whatever the authority says is text, never markup (a lease authority that names the
    # owner with a payload; the API response is the real one).
    cluster = stack.runtime.cluster
    auth = MemoryLeases()
    payload = XSS[1]
    assert await auth.acquire(agent, payload, 60.0)
    try:
        stack.runtime.cluster = ClusterInfo("clustered", "dash-r1", "postgres", 1.0, 0.25, auth)
        await page.reload()
        await expect(head).to_have_text(f"driven by {payload}")
        await s.open()
        await expect(row.locator(".tag-owner")).to_have_text(f"driven by {payload}")

        # Standalone: no owner, no badge.
        stack.runtime.cluster = ClusterInfo("standalone", "dash-r1", "sqlite")
        await page.reload()
        await expect(row).to_be_visible()
        await expect(page.locator(".tag-owner")).to_have_count(0)
        await s.open(f"#/agents/{agent}")
        await expect(page.locator(".agent-title")).to_have_text("owned")
        await expect(page.locator(".agent-tags .tag")).not_to_have_count(0)
        await expect(page.locator(".tag-owner")).to_have_count(0)
    finally:
        stack.runtime.cluster = cluster
    await s.assert_clean()
