"""/api/usage: per-workspace, per-UTC-day aggregates after real runs; window semantics."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from prospero.api.routes_fleet import build_report, usage_window
from prospero.core.ratecard import Rate, RateCard
from prospero.core.store.base import UsageDay
from prospero.testkit.scripts import DEFAULT_MODEL
from tests.api.conftest import StackFactory, envelope
from tests.support import wait_until


async def test_usage_after_finished_runs(make_stack: StackFactory) -> None:
    stack = await make_stack()
    await stack.add_workspace("idle")  # a workspace without runs has no group
    a = await stack.spawn("tools")
    events = await stack.wait_finished(a)
    await stack.wait_status(a, "done")
    # the UTC day the run was recorded on (robust to a test running across midnight)
    today = events[-1]["ts"][:10]
    day_start = datetime.fromisoformat(today).replace(tzinfo=UTC)
    b = await stack.spawn("slow")
    await stack.wait_status(b, "running")
    assert (await stack.client.post(f"/api/agents/{b}/kill")).status_code == 202
    await stack.wait_status(b, "killed")
    # The record's status is set before its status_changed event is committed, and outcomes
    # count committed events: wait for the aggregates themselves.
    report: dict[str, Any] = {}

    async def outcomes_counted() -> bool:
        nonlocal report
        r = await stack.client.get("/api/usage")
        assert r.status_code == 200
        report = r.json()
        groups = report["groups"]
        return bool(groups) and groups[0]["outcomes"] == {
            "done": 1,
            "failed": 0,
            "killed": 1,
            "crashed": 0,
            "budget_exceeded": 0,
        }

    await wait_until(outcomes_counted, 20, what="both outcomes in /api/usage")
    assert [g["workspace"] for g in report["groups"]] == ["ws"]
    g = report["groups"][0]
    # Per turn: tool_run_script's two turns (812 + 901 in, 64 + 12 out) and the killed run's
    # one finished turn (10 in, 1 out); each run, killed or done, counts once with its outcome.
    assert g["runs"] == 2 and g["turns"] == 3
    assert g["input_tokens"] == 1713 + 10 and g["output_tokens"] == 76 + 1
    assert g["cost_usd"] is None  # "fake-model" has no rate: not priced, never a fake 0
    assert g["outcomes"] == {
        "done": 1,
        "failed": 0,
        "killed": 1,
        "crashed": 0,
        "budget_exceeded": 0,
    }
    assert [b["day"] for b in g["series"]] == [today]
    assert g["series"][0]["runs"] == 2 and g["series"][0]["outcomes"]["killed"] == 1
    # window echo: RFC 3339 with +00:00
    since = datetime.fromisoformat(report["since"])
    until = datetime.fromisoformat(report["until"])
    assert report["until"].endswith("+00:00") and until - since == timedelta(days=7)

    # a window that ends before today has nothing
    yesterday = (day_start - timedelta(hours=12)).isoformat()
    r = await stack.client.get("/api/usage", params={"until": yesterday})
    assert r.status_code == 200 and r.json()["groups"] == []
    # `until` is exclusive: today's midnight excludes today
    midnight = day_start
    r = await stack.client.get("/api/usage", params={"until": midnight.isoformat()})
    assert r.json()["groups"] == []
    # days clamps to >= 1 and counts back from until
    r = await stack.client.get(
        "/api/usage", params={"days": 0, "until": (day_start + timedelta(hours=23)).isoformat()}
    )
    assert [g["workspace"] for g in r.json()["groups"]] == ["ws"]
    # explicit since/until (Z suffix accepted)
    start = midnight.strftime("%Y-%m-%dT%H:%M:%SZ")
    r = await stack.client.get(
        "/api/usage", params={"since": start, "until": (midnight + timedelta(days=1)).isoformat()}
    )
    body = r.json()
    assert body["since"] == midnight.isoformat(timespec="microseconds")
    assert body["groups"][0]["runs"] == 2
    # since after until: empty, not an error
    r = await stack.client.get(
        "/api/usage", params={"since": (midnight + timedelta(days=2)).isoformat(), "until": start}
    )
    assert r.status_code == 200 and r.json()["groups"] == []
    envelope(
        await stack.client.get("/api/usage", params={"until": "2026-13-01"}), 422, "invalid_request"
    )


async def test_usage_counts_turns_as_they_finish_whatever_the_state(
    make_stack: StackFactory,
) -> None:
    """A running agent's finished turns count at once; a killed agent's finished turns stay
    counted; a run and its outcome count once, when it ends (a kill after the end changes
    nothing)."""
    stack = await make_stack()

    async def group() -> dict[str, Any]:
        r = await stack.client.get("/api/usage")
        assert r.status_code == 200, r.text
        groups = r.json()["groups"]
        return dict(groups[0]) if groups else {}

    async def reaches(**want: Any) -> dict[str, Any]:
        got: dict[str, Any] = {}

        async def ok() -> bool:
            nonlocal got
            got = await group()
            return bool(got) and all(got.get(k) == v for k, v in want.items())

        await wait_until(ok, 20, what=f"/api/usage reaching {want}")
        return got

    inter = await stack.spawn("interactive", interactive=True)
    await stack.wait_status(inter, "idle")  # running, waiting for input: no agent_finished
    g = await reaches(turns=1)
    assert (g["runs"], g["input_tokens"], g["output_tokens"]) == (0, 10, 5)
    assert g["outcomes"] == {
        "done": 0,
        "failed": 0,
        "killed": 0,
        "crashed": 0,
        "budget_exceeded": 0,
    }

    slow = await stack.spawn("slow")  # one finished turn (10 in, 1 out), then a long pause
    g = await reaches(turns=2)
    assert (g["runs"], g["input_tokens"], g["output_tokens"]) == (0, 20, 6)
    assert (await stack.client.post(f"/api/agents/{slow}/kill")).status_code == 202
    await stack.wait_status(slow, "killed")
    g = await reaches(runs=1)
    assert g["turns"] == 2 and (g["input_tokens"], g["output_tokens"]) == (20, 6)
    assert g["outcomes"] == {
        "done": 0,
        "failed": 0,
        "killed": 1,
        "crashed": 0,
        "budget_exceeded": 0,
    }

    r = await stack.client.post(f"/api/agents/{inter}/end-input")
    assert r.status_code == 202, r.text
    await stack.wait_finished(inter)
    g = await reaches(runs=2)
    assert g["turns"] == 2 and (g["input_tokens"], g["output_tokens"]) == (20, 6)
    assert g["outcomes"] == {
        "done": 1,
        "failed": 0,
        "killed": 1,
        "crashed": 0,
        "budget_exceeded": 0,
    }
    # Killing an agent that already finished does not count another outcome.
    await stack.wait_status(inter, "done")
    r = await stack.client.post(f"/api/agents/{inter}/kill")
    assert r.status_code == 409, r.text  # and nothing is emitted (history unchanged)
    g = await group()
    assert g["runs"] == 2
    assert g["outcomes"] == {
        "done": 1,
        "failed": 0,
        "killed": 1,
        "crashed": 0,
        "budget_exceeded": 0,
    }


async def test_usage_cost_with_a_rate_card(make_stack: StackFactory) -> None:
    card = RateCard(rates={DEFAULT_MODEL: Rate(1.0, 2.0)})
    stack = await make_stack(rate_card=card)
    a = await stack.spawn("tools")
    await stack.wait_finished(a)
    g = (await stack.client.get("/api/usage")).json()["groups"][0]
    assert g["cost_usd"] is not None
    assert abs(g["cost_usd"] - (1713 * 1.0 + 76 * 2.0) / 1_000_000) < 1e-9


def test_build_report_null_sums() -> None:
    rows = [
        UsageDay("b", "2026-01-02", turns=1, runs=1),
        UsageDay("a", "2026-01-02", input_tokens=5, output_tokens=1, cost_usd=0.5, turns=1, runs=1),
        UsageDay(
            "a",
            "2026-01-01",
            turns=2,
            runs=1,
            outcomes={"done": 1, "failed": 0, "killed": 0, "crashed": 0, "budget_exceeded": 0},
        ),
    ]
    rep = build_report("s", "u", rows)
    assert [g.workspace for g in rep.groups] == ["a", "b"]
    a, b = rep.groups
    assert [x.day for x in a.series] == ["2026-01-01", "2026-01-02"]
    assert a.input_tokens == 5 and a.cost_usd == 0.5 and a.turns == 3 and a.runs == 2
    assert a.outcomes.done == 1
    assert b.input_tokens is None and b.cost_usd is None  # not reported stays null


def test_usage_window_defaults() -> None:
    now = datetime(2026, 3, 10, 12, tzinfo=UTC)
    s, u = usage_window(None, None, None, now)
    assert u == now and s == now - timedelta(days=7)
    s, u = usage_window(None, None, -4, now)
    assert s == now - timedelta(days=1)
    s, u = usage_window("2026-03-01T00:00:00", "2026-03-02T00:00:00+02:00", 99, now)
    assert s == datetime(2026, 3, 1, tzinfo=UTC)
    assert u == datetime(2026, 3, 1, 22, tzinfo=UTC)
