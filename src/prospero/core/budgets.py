"""Per-agent budgets (issue 15, deliverable 3): the caps an agent was spawned with
(`AgentMeta.budget_usd`, `.budget_tokens`), checked as its driver hands each event over.

The spend is what the agent's `turn_finished` events report: `cost_usd` (the rate card's
price of the turn's usage; null when unpriced, which spends nothing against a dollar cap) and
`usage.input_tokens + usage.output_tokens`. A `BudgetGuard` belongs to one driver's sink: it
first reads what the agent's stream already holds (a restarted prosperod, or a takeover, goes
on from what was spent, and does not warn twice), then folds each new turn in:

- at `WARN_AT` (80 %) of a cap: one `budget_warning` event (once per cap and agent);
- on crossing a cap: one `budget_exceeded` event and `on_exceeded(detail)`, which stops the
  agent (the FleetManager: ACP `session/cancel` then kill, NDJSON kill; the run ends with the
  outcome `budget_exceeded`). The crossing is acted on at the turn event that crossed it, not
  at the run's end.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence

from prospero.types.events import (
    BudgetExceeded,
    BudgetLimit,
    BudgetWarning,
    EventKind,
    TurnFinished,
)
from prospero.types.model import AgentMeta

log = logging.getLogger(__name__)

WARN_AT = 0.8
BUDGET_KINDS = ("turn_finished", "budget_warning", "budget_exceeded")

# Reads the agent's stored events of `BUDGET_KINDS`, oldest first.
HistoryLoader = Callable[[], Awaitable[Sequence[object]]]


def _fmt(limit: BudgetLimit, value: float) -> str:
    return f"${value:.4f}" if limit == "usd" else f"{int(value):,} tokens"


class BudgetGuard:
    """One agent's caps and spend. Not thread-safe; one per driver sink."""

    def __init__(
        self,
        agent_id: str,
        *,
        usd: float | None,
        tokens: int | None,
        load: HistoryLoader,
        on_exceeded: Callable[[str], None],
    ) -> None:
        self.agent_id = agent_id
        self.caps: dict[BudgetLimit, float] = {}
        if usd is not None:
            self.caps["usd"] = float(usd)
        if tokens is not None:
            self.caps["tokens"] = float(tokens)
        self.spent: dict[BudgetLimit, float] = {"usd": 0.0, "tokens": 0.0}
        self.warned: set[BudgetLimit] = set()
        self.exceeded = False
        self._load = load
        self._loaded = False
        self._on_exceeded = on_exceeded

    @classmethod
    def for_meta(
        cls,
        meta: AgentMeta | None,
        load: HistoryLoader,
        on_exceeded: Callable[[str], None],
    ) -> BudgetGuard | None:
        if meta is None or not meta.budgeted:
            return None
        return cls(
            meta.agent_id,
            usd=meta.budget_usd,
            tokens=meta.budget_tokens,
            load=load,
            on_exceeded=on_exceeded,
        )

    async def ready(self) -> list[EventKind]:
        """Fold in what the stream already holds (once); the budget events it still owes
        (a crossing stored without its event: the process stopped in between)."""
        if self._loaded:
            return []
        self._loaded = True
        for ev in await self._load():
            kind = getattr(ev, "kind", None)
            if isinstance(kind, TurnFinished):
                self._add(kind)
            elif isinstance(kind, BudgetWarning) and kind.scope == "agent":
                self.warned.add(kind.limit)
            elif isinstance(kind, BudgetExceeded):
                self.exceeded = True
        return [] if self.exceeded else self._check()

    def _add(self, turn: TurnFinished) -> None:
        if turn.cost_usd is not None:
            self.spent["usd"] += turn.cost_usd
        if turn.usage is not None:
            self.spent["tokens"] += turn.usage.input_tokens + turn.usage.output_tokens

    def observe(self, kinds: Iterable[object]) -> list[EventKind]:
        """Fold the new events in; the budget events to append after them (and, on a
        crossing, `on_exceeded` called once)."""
        if self.exceeded:
            return []
        turned = False
        for kind in kinds:
            if type(kind) is TurnFinished:
                self._add(kind)
                turned = True
        return self._check() if turned else []

    def in_turn(self, turn_usd: float) -> list[EventKind]:
        """An ACP agent's cumulative `usage_update` mid-turn: the turn has cost `turn_usd` so
        far. Its warning or crossing now (the stop then cancels the turn in flight), instead
        of at the turn's end; the turn's `turn_finished` then adds nothing new."""
        if self.exceeded or not self._loaded or "usd" not in self.caps or turn_usd <= 0:
            return []
        settled = self.spent["usd"]
        self.spent["usd"] = settled + turn_usd
        try:
            return self._check(only="usd")
        finally:
            self.spent["usd"] = settled

    def _check(self, only: BudgetLimit | None = None) -> list[EventKind]:
        out: list[EventKind] = []
        for limit, cap in self.caps.items():
            if only is not None and limit != only:
                continue
            spent = self.spent[limit]
            if spent > cap:
                self.exceeded = True
                out.append(BudgetExceeded(limit=limit, spent=round(spent, 6), cap=cap))
                detail = (
                    f"stopped at its budget: spent {_fmt(limit, spent)} of a {_fmt(limit, cap)} cap"
                )
                log.warning("agent %s: %s", self.agent_id, detail)
                self._on_exceeded(detail)
                return out
            if spent >= WARN_AT * cap and limit not in self.warned:
                self.warned.add(limit)
                out.append(
                    BudgetWarning(limit=limit, spent=round(spent, 6), cap=cap, threshold=WARN_AT)
                )
        return out
