"""Approvals inbox, checked against the decisions API contract (issue 5) with the API mocked in
the browser: GET /api/decisions?state=pending, POST /api/decisions/{id} {option_id, note?} ->
200 / 409 / 400, fleet-stream events decision_pending / decision_resolved. A daemon without the
API (404) makes the inbox say approvals are unavailable.

TODO(issue 5): once the decisions API is merged, add a test against the real API with a
supervised ACP agent stopping on a permission request (approve from the inbox, the agent
finishes, the audit names the token)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from playwright.async_api import Route, expect

from tests.dashboard.conftest import XSS, SessionFactory, StackFactory

# Browser notifications, recorded instead of shown (permission granted).
NOTIFICATION_STUB = """
window.__notes = [];
window.Notification = function (title, opts) {
  window.__notes.push([title, (opts && opts.body) || '']);
};
window.Notification.permission = 'granted';
window.Notification.requestPermission = async () => 'granted';
"""


def decision(did: str, agent_id: str, title: str, tool_input: Any) -> dict[str, Any]:
    return {
        "id": did,
        "agent_id": agent_id,
        "workspace": "ws",
        "tool_call": {"id": f"call_{did}", "title": title, "kind": "execute", "input": tool_input},
        "options": [
            {"id": "allow-once", "label": "Allow once", "kind": "allow_once"},
            {"id": "allow-always", "label": "Allow always", "kind": "allow_always"},
            {"id": "reject-once", "label": "Reject", "kind": "reject_once"},
            {"id": "reject-always", "label": "Reject always", "kind": "reject_always"},
        ],
        "created_at": "2026-01-01T00:00:00+00:00",
        "deadline": None,
        "state": "pending",
    }


async def test_inbox_unavailable_without_decisions_api(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack()
    s = await open_session(stack)
    page = s.page

    async def no_api(route: Route) -> None:
        await route.fulfill(status=404, json={"detail": "Not Found"})

    await page.route("**/api/decisions**", no_api)
    await s.open("#/approvals")
    await expect(page.locator('[data-testid="approvals-unavailable"]')).to_contain_text(
        "Approvals are not available on this daemon"
    )
    await expect(page.locator("#approvals-badge")).to_be_hidden()
    await s.shot("approvals-unavailable", full_page=False)
    await s.assert_clean()


async def test_inbox_against_the_contract(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack()
    agent_id = await stack.spawn("hello", label="supervised-one")
    await stack.wait_status(agent_id, "done")
    pending = {
        "d1": decision("d1", agent_id, "Run pytest", {"command": "pytest -q"}),
        "d2": decision("d2", agent_id, "Edit " + XSS[0], {"path": XSS[1], "new": XSS[6]}),
    }
    posts: list[tuple[str, dict[str, Any]]] = []
    notifications_on = asyncio.Event()
    resolve_d2 = asyncio.Event()
    stream_calls = 0

    async def decisions_api(route: Route) -> None:
        req = route.request
        if req.method == "GET":
            await route.fulfill(json=list(pending.values()))
            return
        did = req.url.rsplit("/", 1)[1]
        body = json.loads(req.post_data or "{}")
        posts.append((did, body))
        if did == "d3":  # someone else was faster
            pending.pop(did, None)
            await route.fulfill(status=409, json={"error": "already decided", "kind": "conflict"})
            return
        pending.pop(did, None)
        await route.fulfill(status=200, json={"id": did, "state": "allowed"})

    def sse(ordinal: int, kind: dict[str, Any]) -> str:
        ev = {
            "seq": ordinal,
            "ts": "2026-01-01T00:00:01+00:00",
            "repo": "ws",
            "agent_id": agent_id,
            "kind": kind,
        }
        return f"id: {ordinal}\ndata: {json.dumps(ev)}\n\n"

    async def fleet_stream(route: Route) -> None:
        nonlocal stream_calls
        stream_calls += 1
        if stream_calls == 1:  # a new decision arrives live (once notifications are on)
            await notifications_on.wait()
            pending["d3"] = decision("d3", agent_id, "Delete build/", {"command": "rm -rf build"})
            body = sse(1000, {"kind": "decision_pending", **pending["d3"]})
        elif stream_calls == 2:  # another client decides d2
            await resolve_d2.wait()
            pending.pop("d2", None)
            body = sse(
                1001,
                {
                    "kind": "decision_resolved",
                    "id": "d2",
                    "state": "rejected",
                    "decided_by": "alice",
                },
            )
        else:
            body = ": idle\n\n"
        await route.fulfill(status=200, headers={"content-type": "text/event-stream"}, body=body)

    s = await open_session(stack)
    page = s.page
    await page.add_init_script(NOTIFICATION_STUB)
    await page.route("**/api/decisions**", decisions_api)
    await page.route("**/api/stream?**", fleet_stream)
    await s.open("#/approvals")

    cards = page.locator("article.decision")
    await expect(cards).to_have_count(2)
    await expect(page.locator("#approvals-badge")).to_have_text("2")
    notify = page.get_by_role("button", name="Enable notifications")
    await notify.click()
    await expect(page.get_by_role("button", name="Notifications on")).to_be_visible()
    notifications_on.set()
    await expect(cards).to_have_count(3)
    await expect(page.locator("#approvals-badge")).to_have_text("3")
    notes = await page.evaluate("window.__notes")
    assert notes == [["Approval needed", f"{agent_id}: Delete build/"]], notes
    d1 = page.locator('article.decision[data-decision-id="d1"]')
    await expect(d1.locator(".decision-title")).to_have_text("Run pytest")
    await expect(d1.locator('[data-field="input"]')).to_contain_text('"command": "pytest -q"')
    await expect(d1.locator(".decision-sub a")).to_have_text("supervised-one")
    await expect(d1.locator(".option-buttons button")).to_have_text(
        ["Allow once", "Allow always", "Reject", "Reject always"]
    )
    d2 = page.locator('article.decision[data-decision-id="d2"]')
    await expect(d2.locator(".decision-title")).to_have_text("Edit " + XSS[0])
    await expect(d2.locator('[data-field="input"]')).to_contain_text("onerror")
    await s.shot("approvals", full_page=False)

    # decide d1 with a note: one POST with the option id, the card and a badge count go
    await d1.locator(".note-input").fill("looks safe")
    await d1.get_by_role("button", name="Allow always").click()
    await expect(d1).to_have_count(0)
    await expect(page.locator("#approvals-badge")).to_have_text("2")
    assert posts == [("d1", {"option_id": "allow-always", "note": "looks safe"})]

    # someone else decides d2: it disappears live
    resolve_d2.set()
    await expect(d2).to_have_count(0)
    await expect(page.locator("#approvals-badge")).to_have_text("1")

    # d3 was decided elsewhere too: 409 -> an info banner, the inbox refreshed
    d3 = page.locator('article.decision[data-decision-id="d3"]')
    await d3.get_by_role("button", name="Reject", exact=True).click()
    await expect(page.locator(".banner-info")).to_contain_text("Already decided elsewhere")
    await expect(cards).to_have_count(0)
    await expect(page.locator("#approvals-badge")).to_be_hidden()
    assert posts[-1] == ("d3", {"option_id": "reject-once"})
    assert await page.locator("#view script, #view img").count() == 0
    assert await page.evaluate("window.__xss") == 0
    assert await page.evaluate("window.__csp") == []
    assert s.log.errors == []
