"""Reviewable changes in Chromium (issue 14, item 4): edits as coloured unified diffs in the
inspector and on approval cards (NDJSON tool inputs and ACP `diff` content), the files a run
changed, agent text as markdown (and markdown that cannot smuggle script), approvals answered
on the agent's timeline, "awaiting approval" in the fleet, real tool durations, one spend
figure, keyboard shortcuts, transcript search and a 390 px layout.

The screenshots the docs show are `doc_shot`s (docs/screenshots/ with PROSPERO_DOC_SHOTS=1)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from playwright.async_api import Page, expect

from tests.dashboard import review_scripts as review
from tests.dashboard.conftest import DashStack, Session, SessionFactory, StackFactory
from tests.dashboard.test_agent import ends_done
from tests.dashboard.test_approvals import finished, of_kind, pending_ids
from tests.dashboard.test_security import INJECTED
from tests.support import wait_until

MINUS = "\u2212"  # the diff counts' minus sign


def rgb(css: str) -> tuple[int, int, int]:
    r, g, b = (int(x) for x in re.findall(r"\d+", css)[:3])
    return r, g, b


def ms(text: str | None) -> float:
    m = re.fullmatch(r"([\d.]+) (ms|s)", (text or "").strip())
    assert m, text
    return float(m.group(1)) * (1 if m.group(2) == "ms" else 1000)


def tool_span(events: list[dict[str, Any]], tool_id: str) -> float:
    """Seconds between a call's tool_started and tool_finished as stored."""
    ts = {
        e["kind"]["kind"]: datetime.fromisoformat(e["ts"])
        for e in events
        if e["kind"]["kind"] in ("tool_started", "tool_finished") and e["kind"]["id"] == tool_id
    }
    return (ts["tool_finished"] - ts["tool_started"]).total_seconds()


async def run_to_done(stack: DashStack, agent_id: str) -> list[dict[str, Any]]:
    """The agent's history once its run ended done (a loaded machine can take a while to
    start the worker); on a timeout, what it did instead."""
    try:
        return await stack.wait_history(agent_id, ends_done, within=40.0)
    except AssertionError as e:
        kinds = [ev["kind"] for ev in await stack.history(agent_id)][-6:]
        raise AssertionError(
            f"{e}; status {await stack.status(agent_id)}; last events {kinds}"
        ) from None


async def focused(page: Page, attr: str) -> str | None:
    return await page.evaluate(f"document.activeElement?.dataset?.{attr} ?? null")


async def assert_fits(s: Session, width: int) -> None:
    """No horizontal overflow of the document, and the header is one row: polled (bounded),
    since the page re-renders as the fleet updates and a layout measured mid-render is not
    the one a reader sees; a real overflow stays and fails with the last measurement."""
    page = s.page
    seen: dict[str, float] = {}

    async def fits() -> bool:
        seen["doc"] = await page.evaluate("document.documentElement.scrollWidth")
        seen["header"] = await page.evaluate(
            "document.querySelector('.topbar').getBoundingClientRect().height"
        )
        return seen["doc"] <= width and seen["header"] < 60

    try:
        await wait_until(fits, 5.0, interval=0.1, what="the page fits")
    except AssertionError:
        assert seen["doc"] <= width, f"{page.url}: the document is {seen['doc']} px wide"
        raise AssertionError(
            f"{page.url}: the header is {seen['header']} px high (more than one row)"
        ) from None


async def test_ndjson_edits_files_markdown_durations_search_keys_and_390px(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack()
    agent_id = await stack.spawn("review: validate refunds", label="reviewer")
    events = await run_to_done(stack, agent_id)
    # The durations are real where they are computed (ToolCallEnd comes after the tool ran).
    assert tool_span(events, "toolu_bash") >= review.BASH_SECONDS * 0.9
    assert all(tool_span(events, t) > 0 for t in ("toolu_edit", "toolu_multi", "toolu_write"))

    s = await open_session(stack)
    page = s.page
    await s.open(f"#/agents/{agent_id}")
    await expect(page.locator(".tl-finished")).to_be_visible()

    # agent text as markdown
    md = page.locator(".tl-text .text").first
    await expect(md.locator("h2")).to_have_text("Plan")
    await expect(md.locator("strong").first).to_have_text("validate")
    await expect(md.locator("p code").first).to_have_text("amount")
    await expect(md.locator("ul").first.locator(":scope > li")).to_have_count(2)
    await expect(md.locator("ul ul > li")).to_have_text("with a 422")
    await expect(md.locator("table th")).to_have_text(["file", "change"])
    await expect(md.locator("td.align-right")).to_have_text("validation")
    link = md.locator("a.ext-link")
    await expect(link).to_have_attribute("href", "https://example.com/docs/refunds")
    await expect(link).to_have_attribute("rel", "noopener noreferrer nofollow")
    await expect(link).to_have_attribute("target", "_blank")
    await expect(md.locator("pre.md-code code.language-python .tok-keyword").first).to_have_text(
        "def"
    )
    await expect(md.locator("pre.md-code .tok-comment")).to_have_text("# entry point")
    await s.doc_shot("markdown", page.locator(".tl-text").first)

    # real durations on the timeline
    bash = page.locator('.tl-tool[data-tool-id="toolu_bash"]')
    assert ms(await bash.locator(".tool-dur").text_content()) >= review.BASH_SECONDS * 900

    # an Edit in the inspector: a coloured unified diff with its file header
    edit = page.locator('.tl-tool[data-tool-id="toolu_edit"]')
    await expect(edit.locator(".tool-edit")).to_have_text(f"+3{MINUS}1")
    await edit.locator(".tool-row").click()
    insp = page.locator(".inspector")
    diff = insp.locator('.diff[data-path="src/payments/refunds.py"]')
    await expect(diff.locator(".diff-file .diff-path")).to_have_text("src/payments/refunds.py")
    await expect(diff.locator(".diff-file .diff-stat")).to_have_text(f"+3{MINUS}1")
    await expect(diff.locator(".diff-del .diff-text")).to_have_text(
        [review.REFUNDS_OLD.rstrip("\n")]
    )
    await expect(diff.locator(".diff-add .diff-text")).to_have_text(
        review.REFUNDS_NEW.rstrip("\n").split("\n")
    )
    await expect(diff.locator(".diff-add .tok-keyword").first).to_have_text("if")
    add = rgb(
        await diff.locator(".diff-add").first.evaluate("e => getComputedStyle(e).backgroundColor")
    )
    dele = rgb(
        await diff.locator(".diff-del").first.evaluate("e => getComputedStyle(e).backgroundColor")
    )
    assert add[1] > add[0] and dele[0] > dele[1], (add, dele)  # green in, red out
    assert ms(await insp.locator('[data-field="duration"]').text_content()) > 0
    await expect(insp.locator('[data-field="input"]')).to_contain_text('"old_string"')
    await s.doc_shot("diff-inspector", insp)

    # MultiEdit: one hunk per edit; Write: a new file, numbered; a failed Edit: not applied
    await page.locator('.tl-tool[data-tool-id="toolu_multi"] .tool-row').click()
    await expect(insp.locator(".diff-hunk")).to_have_count(2)
    await page.locator('.tl-tool[data-tool-id="toolu_write"] .tool-row').click()
    written = insp.locator('.diff[data-kind="write"]')
    await expect(written.locator(".diff-add")).to_have_count(4)
    await expect(written.locator(".diff-add .diff-ln").nth(1)).to_have_text("1")
    await page.locator('.tl-tool[data-tool-id="toolu_bad"] .tool-row').click()
    await expect(insp).to_contain_text("not applied: the call failed")

    # the files the run changed
    files = page.locator(".files-card")
    await expect(files.locator(".file-row")).to_have_count(len(review.CHANGED))
    for path, (adds, dels, status) in review.CHANGED.items():
        row = files.locator(f'.file-row[data-path="{path}"]')
        await expect(row).to_have_attribute("data-status", status)
        await expect(row.locator(".diff-stat")).to_have_text(f"+{adds}{MINUS}{dels}")
    await expect(files.locator(".files-count")).to_have_text(f"4 files · +9 {MINUS}3")
    await s.doc_shot("files-changed", files)
    await files.locator('.file-row[data-path="src/payments/ledger.py"] button').click()
    await expect(insp.locator(".inspector-title")).to_have_text("MultiEdit")

    # transcript search: / focuses it, Enter and n / N step through the matches
    await page.keyboard.press("Escape")  # leaves the inspector's focus; closes it
    await page.keyboard.press("/")
    search = page.locator(".tl-search-input")
    await expect(search).to_be_focused()
    await page.keyboard.type("needle")
    count = page.locator(".tl-search-count")
    await expect(count).to_have_text("1 of 2")
    await expect(page.locator(".tl-entry.search-hit")).to_have_count(2)
    await page.keyboard.press("Enter")
    await expect(count).to_have_text("2 of 2")
    await expect(page.locator(".tl-entry.search-current")).to_contain_text("the needle was found")
    await page.keyboard.press("Escape")
    await expect(search).not_to_be_focused()
    await page.keyboard.press("n")
    await expect(count).to_have_text("1 of 2")
    await expect(page.locator(".tl-entry.search-current")).to_contain_text("a needle of tests")
    await page.keyboard.press("N")
    await expect(count).to_have_text("2 of 2")

    # j / k move through the timeline, Enter opens a tool call, ? shows the shortcuts
    await page.keyboard.press("j")
    first = await page.evaluate("document.activeElement.dataset.seqs")
    assert await focused(page, "navItem") == "entry"
    await page.keyboard.press("j")
    assert await page.evaluate("document.activeElement.dataset.seqs") != first
    await page.keyboard.press("k")
    assert await page.evaluate("document.activeElement.dataset.seqs") == first
    await page.locator('.tl-tool[data-tool-id="toolu_write"]').focus()
    await page.keyboard.press("Enter")
    await expect(insp.locator(".inspector-title")).to_have_text("Write")
    await page.keyboard.press("?")
    help_dialog = page.locator("dialog.keys-help")
    await expect(help_dialog).to_be_visible()
    await expect(help_dialog).to_contain_text("Allow once / reject once")
    await page.keyboard.press("Escape")
    await expect(help_dialog).to_have_count(0)

    # the fleet: j focuses the row, Enter opens it; one spend figure, labelled
    await s.open()
    row = page.locator(f'tr.agent-row[data-agent-id="{agent_id}"]')
    await expect(row).to_be_visible()
    await page.keyboard.press("j")
    await expect(row).to_be_focused()
    spend = await page.locator(".stat-spend .stat-value").text_content()
    await expect(page.locator(".stat-spend .stat-note")).to_contain_text("all time, listed agents")
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(re.compile(f"#/agents/{agent_id}$"))
    await page.keyboard.press("g")
    await page.keyboard.press("u")
    await expect(page).to_have_url(re.compile("#/usage$"))
    usage_spend = page.locator(".usage-body .stat").first
    await expect(usage_spend.locator(".stat-value")).to_have_text(spend or "")
    await expect(usage_spend.locator(".stat-note")).to_contain_text("removed agents included")
    await s.assert_clean()

    # 390 px: every page fits, the header is one row, table rows are stacked
    narrow = await open_session(stack, width=390, height=844)
    await narrow.open()
    row = narrow.page.locator(f'tr.agent-row[data-agent-id="{agent_id}"]')
    await expect(row).to_be_visible()
    await assert_fits(narrow, 390)
    # (measured in one go: the list re-renders as the fleet updates)
    rights: list[float] = []

    async def cells_fit() -> bool:
        rights.append(
            await narrow.page.evaluate(
                "Math.max(...[...document.querySelectorAll('tr.agent-row td')]"
                ".map((td) => td.getBoundingClientRect().right))"
            )
        )
        return rights[-1] <= 390

    try:
        await wait_until(cells_fit, 5.0, interval=0.1, what="the agent row fits")
    except AssertionError:
        raise AssertionError(f"a cell of the agent row ends at {rights[-1]} px") from None
    # The stacked rows into view, in one step in the page: the fleet re-renders as it updates,
    # and a locator's element can be replaced between resolving and scrolling (it failed so).
    await expect(narrow.page.locator(".ws-card")).to_be_attached()
    await narrow.page.evaluate(
        "document.querySelector('.ws-card').scrollIntoView({block: 'nearest'})"
    )
    await narrow.doc_shot("narrow-390-fleet")
    await narrow.open(f"#/agents/{agent_id}")
    await expect(narrow.page.locator(".tl-finished")).to_be_attached()
    await expect(narrow.page.locator(".files-card .file-row")).to_have_count(len(review.CHANGED))
    await assert_fits(narrow, 390)
    # the inspector is a bottom sheet, shown for a selected call only
    await expect(narrow.page.locator(".inspector")).to_be_hidden()
    await narrow.page.locator('.tl-tool[data-tool-id="toolu_edit"] .tool-row').click()
    await expect(narrow.page.locator(".inspector.open .diff")).to_be_visible()
    await assert_fits(narrow, 390)
    await narrow.doc_shot("narrow-390-agent")
    await narrow.page.get_by_role("button", name="Close inspector").click()
    await expect(narrow.page.locator(".inspector")).to_be_hidden()
    for route, ready in (
        ("#/usage", ".usage-table tbody tr"),
        ("#/approvals", "#view .empty"),
        ("#/spawn", "#spawn-form"),
    ):
        await narrow.open(route)
        await expect(narrow.page.locator(ready).first).to_be_visible()
        await assert_fits(narrow, 390)
    await narrow.assert_clean()


async def test_markdown_cannot_smuggle_script(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack()
    agent_id = await stack.spawn("mdxss: render this", label="md-xss")
    await run_to_done(stack, agent_id)
    s = await open_session(stack)
    page = s.page
    await s.open(f"#/agents/{agent_id}")
    await expect(page.locator(".tl-finished")).to_be_visible()
    md = page.locator(".tl-text .text")
    await expect(md.locator("a.ext-link")).to_have_count(3)
    # The only links: the safe ones (an unsafe target leaves its text, never a link).
    hrefs = await md.locator("a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
    assert hrefs == [
        "https://example.com/outer",
        "https://example.com/safe",
        "https://example.org/bare",
    ], hrefs
    await expect(md.locator('a[href="https://example.com/safe"]')).to_have_attribute(
        "title", "a title"
    )
    text = await md.text_content() or ""
    for shown in (
        "click",
        "caps",
        "data",
        "[image: img]",
        "<script>window.__xss=38</script>",
        '<img src=x onerror="window.__xss=37">',
        "<svg onload=window.__xss=41>heading",
    ):
        assert shown in text, shown
    await expect(md.locator("h1")).to_have_text("<svg onload=window.__xss=41>heading")
    await expect(md.locator("pre.md-code")).to_have_text("<script>window.__xss=39</script>")
    await expect(md.locator("table td").first).to_have_text("<img src=x onerror=window.__xss=40>")
    # Clicking what a javascript: link would have been runs nothing.
    await md.get_by_text("click", exact=False).first.click()
    assert await page.locator(INJECTED).count() == 0
    assert (
        await page.locator(
            "#view a[href^='data'], #view a[href^='vbscript'], #view a[href^='file']"
        ).count()
        == 0
    )
    assert await page.locator("#view img, #view iframe, #view svg:not(.chart-svg)").count() == 0
    await s.assert_clean()


async def wait_awaiting(stack: DashStack, agent_id: str, n: int) -> None:
    async def ok() -> bool:
        fleet = (await stack.client.get("/api/fleet")).json()
        return any(
            a["id"] == agent_id and a["pending_decisions"] == n
            for ws in fleet["workspaces"]
            for a in ws["agents"]
        )

    from tests.support import wait_until

    await wait_until(ok, 15.0, interval=0.05, what=f"{agent_id} with {n} pending decision(s)")


async def test_acp_edit_diff_on_the_card_answered_on_the_timeline_awaiting_in_the_fleet(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack(allow_acp=True)
    agent_id = await stack.spawn(
        "review: add a health check", label="acp-editor", drive_protocol="acp", posture="supervised"
    )
    [did] = await pending_ids(stack, agent_id)
    await wait_awaiting(stack, agent_id, 1)
    s = await open_session(stack)
    page = s.page

    # the fleet: the waiting agent reads "awaiting approval", not running
    await s.open()
    row = page.locator(f'tr.agent-row[data-agent-id="{agent_id}"]')
    pill = row.locator(".col-status .pill")
    await expect(pill).to_have_text("awaiting approval")
    await expect(pill).to_have_attribute("data-status", "running")
    await page.select_option('select[name="status"]', "awaiting")
    await expect(page.locator("tr.agent-row")).to_have_count(1)
    await s.doc_shot("fleet-awaiting-approval", page.locator(".ws-card"))
    await page.select_option('select[name="status"]', "all")

    # the approvals card shows the edit as a diff
    await s.open("#/approvals")
    card = page.locator(f'article.decision[data-decision-id="{did}"]')
    await expect(card.locator(".decision-title")).to_have_text(review.ACP_EDIT_TITLE)
    cdiff = card.locator('.diff[data-path="src/app.py"]')
    await expect(cdiff.locator(".diff-del .diff-text")).to_have_text(
        ["    # TODO: handle empty input"]
    )
    await expect(cdiff.locator(".diff-add .diff-text")).to_have_text(
        ["    if not items:", "        return None"]
    )
    await expect(card.locator('[data-field="input"]')).to_contain_text('"old_string"')
    await s.doc_shot("diff-approval-card", card)

    # the agent page: the ACP diff content in the inspector (a new file, whole-file diffs),
    # the files changed, and the request answerable right on the timeline
    await s.open(f"#/agents/{agent_id}")
    await expect(page.locator(".agent-status .pill")).to_have_text("awaiting approval")
    write = page.locator('.tl-tool[data-tool-id="w1"]')
    await expect(write).to_have_attribute("data-state", "ok")
    await write.locator(".tool-row").click()
    insp = page.locator(".inspector")
    created = insp.locator('.diff[data-kind="create"]')
    await expect(created.locator(".diff-path")).to_have_text(review.ACP_WRITE_PATH)  # root-relative
    await expect(created.locator(".diff-add .diff-text")).to_have_text(
        review.ACP_WRITE_TEXT.rstrip("\n").split("\n")
    )
    files = page.locator(".files-card")
    await expect(files.locator(".file-row")).to_have_count(2)
    await expect(files.locator('.file-row[data-path$="/src/app.py"]')).to_have_attribute(
        "data-status", "pending"
    )
    marker = page.locator(f'.tl-marker[data-decision-id="{did}"]')
    inline = marker.locator("article.decision-inline")
    idiff = inline.locator(".diff")
    # the whole-file diff of the call's ACP content: real line numbers
    await expect(idiff.locator(".diff-del .diff-ln").first).to_have_text("2")
    await expect(idiff.locator(".diff-add .diff-text")).to_have_text(
        ["    if not items:", "        return None"]
    )
    await expect(inline.locator(".option-buttons button")).to_have_count(4)
    await s.doc_shot("timeline-approval", marker)

    # answered with the keyboard on the timeline: a on the focused request allows it once
    await inline.focus()
    await page.keyboard.press("a")
    await expect(inline).to_have_count(0)
    events = await stack.wait_history(agent_id, finished)
    [res] = of_kind(events, "decision_resolved")
    assert (res["id"], res["option_id"], res["by"]) == (did, "allow-once", "anonymous")
    await expect(page.locator(".tl-text .text").last).to_contain_text("Edit applied.")
    await expect(marker.get_by_role("link", name="open the inbox")).to_have_count(0)
    await expect(files.locator('.file-row[data-path$="/src/app.py"]')).to_have_attribute(
        "data-status", "changed"
    )
    await expect(page.locator(".agent-status .pill")).not_to_have_text("awaiting approval")
    await s.open()
    await expect(pill).not_to_have_text("awaiting approval")
    await s.assert_clean()
