"""`/api/dashboard/summary`: per-agent totals folded per turn from stored turn events (the
finish event gives the outcome), kept incrementally (a later call reads only what was stored
since); a running agent's and a killed agent's finished turns count."""

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
    costs = [t["cost_usd"] for t in turns if t.get("cost_usd") is not None]
    out["cost_usd"] = round(sum(costs), 10) if costs else None
    # Per turn only: the finish event gives the outcome, never totals of its own.
    out["outcome"] = (fin["outcome"] or None) if fin is not None else None
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


async def test_a_killed_agents_finished_turns_stay_counted(stack: Stack) -> None:
    slow = await stack.spawn("slow")  # one finished turn (10 in, 1 out), then a long pause
    got: dict[str, Any] = {}

    async def turn_counted() -> bool:
        nonlocal got
        got = (await summary(stack))["agents"].get(slow) or {}
        return bool(got.get("turns") == 1)

    await wait_until(turn_counted, 20, what="the running agent's turn in the summary")
    assert (got["input_tokens"], got["output_tokens"], got["outcome"]) == (10, 1, None)
    assert (await stack.client.post(f"/api/agents/{slow}/kill")).status_code == 202
    history = await stack.wait_finished(slow)
    got = (await summary(stack))["agents"][slow]
    want = expected_totals(history, got["seq"])
    assert {k: got[k] for k in want} == want
    assert (got["turns"], got["input_tokens"], got["output_tokens"]) == (1, 10, 1)
    assert got["outcome"] == "killed"


async def test_agents_are_listed_in_fleet_order(stack: Stack) -> None:
    await stack.add_workspace("alpha")  # sorts before "ws"
    ids = [await stack.spawn(ws=w) for w in ("ws", "alpha", "ws", "alpha")]
    fleet = (await stack.client.get("/api/fleet")).json()
    order = [a["id"] for ws in fleet["workspaces"] for a in ws["agents"]]
    assert sorted(order) == sorted(ids)
    assert list((await summary(stack))["agents"]) == order
