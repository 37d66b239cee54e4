"""DailyBudgets (core/budgets_daily.py): a workspace's spend per UTC day is its usage row;
warnings once per cap, workspace and day; over a cap a `budget_exceeded`; spawns refused from
the cap on; a workspace without caps reads nothing."""

from __future__ import annotations

from typing import Any

import pytest

from prospero.core.budgets_daily import DailyBudgets
from prospero.core.errors import BudgetReached
from prospero.core.store.base import UsageDay
from prospero.types.model import RepoProviderConfig


class Usage:
    """The one store call DailyBudgets makes, over rows the test sets."""

    def __init__(self) -> None:
        self.rows: list[UsageDay] = []
        self.reads = 0

    async def usage(self, since_day: str, until_day: str) -> list[UsageDay]:
        self.reads += 1
        return [r for r in self.rows if since_day <= r.day <= until_day]

    def spend(self, workspace: str, day: str, usd: float | None, tokens: int | None) -> None:
        self.rows = [r for r in self.rows if (r.workspace, r.day) != (workspace, day)]
        self.rows.append(
            UsageDay(workspace, day, input_tokens=tokens, output_tokens=0, cost_usd=usd)
        )


def budgets(store: Usage, day: list[str]) -> tuple[DailyBudgets, list[int]]:
    flushed = [0]

    async def flush() -> None:
        flushed[0] += 1

    b = DailyBudgets(store, flush, today=lambda: day[0])  # type: ignore[arg-type]
    return b, flushed


CAPPED = RepoProviderConfig(daily_budget_usd=1.0, daily_budget_tokens=1000)


async def test_no_cap_reads_nothing() -> None:
    store = Usage()
    b, flushed = budgets(store, ["2026-12-02"])
    assert await b.check("ws", RepoProviderConfig()) is None
    await b.refuse_spawn("ws", RepoProviderConfig())
    assert store.reads == 0 and flushed[0] == 0


async def test_warns_once_a_day_then_exceeds_then_refuses() -> None:
    store, day = Usage(), ["2026-12-02"]
    b, flushed = budgets(store, day)
    store.spend("ws", day[0], 0.5, 100)
    v = await b.check("ws", CAPPED)
    assert v is not None and v.warnings == [] and v.exceeded is None
    assert flushed[0] == 1  # what was emitted is committed before the row is read
    store.spend("ws", day[0], 0.8, 100)
    store.spend("other", day[0], 50.0, 10**6)  # another workspace's spend is not ours
    v = await b.check("ws", CAPPED)
    assert v is not None and [w.limit for w in v.warnings] == ["usd"]
    assert v.warnings[0].scope == "workspace_day" and v.warnings[0].spent == pytest.approx(0.8)
    v = await b.check("ws", CAPPED)
    assert v is not None and v.warnings == []  # once
    await b.refuse_spawn("ws", CAPPED)  # under the cap: spawns go on
    store.spend("ws", day[0], 1.2, 100)
    v = await b.check("ws", CAPPED)
    assert v is not None and v.exceeded is not None
    assert (v.exceeded.limit, v.exceeded.scope, v.exceeded.cap) == ("usd", "workspace_day", 1.0)
    assert "daily budget" in v.detail and "$1.2000" in v.detail
    with pytest.raises(BudgetReached, match="00:00 UTC"):
        await b.refuse_spawn("ws", CAPPED)
    # A new UTC day: nothing spent yet, spawns go on, the warning may come again.
    day[0] = "2026-12-03"
    await b.refuse_spawn("ws", CAPPED)
    store.spend("ws", day[0], 0.9, 10)
    v = await b.check("ws", CAPPED)
    assert v is not None and [w.limit for w in v.warnings] == ["usd"]


@pytest.mark.parametrize(
    ("usd", "tokens", "limit"),
    [(None, 1001, "tokens"), (1.01, None, "usd"), (None, None, None)],
)
async def test_unreported_spend_counts_as_nothing(
    usd: float | None, tokens: int | None, limit: Any
) -> None:
    store, day = Usage(), ["2026-12-02"]
    b, _ = budgets(store, day)
    store.spend("ws", day[0], usd, tokens)
    v = await b.check("ws", CAPPED)
    assert v is not None
    assert (v.exceeded.limit if v.exceeded else None) == limit


async def test_reaching_a_cap_exactly_refuses_spawns_but_stops_nothing() -> None:
    store, day = Usage(), ["2026-12-02"]
    b, _ = budgets(store, day)
    store.spend("ws", day[0], 1.0, 0)
    v = await b.check("ws", CAPPED)
    assert v is not None and v.exceeded is None
    with pytest.raises(BudgetReached, match=r"\$1\.0000 of \$1\.0000"):
        await b.refuse_spawn("ws", CAPPED)
