"""Approvals inbox (issue 5, ADR 0006).

Against the REAL decisions API: supervised ACP agents (the scripted ACP peer behind the fake
caliband) stop on `session/request_permission`; the inbox lists the ask live, a click answers
it (the audit names the API token), an answer given through the HTTP API removes the card live,
and a "Reject always" rule answers the session's next identical ask without a human.

With the API mocked in the browser: the contract's edges (404 -> approvals unavailable, 409
-> decided elsewhere), browser notifications and hostile tool-call content."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from typing import Any

from playwright.async_api import Page, Route, expect

from tests.dashboard.conftest import (
    ASK_INPUT,
    ASK_TITLE,
    XSS,
    DashStack,
    Session,
    SessionFactory,
    StackFactory,
)
from tests.support import wait_until

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


# ------------------------------------------------------------------------ the real decisions API

ALICE = "tok-alice-0123456789"
BOB = "tok-bob-0123456789"
OPTION_LABELS = ["Allow once", "Allow always", "Reject once", "Reject always"]

# Every decision card ever added to the page, even one removed in the same task.
CARD_RECORDER = """
window.__cards = [];
new MutationObserver((records) => {
  for (const r of records) for (const n of r.addedNodes) {
    if (n.nodeType !== 1) continue;
    const cards = n.matches('article.decision') ? [n] : [...n.querySelectorAll('article.decision')];
    for (const c of cards) window.__cards.push(c.dataset.decisionId);
  }
}).observe(document, { childList: true, subtree: true });
"""


async def spawn_supervised(stack: DashStack, prompt: str, label: str) -> str:
    return await stack.spawn(prompt, label=label, drive_protocol="acp", posture="supervised")


async def pending_ids(stack: DashStack, agent_id: str, n: int = 1) -> list[str]:
    """Wait until the agent has `n` pending decisions whose requests are live."""
    found: list[str] = []

    async def ready() -> bool:
        nonlocal found
        r = await stack.client.get("/api/decisions", params={"state": "pending", "agent": agent_id})
        assert r.status_code == 200, r.text
        found = [d["id"] for d in r.json()]
        return len(found) >= n

    await wait_until(ready, 15.0, interval=0.05, what=f"{n} pending decision(s) of {agent_id}")
    return found


async def sign_in(s: Session, token: str, route: str) -> None:
    """Open a page of a daemon with API tokens and enter `token` in the token prompt."""
    await s.open(route)
    form = s.page.locator("#token-form")
    await expect(form).to_be_visible()
    await s.page.fill("#token-input", token)
    await s.page.click('#token-form button[type="submit"]')
    await expect(form).to_have_count(0)
    await expect(s.page.locator("#conn")).to_have_text("live")
    # The browser logs the 401s that asked for the token: expected, and only those.
    assert all("401" in c for c in s.log.console), s.log.console
    s.log.console.clear()


def finished(events: list[dict[str, Any]]) -> bool:
    return any(e["kind"]["kind"] == "agent_finished" for e in events)


def of_kind(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["kind"] for e in events if e["kind"]["kind"] == kind]


def seq_of(events: list[dict[str, Any]], kind: str, key: str, value: str) -> int:
    """The seq of the first `kind` event whose `key` is `value` (a prefix for output chunks)."""
    for e in events:
        k = e["kind"]
        if k["kind"] == kind and str(k.get(key, "")).strip().startswith(value):
            return int(e["seq"])
    raise AssertionError(f"no {kind} with {key}={value!r}")


async def timeline_texts(page: Page) -> list[str]:
    return list(
        await page.eval_on_selector_all(
            ".timeline .tl-entry", "els => els.map(e => e.textContent.trim())"
        )
    )


def position(texts: list[str], fragment: str) -> int:
    return next(i for i, t in enumerate(texts) if fragment in t)


async def test_supervised_agent_approved_from_the_inbox(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack(tokens={"alice": ALICE}, allow_acp=True)
    s = await open_session(stack)
    page = s.page
    await sign_in(s, ALICE, "#/approvals")
    await expect(page.locator("#view .empty-title")).to_have_text("Nothing to approve")
    await expect(page.locator("#approvals-badge")).to_be_hidden()

    # The agent stops on its permission request: the ask arrives live in the open inbox.
    agent_id = await spawn_supervised(stack, "ask: run the tests", "supervised-acp")
    [did] = await pending_ids(stack, agent_id)
    card = page.locator(f'article.decision[data-decision-id="{did}"]')
    await expect(page.locator("article.decision")).to_have_count(1)
    await expect(page.locator("#approvals-badge")).to_have_text("1")
    await expect(page.locator("#approvals-badge")).to_be_visible()
    await expect(card.locator(".decision-title")).to_have_text(ASK_TITLE)
    await expect(card.locator(".decision-sub .tag")).to_have_text("execute")
    await expect(card.locator(".decision-sub a")).to_have_text("supervised-acp")
    await expect(card.locator('[data-field="input"]')).to_have_text(json.dumps(ASK_INPUT, indent=2))
    await expect(card.locator(".option-buttons button")).to_have_text(OPTION_LABELS)
    await expect(card).to_contain_text("no deadline")
    await s.shot("approvals-real-pending", full_page=False)
    # The card's age counts while it waits (it was rendered at "asked 0s ago").
    await expect(card.locator('[data-field="asked"]')).to_have_text(
        re.compile(r"asked [1-9]\d*s ago")
    )
    # It really waits for a human.
    assert await stack.status(agent_id) == "running"
    assert not finished(await stack.history(agent_id))

    await card.locator(".note-input").fill("tests only, go ahead")
    await card.get_by_role("button", name="Allow once").click()
    await expect(card).to_have_count(0)
    await expect(page.locator("#approvals-badge")).to_be_hidden()
    await expect(page.locator("#approvals-badge")).to_have_text("0")
    await expect(page.locator("#view .empty-title")).to_have_text("Nothing to approve")
    await expect(page.locator(".banner-ok")).to_contain_text(f"Allow once: {ASK_TITLE}")
    await s.shot("approvals-real-answered", full_page=False)

    # The agent goes on and finishes; its timeline shows the ask and the answer.
    events = await stack.wait_history(agent_id, finished)
    [res] = of_kind(events, "decision_resolved")
    assert (res["id"], res["option_id"], res["by"], res["note"]) == (
        did,
        "allow-once",
        "alice",
        "tests only, go ahead",
    )
    assert [k["ok"] for k in of_kind(events, "tool_finished")] == [True]
    # The answer is recorded before what the agent did with it.
    assert (
        seq_of(events, "decision_pending", "id", did)
        < seq_of(events, "decision_resolved", "id", did)
        < seq_of(events, "tool_finished", "id", "call_run")
        < seq_of(events, "output", "chunk", "call_run ran.")
    )
    await s.open(f"#/agents/{agent_id}")
    markers = page.locator('.timeline .tl-marker[data-marker="decision"]')
    await expect(markers).to_have_count(2)
    await expect(markers.nth(0)).to_contain_text(f"Permission requested: {ASK_TITLE}")
    await expect(markers.nth(1)).to_contain_text(
        f"Permission answered: Allow once (by alice) — {ASK_TITLE}"
    )
    await expect(markers.nth(1)).to_contain_text("Note: tests only, go ahead")
    await expect(page.locator(".tl-finished")).to_contain_text("Run finished: EndOfTurn")
    # Answered: the ask no longer points at the inbox.
    await expect(markers.nth(0).get_by_role("link", name="open the inbox")).to_have_count(0)
    texts = await timeline_texts(page)
    assert position(texts, "Permission answered") < position(texts, "call_run ran.")
    await s.shot("approvals-real-agent-timeline")

    # The audit names the token (its name, never the token).
    r = await stack.client.get(f"/api/decisions/{did}")
    d = r.json()
    assert (d["state"], d["decided_by"], d["option_id"], d["note"]) == (
        "decided",
        "alice",
        "allow-once",
        "tests only, go ahead",
    )
    await s.assert_clean()


async def test_decided_through_the_api_disappears_live(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack(tokens={"alice": ALICE, "bob": BOB}, allow_acp=True)
    first = await spawn_supervised(stack, "ask: first", "first")
    second = await spawn_supervised(stack, "ask: second", "second")
    [d1] = await pending_ids(stack, first)
    [d2] = await pending_ids(stack, second)
    s = await open_session(stack)
    page = s.page
    await sign_in(s, ALICE, "#/approvals")
    cards = page.locator("article.decision")
    await expect(cards).to_have_count(2)
    await expect(page.locator("#approvals-badge")).to_have_text("2")
    card1 = page.locator(f'article.decision[data-decision-id="{d1}"]')
    card2 = page.locator(f'article.decision[data-decision-id="{d2}"]')
    await card2.locator(".note-input").fill("half-typed note")

    # From now on the inbox's safety-net poll is held: only the fleet stream can update it.
    held: list[Route] = []
    release = asyncio.Event()

    async def hold_polls(route: Route) -> None:
        if route.request.method != "GET":
            await route.continue_()
            return
        held.append(route)
        await release.wait()
        with contextlib.suppress(Exception):
            await route.continue_()

    await page.route(lambda url: "/api/decisions" in url, hold_polls)
    await page.evaluate("window.__sameDocument = true")

    r = await stack.client.post(
        f"/api/decisions/{d1}",
        json={"option_id": "reject-once", "note": "not today"},
        headers={"Authorization": f"Bearer {BOB}"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["decided_by"] == "bob"
    await expect(card1).to_have_count(0)
    await expect(page.locator("#approvals-badge")).to_have_text("1")
    await expect(cards).to_have_count(1)
    # The card that stays is the same element: the note being typed survives.
    await expect(card2.locator(".note-input")).to_have_value("half-typed note")
    assert await page.evaluate("window.__sameDocument") is True  # no reload
    await s.shot("approvals-real-decided-elsewhere", full_page=False)
    await stack.wait_history(first, finished)

    # The second one is answered from the browser as alice (the POST is not held).
    await card2.get_by_role("button", name="Allow once").click()
    await expect(cards).to_have_count(0)
    await expect(page.locator("#approvals-badge")).to_be_hidden()
    events = await stack.wait_history(second, finished)
    [res] = of_kind(events, "decision_resolved")
    assert (res["by"], res["option_id"], res["note"]) == ("alice", "allow-once", "half-typed note")
    release.set()
    r = await stack.client.get("/api/decisions", params={"state": "all"})
    assert {d["id"]: d["decided_by"] for d in r.json()} == {d1: "bob", d2: "alice"}
    await s.assert_clean()


async def test_reject_always_answers_the_next_identical_ask(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack(allow_acp=True)
    s = await open_session(stack)
    page = s.page
    await page.add_init_script(CARD_RECORDER)
    await s.open("#/approvals")
    await expect(page.locator("#conn")).to_have_text("live")
    await expect(page.locator("#view .empty-title")).to_have_text("Nothing to approve")

    agent_id = await spawn_supervised(stack, "twice: run the tests, twice", "twice")
    [d1] = await pending_ids(stack, agent_id)
    card = page.locator(f'article.decision[data-decision-id="{d1}"]')
    await expect(card.locator(".option-buttons button")).to_have_text(OPTION_LABELS)
    await expect(page.locator("#approvals-badge")).to_have_text("1")
    await card.locator(".note-input").fill("never run the suite here")
    await card.get_by_role("button", name="Reject always").click()
    await expect(card).to_have_count(0)

    # The session's second, identical ask is answered by the rule: the agent finishes with
    # the inbox open, and the inbox never showed it.
    events = await stack.wait_history(agent_id, finished)
    resolved = of_kind(events, "decision_resolved")
    assert [(k["by"], k["option_id"], k["rule"]) for k in resolved] == [
        ("anonymous", "reject-always", None),
        ("rule", resolved[1]["option_id"], f"session:{d1}"),
    ]
    assert resolved[1]["option_kind"].startswith("reject_")
    assert [k["id"] for k in of_kind(events, "decision_pending")] == [d1]
    assert [k["ok"] for k in of_kind(events, "tool_finished")] == [False, False]
    rule_id = resolved[1]["id"]
    assert (
        seq_of(events, "decision_resolved", "id", d1)
        < seq_of(events, "tool_finished", "id", "call_1")
        < seq_of(events, "output", "chunk", "call_1 skipped.")
        < seq_of(events, "tool_started", "id", "call_2")
        < seq_of(events, "decision_resolved", "id", rule_id)
        < seq_of(events, "tool_finished", "id", "call_2")
    )
    await expect(page.locator("#view .empty-title")).to_have_text("Nothing to approve")
    await expect(page.locator("#approvals-badge")).to_be_hidden()
    await s.shot("approvals-real-rule", full_page=False)
    assert await page.evaluate("window.__cards") == [d1]

    r = await stack.client.get("/api/decisions", params={"agent": agent_id})
    audit = [(d["tool_call"]["id"], d["decided_by"], d["rule"]) for d in r.json()]
    assert audit == [("call_1", "anonymous", None), ("call_2", "rule", f"session:{d1}")]

    await s.open(f"#/agents/{agent_id}")
    markers = page.locator('.timeline .tl-marker[data-marker="decision"]')
    await expect(markers).to_have_count(3)
    await expect(markers.nth(0)).to_contain_text(f"Permission requested: {ASK_TITLE}")
    await expect(markers.nth(1)).to_contain_text(
        "Permission answered: Reject always (by anonymous)"
    )
    await expect(markers.nth(1)).to_contain_text("Note: never run the suite here")
    await expect(markers.nth(2)).to_contain_text("(by rule)")
    await expect(page.locator(".tl-finished")).to_contain_text("Run finished: EndOfTurn")
    texts = await timeline_texts(page)
    assert (
        position(texts, "Permission requested")
        < position(texts, "(by anonymous)")
        < position(texts, "call_1 skipped.")
        < position(texts, "(by rule)")
        < position(texts, "call_2 skipped.")
    ), texts
    await s.shot("approvals-real-rule-timeline")
    await s.assert_clean()


async def test_a_stale_snapshot_never_undoes_live_events(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    """A GET /api/decisions answer taken before a live event but applied after it (a slow
    refresh) must not bring back an answered decision nor drop an ask that arrived meanwhile."""
    stack = await make_stack(allow_acp=True)
    first = await spawn_supervised(stack, "ask: first", "first")
    [d1] = await pending_ids(stack, first)
    s = await open_session(stack)
    page = s.page
    await s.open("#/approvals")
    await expect(page.locator("#conn")).to_have_text("live")
    cards = page.locator("article.decision")
    await expect(cards).to_have_count(1)
    inbox = page.locator(".decision-list")

    # Every list request from now on: its answer is taken at once, delivered on `release`.
    fetched = asyncio.Event()
    release = asyncio.Event()

    async def snapshot_then_hold(route: Route) -> None:
        if route.request.method != "GET":
            await route.continue_()
            return
        resp = await route.fetch()
        fetched.set()
        await release.wait()
        with contextlib.suppress(Exception):
            await route.fulfill(response=resp)

    await page.route(lambda url: "/api/decisions" in url, snapshot_then_hold)

    # 1. A snapshot with d1 pending lands after d1 was answered (live): d1 stays gone.
    loads = await inbox.get_attribute("data-loads")
    await page.get_by_role("button", name="Refresh").click()
    await asyncio.wait_for(fetched.wait(), 15)
    r = await stack.client.post(f"/api/decisions/{d1}", json={"option_id": "reject-once"})
    assert r.status_code == 200, r.text
    await expect(cards).to_have_count(0)
    release.set()
    # The inbox renders a snapshot synchronously (and stamps data-loads) when it applies it:
    # from then on the DOM shows its result, checked at once (waiting would let the next
    # safety-net poll repair a wrong result).
    await expect(inbox).not_to_have_attribute("data-loads", loads or "")
    assert await cards.count() == 0
    assert await page.locator("#approvals-badge").is_hidden()

    # 2. A snapshot taken before d2 was asked lands after d2 arrived live: d2 stays.
    fetched.clear()
    release.clear()
    loads = await inbox.get_attribute("data-loads")
    await page.get_by_role("button", name="Refresh").click()
    await asyncio.wait_for(fetched.wait(), 15)
    second = await spawn_supervised(stack, "ask: second", "second")
    [d2] = await pending_ids(stack, second)
    card2 = page.locator(f'article.decision[data-decision-id="{d2}"]')
    await expect(card2).to_have_count(1)
    release.set()
    await expect(inbox).not_to_have_attribute("data-loads", loads or "")
    assert await card2.count() == 1
    assert await cards.count() == 1
    assert await page.locator("#approvals-badge").text_content() == "1"
    await s.shot("approvals-real-stale-snapshot", full_page=False)

    await card2.get_by_role("button", name="Allow once").click()
    await expect(cards).to_have_count(0)
    events = await stack.wait_history(second, finished)
    assert [k["ok"] for k in of_kind(events, "tool_finished")] == [True]
    await s.assert_clean()
