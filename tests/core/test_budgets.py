"""BudgetGuard on its own: what a restarted prosperod (or a replica taking the agent over)
reads back from the agent's stream, and the warning and crossing rules."""

from __future__ import annotations

from types import SimpleNamespace

from prospero.core.budgets import BudgetGuard
from prospero.types.events import BudgetExceeded, BudgetWarning, Output, TurnFinished, Usage


def turn(cost: float | None, tokens: int = 0) -> TurnFinished:
    return TurnFinished(turn=0, cost_usd=cost, usage=Usage(input_tokens=tokens, output_tokens=0))


def stored(*kinds: object) -> list[object]:
    return [SimpleNamespace(kind=k) for k in kinds]


def guard(history: list[object], **caps: float | int | None) -> tuple[BudgetGuard, list[str]]:
    stops: list[str] = []

    async def load() -> list[object]:
        return history

    g = BudgetGuard(
        "a1", usd=caps.get("usd"), tokens=caps.get("tokens"), load=load, on_exceeded=stops.append
    )  # type: ignore[arg-type]
    return g, stops


async def test_spend_is_read_back_and_a_stored_warning_is_not_repeated() -> None:
    g, stops = guard(
        stored(turn(0.5), BudgetWarning(limit="usd", spent=0.85, cap=1.0), turn(0.35)), usd=1.0
    )
    assert await g.ready() == []  # 0.85 >= 0.8, warned already
    assert g.spent["usd"] == 0.85
    assert g.observe([Output(chunk="x")]) == []  # no turn: nothing to check
    [ev] = g.observe([turn(0.2)])
    assert isinstance(ev, BudgetExceeded) and ev.spent == 1.05 and ev.cap == 1.0
    assert stops and "spent $1.0500 of a $1.0000 cap" in stops[0]
    assert g.observe([turn(5.0)]) == [] and len(stops) == 1  # once


async def test_a_crossing_stored_without_its_event_is_owed_at_ready() -> None:
    g, stops = guard(stored(turn(None, 900), turn(None, 200)), tokens=1000)
    [ev] = await g.ready()
    assert isinstance(ev, BudgetExceeded) and ev.limit == "tokens" and ev.spent == 1100
    assert len(stops) == 1


async def test_an_unpriced_turn_spends_nothing_against_a_dollar_cap() -> None:
    g, stops = guard([], usd=0.01, tokens=100)
    assert await g.ready() == []
    assert g.observe([turn(None, 50)]) == []
    [warn] = g.observe([turn(None, 30)])
    assert isinstance(warn, BudgetWarning) and warn.limit == "tokens" and warn.spent == 80
    assert g.spent["usd"] == 0.0 and not stops


async def test_a_run_stopped_before_is_not_stopped_again() -> None:
    g, stops = guard(stored(turn(2.0), BudgetExceeded(limit="usd", spent=2.0, cap=1.0)), usd=1.0)
    assert await g.ready() == []
    assert g.observe([turn(1.0)]) == [] and not stops


async def test_a_turn_in_flight_warns_and_crosses_at_its_cumulative_cost() -> None:
    g, stops = guard(stored(turn(0.5)), usd=1.0, tokens=10**6)
    assert g.in_turn(0.2) == []  # before ready(): the history is not folded in yet
    assert await g.ready() == []
    [warn] = g.in_turn(0.35)  # 0.85 of 1.0 with the turn so far
    assert isinstance(warn, BudgetWarning) and warn.spent == 0.85
    assert g.spent["usd"] == 0.5  # the turn in flight is not settled spend
    assert g.in_turn(0.4) == []  # warned once
    [ev] = g.in_turn(0.6)
    assert isinstance(ev, BudgetExceeded) and ev.spent == 1.1 and len(stops) == 1
    # The turn's end (its full cost) adds nothing: the agent is being stopped.
    assert g.observe([turn(0.6)]) == [] and len(stops) == 1
    h, _ = guard([], tokens=100)
    await h.ready()
    assert h.in_turn(5.0) == []  # no dollar cap: mid-turn cost is not checked
