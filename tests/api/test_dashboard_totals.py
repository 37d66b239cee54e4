"""`TotalsCache` on a real SQLite store: the incremental totals (one `scan_kinds` read per
refresh) equal a from-scratch fold of each agent's stored turn events, whatever happened
between refreshes (new events, agents appearing with older history, agents leaving and
coming back, retention), and the body is byte-for-byte what `DashboardSummary` serialises to."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from prospero.api.responses import json_response
from prospero.api.routes_dashboard import (
    FOLDED_KINDS,
    AgentTotals,
    DashboardSummary,
    TotalsCache,
    fold,
    render_summary,
)
from prospero.core.store.sqlite.events import SqliteEventStore
from prospero.types.events import AgentFinished, EventKind, FleetEvent, Output, TurnFinished, Usage

DAY1 = "2026-01-01T12:00:00+00:00"
DAY3 = "2026-01-03T12:00:00+00:00"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    s = SqliteEventStore(tmp_path / "events.db")
    await s.open()
    yield s
    await s.close()


class Agents:
    """Appends events with the next seq of each agent."""

    def __init__(self, store: SqliteEventStore) -> None:
        self.store = store
        self.seq: dict[str, int] = {}

    async def add(self, *items: tuple[str, EventKind], at: str = DAY1) -> None:
        batch: list[FleetEvent] = []
        for agent, kind in items:
            self.seq[agent] = seq = self.seq.get(agent, 0) + 1
            batch.append(FleetEvent(seq=seq, ts=at, repo="ws", agent_id=agent, kind=kind))
        await self.store.append_batch(batch)


def turn(n: int, cost: float | None = None, model: str | None = None) -> TurnFinished:
    usage = Usage(input_tokens=10 * n, output_tokens=n) if n % 3 else None
    return TurnFinished(turn=n, model=model, usage=usage, cost_usd=cost)


async def from_scratch(store: SqliteEventStore, ids: list[str]) -> dict[str, dict[str, Any]]:
    """The fold over the models, per agent, with nothing cached."""
    out: dict[str, dict[str, Any]] = {}
    for a in ids:
        totals = AgentTotals()
        fold(totals, await store.replay(a, kinds=FOLDED_KINDS))
        totals.seq = max(totals.seq, await store.high_water(a))
        out[a] = totals.model_dump(mode="json")
    return out


async def check(store: SqliteEventStore, cache: TotalsCache, ids: list[str]) -> None:
    last, got = await cache.refresh(store, ids)
    assert last == await store.last_ordinal()
    assert list(got) == ids
    assert got == await from_scratch(store, ids)


async def test_incremental_totals_equal_a_fold_from_scratch(store: SqliteEventStore) -> None:
    agents = Agents(store)
    cache = TotalsCache()
    await check(store, cache, [])
    await check(store, cache, ["a", "b"])  # nothing stored yet: seq 0, nulls
    await agents.add(("a", Output(chunk="x")), ("a", turn(1, 0.1, "m1")), ("b", turn(2)))
    await check(store, cache, ["a", "b"])
    await check(store, cache, ["a", "b"])  # nothing new
    # c ran before the cache knew of it; b moves by output only; a finishes.
    await agents.add(("c", turn(3, 0.2)), ("c", Output(chunk="y")), ("b", Output(chunk="z")))
    await agents.add(("a", turn(4, 0.3)), ("a", AgentFinished(outcome="killed", model="m2")))
    await check(store, cache, ["a", "b", "c"])
    # b leaves the fleet and comes back later with more turns: counted in full again.
    await check(store, cache, ["a", "c"])
    await agents.add(("b", turn(5, 0.4, "m3")), ("c", turn(6)), ("d", turn(7, 1e-7)))
    await check(store, cache, ["c", "b", "a", "d"])
    await agents.add(("d", AgentFinished(outcome="", model=None)), ("e", Output(chunk="q")))
    await check(store, cache, ["a", "b", "c", "d", "e"])


async def test_heads_and_totals_across_retention(store: SqliteEventStore) -> None:
    agents = Agents(store)
    cache = TotalsCache()
    await agents.add(("a", turn(1, 0.5)), ("a", Output(chunk="x")), ("b", turn(2)))
    await check(store, cache, ["a", "b"])
    assert await store.prune(DAY3) == 3
    # The totals already folded stay; a new agent whose stream was pruned gets its head.
    _, got = await cache.refresh(store, ["a", "b"])
    assert (got["a"]["turns"], got["a"]["cost_usd"], got["a"]["seq"]) == (1, 0.5, 2)
    await check(store, TotalsCache(), ["a", "b"])  # from scratch: heads only, no rows
    await agents.add(("a", turn(3, 0.25)))
    _, got = await cache.refresh(store, ["a", "b"])
    assert (got["a"]["turns"], got["a"]["cost_usd"], got["a"]["seq"]) == (2, 0.75, 3)


async def test_body_is_what_dashboard_summary_serialises_to(store: SqliteEventStore) -> None:
    agents = Agents(store)
    await agents.add(("a", turn(1, 0.1, "m")), ("b", AgentFinished(outcome="EndOfTurn")))
    ids = ["b", "a", "z"]
    body = bytes((await render_summary(store, ids, TotalsCache())).body)
    expected = await from_scratch(store, ids)
    model = DashboardSummary(
        last_ordinal=await store.last_ordinal(),
        agents={a: AgentTotals.model_validate(t) for a, t in expected.items()},
    )
    assert body == bytes(json_response(model).body)
