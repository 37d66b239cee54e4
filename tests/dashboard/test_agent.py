"""Agent page in Chromium: spawn from the form, the timeline filling live, the tool
inspector, resumption without duplicates (dropped stream and page reload), and the controls
(kill with confirmation, input, end input, respawn, remove)."""

from __future__ import annotations

import re
from typing import Any

from playwright.async_api import expect

from tests.dashboard.conftest import MODEL, Session, SessionFactory, StackFactory
from tests.support import wait_until


def ends_done(events: list[dict[str, Any]]) -> bool:
    last = events[-1]["kind"] if events else {}
    return last.get("kind") == "status_changed" and last.get("to") == "done"


def agent_id_from(url: str) -> str:
    m = re.search(r"#/agents/([^/?]+)$", url)
    assert m, url
    return m.group(1)


async def assert_each_event_once(s: Session, events: list[dict[str, Any]]) -> None:
    """Every stored event is on the timeline exactly once (and nothing else carries a seq)."""
    shown = await s.timeline_seqs()
    assert len(shown) == len(set(shown)), sorted(x for x in shown if shown.count(x) > 1)
    assert sorted(shown) == [e["seq"] for e in events]


async def test_spawn_from_form_live_timeline_and_inspector(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack(workspaces=("ws", "other"))
    s = await open_session(stack)
    page = s.page
    await s.open("#/spawn?ws=ws")
    form = page.locator("#spawn-form")
    await expect(form).to_be_visible()
    await expect(page.locator('select[name="workspace"]')).to_have_value("ws")
    await page.fill('textarea[name="prompt"]', "paced: write eighty lines")
    await page.fill('input[name="label"]', "from-the-form")
    await page.fill('input[name="model"]', MODEL)
    await page.uncheck('input[name="worktree"]')
    await page.check('input[name="interactive"]')  # the run ends when the test ends its input
    await expect(page.locator('select[name="drive_protocol"]')).to_have_value("ndjson")
    await page.select_option('select[name="posture"]', "autonomous")
    await s.shot("spawn")
    await page.click('[data-action="spawn"]')

    await expect(page).to_have_url(re.compile(r"#/agents/[0-9a-f]+$"))
    agent_id = agent_id_from(page.url)
    agent = (await stack.client.get(f"/api/agents/{agent_id}")).json()
    assert agent["label"] == "from-the-form"
    assert agent["isolated"] is False
    assert agent["model"] == MODEL
    assert agent["posture"] == "autonomous"
    assert agent["interactive"] is True

    # live: entries arrive while the agent is still running
    await expect(page.locator(".conn-chip")).to_have_text("live")
    text = page.locator(".timeline .tl-text .text").first
    await expect(text).to_contain_text("line 0005")
    early = len(await s.timeline_seqs())
    assert await stack.status(agent_id) == "running"
    await expect(page.locator(".timeline .tl-text .text").last).to_contain_text("line 0080")
    assert len(await s.timeline_seqs()) > early
    assert await page.locator(".tl-finished").count() == 0
    await expect(page.locator(".agent-status .pill")).to_have_text("idle")
    await page.click('[data-action="end-input"]')
    await page.click('dialog.modal [data-action="confirm"]')
    await expect(page.locator(".tl-finished")).to_be_visible()
    await expect(page.locator(".conn-chip")).to_have_text("finished")
    await expect(page.locator(".agent-status .pill")).to_have_text("done")
    await expect(page.locator(".tl-thinking summary")).to_contain_text("Thinking")
    await expect(page.locator(".tl-thinking details")).not_to_have_attribute("open", "")
    await expect(page.locator(".tl-turn")).to_have_count(2)
    await expect(page.locator(".tl-turn").first).to_contain_text("1.2k in")

    # the tool call: paired start -> finish, the inspector shows input and result
    tool = page.locator(".tl-tool")
    await expect(tool).to_have_count(1)
    await expect(tool).to_have_attribute("data-state", "ok")
    await expect(tool.locator(".tool-hint")).to_have_text("pytest -q tests/unit")
    await tool.locator(".tool-row").click()
    inspector = page.locator(".inspector")
    await expect(inspector.locator(".inspector-title")).to_have_text("Bash")
    await expect(inspector.locator('[data-field="input"]')).to_contain_text(
        '"command": "pytest -q tests/unit"'
    )
    await expect(inspector.locator('[data-field="input"]')).to_contain_text('"timeout": 120')
    await expect(inspector.locator('[data-field="result"]')).to_contain_text("4 passed in 0.02s")
    await s.shot("agent-inspector", full_page=False)

    events = await stack.wait_history(agent_id, ends_done)
    await expect(page.locator(".tl-status").last).to_contain_text("done")
    await assert_each_event_once(s, events)
    await s.assert_clean()


async def test_resume_after_drop_and_reload_without_duplicates(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack()
    # interactive: after its lines the run waits for input, so it cannot end before the reload
    agent_id = await stack.spawn("long: a long stream", label="long-stream", interactive=True)
    s = await open_session(stack)
    page = s.page
    streams: list[str] = []
    page.on("request", lambda req: streams.append(req.url) if "/stream?" in req.url else None)
    await s.open(f"#/agents/{agent_id}")
    await expect(page.locator(".timeline .tl-text .text").first).to_contain_text("line 0010")
    assert any(f"/api/agents/{agent_id}/stream?from=0" in u for u in streams), streams

    # the connection drops mid-stream: the page reconnects with ?from=<last+1>
    before = max(await s.timeline_seqs())
    await page.evaluate("window.prospero.dropStreams()")

    def resumed_from() -> list[int]:
        return [
            int(re.search(r"from=(\d+)", u).group(1))  # type: ignore[union-attr]
            for u in streams
            if f"/api/agents/{agent_id}/stream" in u
        ]

    async def resumed_past_the_drop() -> bool:
        # The page dialled again and shows what that stream brought (not only a line it may
        # already have shown before the drop: under a fast live path it can be far ahead).
        starts = resumed_from()
        return len(starts) >= 2 and max(await s.timeline_seqs()) >= starts[1]

    await wait_until(resumed_past_the_drop, timeout=20.0, what="events of the resumed stream")
    seqs = await s.timeline_seqs()
    resumed = resumed_from()
    assert len(resumed) == 2 and resumed[1] > before, resumed
    assert sorted(seqs) == list(range(1, max(seqs) + 1)), "a duplicate or a hole after resuming"

    # a reload mid-stream rebuilds the page from the stored history plus the live tail
    await page.reload()
    await expect(page.locator(".timeline .tl-text .text").first).to_contain_text("line 0001")
    await expect(page.locator(".timeline .tl-text .text").last).to_contain_text("line 0150")
    assert await page.locator(".tl-finished").count() == 0
    r = await stack.client.post(f"/api/agents/{agent_id}/end-input")
    assert r.status_code == 202, r.text
    await expect(page.locator(".tl-finished")).to_be_visible()
    await expect(page.locator(".agent-status .pill")).to_have_text("done")
    events = await stack.wait_history(agent_id, ends_done)
    await expect(page.locator(".tl-status").last).to_contain_text("done")
    await assert_each_event_once(s, events)
    texts = "".join(await page.locator(".timeline .tl-text .text").all_text_contents())
    lines = [ln for ln in texts.splitlines() if ln.startswith("line ")]
    assert lines == [f"line {i:04d}" for i in range(1, 151)]
    await s.shot("agent-reloaded", full_page=False)
    await s.assert_clean()


async def test_kill_needs_confirmation(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack()
    agent_id = await stack.spawn("slow: run until killed", label="to-kill")
    await stack.wait_status(agent_id, "running")
    s = await open_session(stack)
    page = s.page
    await s.open(f"#/agents/{agent_id}")
    await expect(page.locator(".agent-status .pill")).to_have_text("running")
    await expect(page.locator('[data-action="cancel"]')).to_be_disabled()  # NDJSON agent

    kill = page.locator('[data-action="kill"]')
    await kill.click()
    dialog = page.locator("dialog.modal")
    await expect(dialog).to_be_visible()
    await expect(dialog).to_contain_text("Kill this agent?")
    await expect(dialog).to_contain_text("to-kill")
    await s.shot("agent-kill-confirm", full_page=False)
    await dialog.locator('[data-action="cancel"]').click()
    await expect(dialog).to_have_count(0)
    assert await stack.status(agent_id) == "running"

    await kill.click()
    await page.locator('dialog.modal [data-action="confirm"]').click()
    await expect(page.locator(".agent-status .pill")).to_have_text("killed")
    assert await stack.status(agent_id) == "killed"
    await expect(page.locator(".tl-status").last).to_contain_text("killed")
    # terminal: respawn and remove replace kill
    await expect(page.locator('[data-action="kill"]')).to_have_count(0)
    await expect(page.locator('[data-action="respawn"]')).to_be_visible()

    # remove: confirmed, then back to the fleet without it
    await page.click('[data-action="remove"]')
    await expect(page.locator("dialog.modal")).to_contain_text("Remove this agent?")
    await page.click('dialog.modal [data-action="confirm"]')
    await expect(page).to_have_url(f"{stack.url}/#/")
    await expect(page.locator(".ws-card")).to_have_count(1)
    await expect(page.locator(f'tr.agent-row[data-agent-id="{agent_id}"]')).to_have_count(0)
    assert (await stack.client.get(f"/api/agents/{agent_id}")).status_code == 404
    await s.assert_clean()


async def test_input_end_input_respawn_remove(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack()
    agent_id = await stack.spawn("chat", label="pairing", interactive=True)
    await stack.wait_status(agent_id, "idle")
    s = await open_session(stack)
    page = s.page
    await s.open(f"#/agents/{agent_id}")
    await expect(page.locator(".timeline")).to_contain_text("Ready. What next?")
    await expect(page.locator(".input-state")).to_have_text("The agent is waiting for input.")

    await page.fill("#agent-input", "please add <b>tests</b>")
    await page.click('[data-action="send"]')
    await expect(page.locator(".timeline .tl-text .text").last).to_have_text(
        "echo: please add <b>tests</b>"
    )
    await expect(page.locator("#agent-input")).to_have_value("")
    await s.shot("agent-interactive", full_page=False)

    await page.click('[data-action="end-input"]')
    await expect(page.locator("dialog.modal")).to_contain_text("End input?")
    await page.click('dialog.modal [data-action="confirm"]')
    await expect(page.locator(".agent-status .pill")).to_have_text("done")
    await expect(page.locator("#agent-input")).to_have_count(0)

    # respawn fires at once and opens the new agent
    await page.click('[data-action="respawn"]')
    await expect(page).not_to_have_url(re.compile(f"#/agents/{agent_id}$"))
    await expect(page).to_have_url(re.compile(r"#/agents/[0-9a-f]+$"))
    new_id = agent_id_from(page.url)
    assert new_id != agent_id
    await expect(page.locator(".timeline")).to_contain_text("Ready. What next?")

    # caliband replaced the old agent: its page keeps the history, without controls
    await s.open(f"#/agents/{agent_id}")
    await expect(page.locator(".note-info")).to_contain_text("no longer in the fleet")
    await expect(page.locator(".controls button")).to_have_count(0)
    await expect(page.locator(".timeline")).to_contain_text("echo: please add <b>tests</b>")
    await s.assert_clean()
