"""Per-agent budgets through the API (issue 15, deliverable 3): a spawn with `budget_usd` or
`budget_tokens`; at 80 % of the cap one `budget_warning`, on crossing it one `budget_exceeded`
and the agent stopped at that turn event (NDJSON: its driver records the end, then caliband
kills the worker): the run ends `budget_exceeded`, the agent reads `killed` with that outcome,
and /api/usage counts it on its own."""

from __future__ import annotations

from typing import Any

import pytest

from prospero.core.discovery import socket_path_for
from prospero.core.sources import canonical_root
from prospero.core.wire.control import SpawnSpec
from prospero.testkit import acp_scripts as S
from prospero.testkit.fake_caliband import FakeCaliband
from tests.api.conftest import BUDGET_TURN, StackFactory
from tests.support import wait_until


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"]["kind"] for e in events]


@pytest.mark.parametrize(
    ("cap", "limit", "warn_at", "spent"),
    [
        # $0.0042 a turn: 0.0084 >= 80 % of $0.01 after two turns, 0.0126 > 0.01 after three
        ({"budget_usd": 0.01}, "usd", 0.0084, 0.0126),
        # 600 tokens a turn: 1200 >= 80 % of 1500 after two, 1800 > 1500 after three
        ({"budget_tokens": 1500}, "tokens", 1200, 1800),
    ],
)
async def test_an_agent_is_stopped_at_the_turn_that_crosses_its_cap(
    make_stack: StackFactory, cap: dict[str, Any], limit: str, warn_at: float, spent: float
) -> None:
    stack = await make_stack()
    agent = await stack.spawn("budget", **cap)
    events = await stack.wait_finished(agent, within=30)
    seq = kinds(events)
    assert seq.count("turn_finished") == 3, seq  # stopped at the third turn: not the eighth
    warning = next(e["kind"] for e in events if e["kind"]["kind"] == "budget_warning")
    exceeded = next(e["kind"] for e in events if e["kind"]["kind"] == "budget_exceeded")
    assert warning["limit"] == limit and warning["spent"] == pytest.approx(warn_at)
    assert warning["cap"] == pytest.approx(next(iter(cap.values())))
    assert exceeded["limit"] == limit and exceeded["spent"] == pytest.approx(spent)
    # In stream order: the warning right after the second turn, the crossing right after the
    # third, then the run's end (nothing of a fourth turn in between).
    turns = [i for i, k in enumerate(seq) if k == "turn_finished"]
    assert seq[turns[1] + 1] == "budget_warning"
    assert seq[turns[2] + 1] == "budget_exceeded"
    tail = [k for k in seq[turns[2] + 2 :] if k != "status_changed"]  # (the kill's)
    assert tail == ["agent_finished"], tail
    assert seq.count("budget_warning") == 1 and seq.count("budget_exceeded") == 1
    finished = next(e["kind"] for e in events if e["kind"]["kind"] == "agent_finished")
    assert finished["outcome"] == "budget_exceeded"
    assert "budget" in (finished["detail"] or "")
    await stack.wait_status(agent, "killed")
    got = (await stack.client.get(f"/api/agents/{agent}")).json()
    assert got["outcome"] == "budget_exceeded"
    assert (got["budget_usd"], got["budget_tokens"]) == (
        cap.get("budget_usd"),
        cap.get("budget_tokens"),
    )

    async def counted() -> bool:
        r = await stack.client.get("/api/usage")
        groups = r.json()["groups"]
        return bool(groups) and groups[0]["outcomes"]["budget_exceeded"] == 1

    await wait_until(counted, 20, what="the budget stop in /api/usage")
    outcomes = (await stack.client.get("/api/usage")).json()["groups"][0]["outcomes"]
    assert outcomes == {"done": 0, "failed": 0, "killed": 0, "crashed": 0, "budget_exceeded": 1}


async def test_an_agent_under_its_cap_runs_to_the_end(make_stack: StackFactory) -> None:
    stack = await make_stack()
    per_turn = sum(BUDGET_TURN)
    agent = await stack.spawn("budget", budget_tokens=per_turn * 8 + 1, budget_usd=1.0)
    events = await stack.wait_finished(agent, within=30)
    seq = kinds(events)
    assert seq.count("turn_finished") == 8
    assert seq.count("budget_warning") == 1  # tokens: 4800 >= 80 % of 4801 at turn 7
    assert "budget_exceeded" not in seq
    assert events[-1]["kind"]["outcome"] == "EndOfTurn"


@pytest.mark.parametrize(
    "body",
    [{"budget_usd": 0}, {"budget_usd": -1}, {"budget_tokens": 0}, {"budget_tokens": 1.5}],
)
async def test_a_cap_that_is_not_positive_is_refused(
    make_stack: StackFactory, body: dict[str, Any]
) -> None:
    stack = await make_stack()
    r = await stack.client.post(
        "/api/workspaces/ws/agents", json={"prompt": "x", "label": "budget", **body}
    )
    assert r.status_code == 422, r.text
    assert (await stack.client.get("/api/fleet")).json()["workspaces"][0]["agents"] == []


def budget_acp_script(_spec: SpawnSpec) -> S.AcpScript:
    """Turn 1 costs $0.006 (cumulative usage_update), turn 2 brings the session to $0.012."""
    return S.AcpScript(
        turns=[
            [
                S.text("first"),
                S.usage(600, 200_000, cost=0.006),
                S.stop(input_tokens=400, output_tokens=200),
            ],
            [
                S.text("second"),
                S.usage(1200, 200_000, cost=0.012),
                S.stop(input_tokens=400, output_tokens=200),
            ],
        ],
        default_turn=[S.text("never"), S.stop()],
    )


async def test_an_acp_agent_is_concluded_then_killed_at_its_cap(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(workspace=False, allow_acp=True)
    root = stack.tmp / "ws"
    root.mkdir()
    canon = canonical_root(str(root))
    stack.fakes["ws"] = await FakeCaliband.start_unix(
        socket_path_for(canon), root=canon, acp_script_for=budget_acp_script
    )
    stack.roots["ws"] = root
    assert stack.runtime.manager is not None
    await stack.runtime.manager.add_workspace("ws", str(root))
    agent = await stack.spawn(
        "acp-budget", drive_protocol="acp", interactive=True, budget_usd=0.01, posture="autonomous"
    )

    async def turns(n: int) -> bool:
        return kinds(await stack.history(agent)).count("turn_finished") >= n

    await wait_until(lambda: turns(1), 20, what="the first turn")
    r = await stack.client.post(f"/api/agents/{agent}/input", json={"text": "go on"})
    assert r.status_code == 202, r.text
    events = await stack.wait_finished(agent, within=30)
    seq = kinds(events)
    assert seq.count("turn_finished") == 2 and seq.count("budget_exceeded") == 1
    assert "budget_warning" not in seq  # $0.006 is under 80 % of $0.01; $0.012 crosses at once
    exceeded = next(e["kind"] for e in events if e["kind"]["kind"] == "budget_exceeded")
    assert exceeded["spent"] == pytest.approx(0.012) and exceeded["limit"] == "usd"
    finished = next(e["kind"] for e in events if e["kind"]["kind"] == "agent_finished")
    assert finished["outcome"] == "budget_exceeded"
    assert seq.index("budget_exceeded") < seq.index("agent_finished")
    await stack.wait_status(agent, "killed")
    got = (await stack.client.get(f"/api/agents/{agent}")).json()
    assert got["outcome"] == "budget_exceeded"
    # The worker was released through caliband (killed), and input is refused now.
    r = await stack.client.post(f"/api/agents/{agent}/input", json={"text": "more"})
    assert r.status_code == 409, r.text


def midturn_acp_script(_spec: SpawnSpec) -> S.AcpScript:
    """One long turn: its cumulative cost passes $0.01 early, then it would go on for 30 s."""
    return S.AcpScript(
        turns=[
            [
                S.text("working"),
                S.usage(600, 200_000, cost=0.004),
                S.usage(1200, 200_000, cost=0.012),
                S.sleep(30.0),
                S.text("never seen"),
                S.stop(input_tokens=400, output_tokens=200),
            ]
        ],
        default_turn=[S.text("never"), S.stop()],
    )


async def test_an_acp_agent_is_stopped_mid_turn_and_the_turn_is_counted(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(workspace=False, allow_acp=True)
    root = stack.tmp / "ws"
    root.mkdir()
    canon = canonical_root(str(root))
    stack.fakes["ws"] = await FakeCaliband.start_unix(
        socket_path_for(canon), root=canon, acp_script_for=midturn_acp_script
    )
    stack.roots["ws"] = root
    assert stack.runtime.manager is not None
    await stack.runtime.manager.add_workspace("ws", str(root))
    agent = await stack.spawn(
        "acp-midturn", drive_protocol="acp", budget_usd=0.01, posture="autonomous"
    )
    # Well before the turn's 30 s: stopped at the usage_update that crossed the cap.
    events = await stack.wait_finished(agent, within=15)
    seq = kinds(events)
    text = "".join(e["kind"].get("chunk", "") for e in events)
    assert "working" in text and "never seen" not in text
    exceeded = next(e["kind"] for e in events if e["kind"]["kind"] == "budget_exceeded")
    assert exceeded["spent"] == pytest.approx(0.012)
    assert seq.index("budget_exceeded") < seq.index("turn_finished") < seq.index("agent_finished")
    turn = next(e["kind"] for e in events if e["kind"]["kind"] == "turn_finished")
    # The cancelled turn ended as the agent answered it: its cost is counted, not lost.
    assert turn["stop_reason"] == "cancelled" and turn["cost_usd"] == pytest.approx(0.012)
    assert "turn_lost" not in seq and seq.count("budget_exceeded") == 1
    finished = next(e["kind"] for e in events if e["kind"]["kind"] == "agent_finished")
    assert finished["outcome"] == "budget_exceeded"
