"""Per-workspace daily budgets through the API (issue 15, deliverable 3): a workspace's
`daily_budget_usd` / `daily_budget_tokens` cap what all its agents spend per UTC day. At 80 %
one `budget_warning` (scope `workspace_day`); over the cap every running agent of the workspace
is stopped at that turn (`budget_exceeded`), and spawns are refused until the day ends."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import StackFactory
from tests.support import wait_until

SHARED = {"prompt": "x", "label": "budget", "isolation": "shared"}


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"]["kind"] for e in events]


def of_kind(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["kind"] for e in events if e["kind"]["kind"] == kind]


async def test_the_daily_cap_stops_every_agent_of_the_workspace_and_refuses_spawns(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack()
    r = await stack.client.patch(
        "/api/workspaces/ws/config", json={"daily_budget_usd": 0.01, "daily_budget_tokens": 10**6}
    )
    assert r.status_code == 200, r.text
    got = (await stack.client.get("/api/workspaces")).json()
    ws = next(w for w in got if w["name"] == "ws")
    assert ws["config"]["daily_budget_usd"] == 0.01
    # Two agents of $0.0042 a turn: together over $0.01 after three turns in all, well before
    # either's eighth (each would run 8 turns alone).
    first = await stack.spawn("budget")
    second = await stack.spawn("budget")
    a = await stack.wait_finished(first, within=30)
    b = await stack.wait_finished(second, within=30)
    turns = kinds(a).count("turn_finished") + kinds(b).count("turn_finished")
    assert 3 <= turns <= 5, (kinds(a), kinds(b))  # the crossing turn, and one in flight at most
    for events in (a, b):
        exceeded = of_kind(events, "budget_exceeded")
        assert len(exceeded) == 1, kinds(events)
        assert exceeded[0]["scope"] == "workspace_day" and exceeded[0]["limit"] == "usd"
        assert exceeded[0]["spent"] > 0.01 and exceeded[0]["cap"] == 0.01
        finished = of_kind(events, "agent_finished")[0]
        assert finished["outcome"] == "budget_exceeded"
        assert "daily budget" in (finished["detail"] or "")
    warnings = of_kind(a, "budget_warning") + of_kind(b, "budget_warning")
    assert len(warnings) == 1, warnings  # once per workspace and day, on one agent's stream
    assert warnings[0]["scope"] == "workspace_day" and warnings[0]["spent"] >= 0.008
    for agent in (first, second):
        await stack.wait_status(agent, "killed")
    r = await stack.client.post("/api/workspaces/ws/agents", json=SHARED)
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["kind"] == "budget_exceeded"
    assert "daily budget" in body["error"] and "00:00 UTC" in body["error"]

    async def counted() -> bool:
        groups = (await stack.client.get("/api/usage")).json()["groups"]
        return bool(groups) and groups[0]["outcomes"]["budget_exceeded"] == 2

    await wait_until(counted, 20, what="both budget stops in /api/usage")
    # Raising the cap lets spawns in again the same day.
    r = await stack.client.patch("/api/workspaces/ws/config", json={"daily_budget_usd": 5})
    assert r.status_code == 200, r.text
    r = await stack.client.post("/api/workspaces/ws/agents", json=SHARED)
    assert r.status_code == 201, r.text


async def test_a_token_cap_and_clearing_it(make_stack: StackFactory) -> None:
    stack = await make_stack()
    r = await stack.client.patch("/api/workspaces/ws/config", json={"daily_budget_tokens": 1500})
    assert r.status_code == 200, r.text
    agent = await stack.spawn("budget")
    events = await stack.wait_finished(agent, within=30)
    assert kinds(events).count("turn_finished") == 3, kinds(events)  # 1800 > 1500
    assert of_kind(events, "budget_exceeded")[0]["limit"] == "tokens"
    r = await stack.client.patch("/api/workspaces/ws/config", json={"daily_budget_tokens": None})
    assert r.status_code == 200, r.text
    assert r.json()["config"].get("daily_budget_tokens") is None
    r = await stack.client.post("/api/workspaces/ws/agents", json=SHARED)
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "body",
    [
        {"daily_budget_usd": 0},
        {"daily_budget_usd": -2},
        {"daily_budget_tokens": 0},
        {"daily_budget_tokens": 2.5},
        {"daily_budget_usd": "lots"},
    ],
)
async def test_a_daily_cap_that_is_not_positive_is_refused(
    make_stack: StackFactory, body: dict[str, Any]
) -> None:
    stack = await make_stack()
    r = await stack.client.patch("/api/workspaces/ws/config", json=body)
    assert r.status_code in (400, 422), r.text
    got = (await stack.client.get("/api/workspaces")).json()
    cfg = next(w for w in got if w["name"] == "ws")["config"]
    assert cfg.get("daily_budget_usd") is None and cfg.get("daily_budget_tokens") is None


async def test_daily_caps_given_at_registration_or_in_a_whole_config_are_kept(
    make_stack: StackFactory,
) -> None:
    # POST /api/workspaces and PUT …/config take the caps as PATCH does (the whole-config
    # paths once dropped them: the cap was silently not there).
    stack = await make_stack()
    root = await stack.add_workspace("two", register=False)
    caps = {"daily_budget_usd": 0.25, "daily_budget_tokens": 5000}
    r = await stack.client.post(
        "/api/workspaces", json={"name": "two", "root": str(root), "config": caps}
    )
    assert r.status_code == 201, r.text
    assert {k: r.json()["config"].get(k) for k in caps} == caps
    r = await stack.client.put(
        "/api/workspaces/ws/config", json={"env": {"A": "1"}, "daily_budget_usd": 2}
    )
    assert r.status_code == 204, r.text
    got = {w["name"]: w["config"] for w in (await stack.client.get("/api/workspaces")).json()}
    assert {k: got["two"].get(k) for k in caps} == caps
    assert got["ws"]["daily_budget_usd"] == 2 and got["ws"]["env"] == {"A": "1"}
