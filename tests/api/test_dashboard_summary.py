"""`/api/dashboard/summary`: per-agent totals folded from stored turn and finish events, kept
incrementally (a later call reads only what was stored since)."""

from __future__ import annotations

from typing import Any

from tests.api.conftest import Stack
from tests.support import wait_until


def expected_totals(history: list[dict[str, Any]], upto: int) -> dict[str, Any]:
    """The fold, computed independently from the agent's history up to seq `upto` (the
    summary's own high-water mark: a poll may store a status change after the summary)."""
    history = [e for e in history if e["seq"] <= upto]
    turns = [e["kind"] for e in history if e["kind"]["kind"] == "turn_finished"]
    fin = next((e["kind"] for e in history if e["kind"]["kind"] == "agent_finished"), None)

    def total(field: str) -> int | None:
        vals = [t["usage"][field] for t in turns if t.get("usage") is not None]
        return sum(vals) if vals else None

    out: dict[str, Any] = {
        "seq": history[-1]["seq"],
        "turns": len(turns),
        "input_tokens": total("input_tokens"),
        "output_tokens": total("output_tokens"),
    }
    if fin is not None:
        out["turns"] = max(out["turns"], fin["turns"])
        out["outcome"] = fin["outcome"] or None
        if fin.get("usage") is not None:
            out["input_tokens"] = fin["usage"]["input_tokens"]
            out["output_tokens"] = fin["usage"]["output_tokens"]
    return out


async def summary(stack: Stack) -> dict[str, Any]:
    r = await stack.client.get("/api/dashboard/summary")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_totals_match_history_and_refresh_incrementally(stack: Stack) -> None:
    long_id = await stack.spawn("long-900")  # several turns with token usage, many outputs
    tools_id = await stack.spawn("tools")
    await stack.wait_finished(long_id)
    await stack.wait_finished(tools_id)
    body = await summary(stack)
    assert body["last_ordinal"] > 0
    for agent_id in (long_id, tools_id):
        history = await stack.history(agent_id)
        got = body["agents"][agent_id]
        want = expected_totals(history, got["seq"])
        assert {k: got[k] for k in want} == want, (agent_id, got, want)
    assert body["agents"][long_id]["turns"] >= 3

    # An interactive agent: its second turn shows up in a later summary.
    inter = await stack.spawn("interactive", interactive=True)
    await stack.wait_status(inter, "idle")
    first: dict[str, Any] = {}

    async def first_turn_counted() -> bool:
        # idle comes from the poll; the turn's event is stored by the driver independently
        nonlocal first
        first = (await summary(stack))["agents"][inter]
        return bool(first["turns"] == 1)

    await wait_until(first_turn_counted, 20, what="first turn in the summary")
    assert first["outcome"] is None
    r = await stack.client.post(f"/api/agents/{inter}/input", json={"text": "again"})
    assert r.status_code == 202, r.text
    r = await stack.client.post(f"/api/agents/{inter}/end-input")
    assert r.status_code == 202, r.text
    history = await stack.wait_finished(inter)
    got = (await summary(stack))["agents"][inter]
    want = expected_totals(await stack.history(inter), got["seq"])
    assert {k: got[k] for k in want} == want
    assert got["seq"] > first["seq"] and got["turns"] >= 2 and history
