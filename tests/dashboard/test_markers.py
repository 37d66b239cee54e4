"""Timeline markers: stream gaps and lost turns from the store, the SSE `gap` notice, an
undecodable frame, unknown kinds and seq de-duplication on an overlapping replay."""

from __future__ import annotations

import json
import re
from typing import Any

from playwright.async_api import Route, expect

from prospero.types.events import StreamGap, TurnLost
from tests.dashboard.conftest import SessionFactory, StackFactory


async def test_stream_gap_and_lost_turn_markers(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack()
    agent_id = await stack.spawn("slow: keeps running", label="gappy")
    await stack.wait_status(agent_id, "running")
    s = await open_session(stack)
    page = s.page
    await s.open(f"#/agents/{agent_id}")
    await expect(page.locator(".timeline .tl-text .text")).to_contain_text("line 0001")

    emitter = stack.runtime.emitter
    await emitter.emit(
        "ws", agent_id, StreamGap(missing=3, detail="re-attach could not prove continuity")
    )
    await emitter.emit("ws", agent_id, TurnLost(turn=1, reason="connection to the agent dropped"))
    gap = page.locator('.tl-marker[data-marker="stream_gap"]')
    await expect(gap).to_contain_text("3 line(s) may be missing")
    await expect(gap).to_contain_text("re-attach could not prove continuity")
    lost = page.locator('.tl-marker[data-marker="turn_lost"]')
    await expect(lost).to_contain_text("Turn 1 lost")
    await expect(lost).to_contain_text("connection to the agent dropped")
    await s.shot("agent-markers", full_page=False)
    await s.assert_clean()


def ev(seq: int, kind: dict[str, Any]) -> str:
    data = {
        "seq": seq,
        "ts": f"2026-01-01T00:00:0{seq % 10}.000000+00:00",
        "repo": "ws",
        "agent_id": "mock",
        "kind": kind,
    }
    return f"id: {seq}\ndata: {json.dumps(data)}\n\n"


async def test_sse_gap_bad_frame_unknown_kind_and_overlap(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    stack = await make_stack()
    calls: list[str] = []

    async def agent_stream(route: Route) -> None:
        calls.append(route.request.url)
        if len(calls) == 1:
            body = (
                ev(1, {"kind": "agent_spawned"})
                + ev(2, {"kind": "output", "stream": "stdout", "chunk": "hello "})
                + 'event: gap\ndata: {"skipped": 7, "last_seq": 2}\n\n'
                + ev(3, {"kind": "output", "stream": "stdout", "chunk": "world"})
                + "id: 4\ndata: {not json\n\n"
            )
        else:  # the reconnect overlaps what was already shown, then finishes
            body = (
                ev(2, {"kind": "output", "stream": "stdout", "chunk": "hello "})
                + ev(3, {"kind": "output", "stream": "stdout", "chunk": "world"})
                + ev(4, {"kind": "brand_new_kind", "x": 1})
                + ev(5, {"kind": "tool_finished", "id": "", "name": "Orphan", "ok": False})
                + ev(6, {"kind": "agent_finished", "outcome": "EndOfTurn", "turns": 0})
            )
        await route.fulfill(status=200, headers={"content-type": "text/event-stream"}, body=body)

    s = await open_session(stack)
    page = s.page
    await page.route("**/api/agents/mock/stream?**", agent_stream)
    await s.open("#/agents/mock")
    await expect(page.locator(".tl-finished")).to_be_visible()
    await expect(page.locator('.tl-marker[data-marker="gap"]')).to_contain_text(
        "7 event(s) after #2"
    )
    await expect(page.locator('.tl-marker[data-marker="bad_frame"]')).to_be_visible()
    await expect(page.locator(".tl-unknown")).to_contain_text("brand_new_kind")
    orphan = page.locator(".tl-tool")
    await expect(orphan).to_have_attribute("data-state", "failed")
    # the gap notice sits between the two chunks
    await expect(page.locator(".timeline .tl-text .text")).to_have_text(["hello ", "world"])
    assert sorted(await s.timeline_seqs()) == [1, 2, 3, 4, 5, 6]
    assert "from=0" in calls[0] and "from=4" in calls[1], calls
    await expect(page.locator(".conn-chip")).to_have_text("finished")
    assert len(calls) == 2
    assert s.log.errors == []


async def test_cancel_turn_for_an_acp_agent(
    make_stack: StackFactory, open_session: SessionFactory
) -> None:
    """Cancel turn is offered for ACP agents (NDJSON agents cannot): the agent record is mocked
    as a running ACP agent, the POST is recorded."""
    stack = await make_stack()
    agent = {
        "id": "acp1",
        "name": "acp-agent",
        "workspace": "ws",
        "status": "running",
        "started_at": "2026-01-01T00:00:00+00:00",
        "isolated": True,
        "interactive": False,
        "drive_protocol": "acp",
        "posture": "supervised",
        "model": "claude-sonnet-4-6",
        "label": "acp-agent",
    }
    cancels: list[str] = []

    async def agent_api(route: Route) -> None:
        if route.request.method == "POST" and route.request.url.endswith("/cancel"):
            cancels.append(route.request.url)
            await route.fulfill(status=202, body="")
        else:
            await route.fulfill(json=agent)

    async def agent_stream(route: Route) -> None:
        body = ev(1, {"kind": "agent_spawned"}) + ev(
            2, {"kind": "output", "stream": "stdout", "chunk": "working"}
        )
        await route.fulfill(status=200, headers={"content-type": "text/event-stream"}, body=body)

    s = await open_session(stack)
    page = s.page
    await page.route("**/api/agents/acp1/stream?**", agent_stream)
    await page.route(re.compile(r".*/api/agents/acp1(/cancel)?$"), agent_api)
    await s.open("#/agents/acp1")
    await expect(page.locator(".agent-tags")).to_contain_text("acp")
    await expect(page.locator(".agent-tags")).to_contain_text("supervised")
    cancel = page.locator('[data-action="cancel"]')
    await expect(cancel).to_be_enabled()
    await cancel.click()
    await expect(page.locator(".banner-ok")).to_contain_text("Cancel requested")
    assert len(cancels) == 1
    assert s.log.errors == []
