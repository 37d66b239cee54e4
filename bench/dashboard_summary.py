"""Cold `/api/dashboard/summary` totals: kind-filtered store reads vs. folding whole histories.
Not a test.

    uv run python bench/dashboard_summary.py [--agents 200] [--events 2000] [--every 200]

Builds a store of N agents, each with `--events` events of which one in `--every` is a
`turn_finished` (the rest output chunks), then times a cold `TotalsCache.refresh` (what the
first dashboard load after a restart pays) against the baseline it replaced: replaying every
event of every agent and folding it. Both produce the same totals (checked). Last line:
`summary cold_s=<filtered> baseline_s=<full fold> speedup=<baseline/filtered>`.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from prospero.api.routes_dashboard import AgentTotals, TotalsCache, fold
from prospero.core.store.sqlite import SqliteEventStore
from prospero.types.events import EventKind, FleetEvent, Output, TurnFinished, Usage


async def build(store: SqliteEventStore, agents: list[str], events: int, every: int) -> None:
    for a in agents:
        batch: list[FleetEvent] = []
        for seq in range(1, events + 1):
            kind: EventKind
            if seq % every == 0:
                kind = TurnFinished(
                    turn=seq // every - 1,
                    usage=Usage(input_tokens=1000, output_tokens=200),
                    cost_usd=0.01,
                )
            else:
                kind = Output(chunk="x" * 120)
            batch.append(
                FleetEvent(
                    seq=seq, ts="2026-11-30T00:00:00+00:00", repo="ws", agent_id=a, kind=kind
                )
            )
        await store.append_batch(batch)


async def full_fold(
    store: SqliteEventStore, agents: list[str], page: int = 2000
) -> dict[str, AgentTotals]:
    out: dict[str, AgentTotals] = {}
    for a in agents:
        totals = out.setdefault(a, AgentTotals())
        while batch := await store.replay(a, totals.seq + 1, page):
            fold(totals, batch)
    return out


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=200)
    p.add_argument("--events", type=int, default=2000)
    p.add_argument("--every", type=int, default=200)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        store = SqliteEventStore(Path(d) / "events.db")
        await store.open()
        agents = [f"agent-{i:04d}" for i in range(args.agents)]
        await build(store, agents, args.events, args.every)
        # Each way twice, alternating, best of two: both see a warm SQLite page cache.
        baseline = cold = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            base = await full_fold(store, agents)
            baseline = min(baseline, time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = await TotalsCache().refresh(store, agents)
            cold = min(cold, time.perf_counter() - t0)
        await store.close()
    for a in agents:
        b, g = base[a], got[a]
        assert (b.turns, b.input_tokens, b.output_tokens, b.cost_usd, b.seq) == (
            g.turns,
            g.input_tokens,
            g.output_tokens,
            g.cost_usd,
            g.seq,
        ), (a, b, g)
    n = args.agents * args.events
    print(f"{args.agents} agents x {args.events} events ({n:,} stored)")
    print(f"full fold: {baseline:.3f}s; kind-filtered: {cold:.3f}s")
    print(f"summary cold_s={cold:.3f} baseline_s={baseline:.3f} speedup={baseline / cold:.1f}")


if __name__ == "__main__":
    asyncio.run(main())
