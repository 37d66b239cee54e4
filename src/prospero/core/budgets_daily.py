"""Per-workspace daily budgets (issue 15, deliverable 3): a workspace's config may cap what
all its agents spend per UTC day (`daily_budget_usd`, `daily_budget_tokens`).

The spend is the workspace's `usage_daily` row for the day (the store's aggregate, kept at
ingest from every agent's `turn_finished`, on every replica of a cluster: the one count the
usage page shows too), read after the turn that changed it is committed. `DailyBudgets` is
asked after each turn of an agent of a capped workspace (the FleetManager's driver sinks):

- at `WARN_AT` (80 %) of a cap: one `budget_warning` (scope `workspace_day`) on the stream of
  the agent whose turn reached it, once per cap, workspace and day in this process;
- over a cap: `budget_exceeded` (scope `workspace_day`) on the stream of every agent of the
  workspace this replica drives, each stopped as an agent over its own cap is (the run ends
  `budget_exceeded`); in a cluster, agents another replica drives are stopped there at their
  own next turn. Until the UTC day ends, spawns (and respawns) in the workspace are refused
  (409 `budget_exceeded`), saying how much was spent and when it resets.

Workspaces without a daily cap cost nothing here (no read, no flush).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prospero.core.budgets import WARN_AT
from prospero.core.errors import BudgetReached
from prospero.core.store.base import EventStore
from prospero.types.events import BudgetExceeded, BudgetLimit, BudgetWarning
from prospero.types.model import RepoProviderConfig

Today = Callable[[], str]


def utc_today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


def daily_caps(config: RepoProviderConfig) -> dict[BudgetLimit, float]:
    caps: dict[BudgetLimit, float] = {}
    if config.daily_budget_usd is not None:
        caps["usd"] = float(config.daily_budget_usd)
    if config.daily_budget_tokens is not None:
        caps["tokens"] = float(config.daily_budget_tokens)
    return caps


def _fmt(limit: BudgetLimit, value: float) -> str:
    return f"${value:.4f}" if limit == "usd" else f"{int(value):,} tokens"


@dataclass
class DaySpend:
    """A workspace's spend on one UTC day, as its `usage_daily` row says."""

    day: str
    usd: float = 0.0
    tokens: float = 0.0

    def of(self, limit: BudgetLimit) -> float:
        return self.usd if limit == "usd" else self.tokens


@dataclass
class Verdict:
    """What one check found: the warnings to append, and the crossed cap (or None)."""

    warnings: list[BudgetWarning] = field(default_factory=list)
    exceeded: BudgetExceeded | None = None
    detail: str = ""


class DailyBudgets:
    """The daily caps' state of one prosperod: which warnings it gave today."""

    def __init__(
        self,
        store: EventStore,
        flush: Callable[[], Awaitable[None]],
        *,
        today: Today = utc_today,
    ) -> None:
        self.store = store
        self._flush = flush
        self._today = today
        self._warned: set[tuple[str, str, BudgetLimit]] = set()  # (workspace, day, limit)
        self._lock = asyncio.Lock()

    async def spent(self, workspace: str) -> DaySpend:
        """The workspace's spend today, everything emitted so far included."""
        await self._flush()
        day = self._today()
        out = DaySpend(day)
        for row in await self.store.usage(day, day):
            if row.workspace != workspace:
                continue
            out.usd += row.cost_usd or 0.0
            out.tokens += (row.input_tokens or 0) + (row.output_tokens or 0)
        return out

    async def check(self, workspace: str, config: RepoProviderConfig) -> Verdict | None:
        """After a turn of one of the workspace's agents: the warnings it owes now and, over a
        cap, the `budget_exceeded` to stop the workspace's agents with."""
        caps = daily_caps(config)
        if not caps:
            return None
        async with self._lock:  # one warning even when two agents' turns end together
            spend = await self.spent(workspace)
            verdict = Verdict()
            for limit, cap in caps.items():
                value = spend.of(limit)
                if value > cap:
                    verdict.exceeded = BudgetExceeded(
                        limit=limit, spent=round(value, 6), cap=cap, scope="workspace_day"
                    )
                    verdict.detail = (
                        f"stopped at its workspace's daily budget: {workspace} spent "
                        f"{_fmt(limit, value)} of a {_fmt(limit, cap)} cap today (UTC)"
                    )
                    return verdict
            for limit, cap in caps.items():
                value = spend.of(limit)
                mark = (workspace, spend.day, limit)
                if value >= WARN_AT * cap and mark not in self._warned:
                    self._warned.add(mark)
                    verdict.warnings.append(
                        BudgetWarning(
                            limit=limit,
                            spent=round(value, 6),
                            cap=cap,
                            threshold=WARN_AT,
                            scope="workspace_day",
                        )
                    )
            # Yesterday's marks are of no use any more.
            self._warned = {m for m in self._warned if m[1] == spend.day}
            return verdict

    async def refuse_spawn(self, workspace: str, config: RepoProviderConfig) -> None:
        """Raise `BudgetReached` when the workspace has reached a daily cap today."""
        caps = daily_caps(config)
        if not caps:
            return
        spend = await self.spent(workspace)
        for limit, cap in caps.items():
            value = spend.of(limit)
            if value >= cap:
                raise BudgetReached(
                    f"workspace '{workspace}' has reached its daily budget: "
                    f"{_fmt(limit, value)} of {_fmt(limit, cap)} spent today (UTC); spawns "
                    "resume at 00:00 UTC, or raise its cap with `prospero workspace config "
                    f"{workspace} --daily-budget-{'usd' if limit == 'usd' else 'tokens'} ...`"
                )
