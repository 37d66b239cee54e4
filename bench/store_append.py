"""Measure SqliteEventStore append throughput (events/s). Not a test.

    uv run python bench/store_append.py [--events 100000] [--batch 1000] [--streams 50]

Prints three numbers: raw `append_batch` of pre-built events, the same through the `Emitter`
(emit → group commit → publish to an in-process bus with one all-streams subscriber), and
fleet replay read-back.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from prospero.core.bus import InProcessBus
from prospero.core.emitter import Emitter
from prospero.core.metrics import Metrics
from prospero.core.store.sqlite.events import SqliteEventStore
from prospero.types.events import (
    AgentFinished,
    EventKind,
    FleetEvent,
    Output,
    StatusChanged,
    ToolStarted,
    Usage,
    now_ts,
)
from prospero.types.model import AgentStatus


def kind_for(i: int) -> EventKind:
    r = i % 20
    if r == 0:
        return ToolStarted(id=f"t{i}", name="bash", input={"cmd": "ls -la", "cwd": "/w"})
    if r == 1:
        return StatusChanged(from_=AgentStatus.running, to=AgentStatus.done)
    if r == 2:
        return AgentFinished(
            outcome="EndOfTurn",
            turns=3,
            cost_usd=0.01,
            usage=Usage(input_tokens=1000, output_tokens=200),
        )
    return Output(chunk=f"line {i}: some typical agent output text, about eighty bytes long.\n")


def build(n: int, streams: int, start_seq: dict[str, int]) -> list[FleetEvent]:
    out = []
    for i in range(n):
        agent = f"agent-{i % streams}"
        seq = start_seq.get(agent, 1)
        start_seq[agent] = seq + 1
        out.append(FleetEvent(seq=seq, ts=now_ts(), repo="ws", agent_id=agent, kind=kind_for(i)))
    return out


async def bench_store(path: Path, n: int, batch: int, streams: int) -> None:
    store = SqliteEventStore(path)
    await store.open()
    events = build(n, streams, {})
    t0 = time.perf_counter()
    for i in range(0, n, batch):
        await store.append_batch(events[i : i + batch])
    dt = time.perf_counter() - t0
    print(f"append_batch  : {n} events, batch {batch}: {n / dt:,.0f} events/s ({dt:.2f}s)")
    t0 = time.perf_counter()
    got = 0
    after = 0
    while True:
        page = await store.replay_fleet(after, 5000)
        if not page:
            break
        got += len(page)
        after = page[-1].ordinal
    dt = time.perf_counter() - t0
    print(f"replay_fleet  : {got} events: {got / dt:,.0f} events/s ({dt:.2f}s)")
    await store.close()


async def bench_emitter(path: Path, n: int, batch: int, streams: int) -> None:
    store = SqliteEventStore(path)
    await store.open()
    bus = InProcessBus(buffer=n + 1)
    sub = bus.subscribe(None)
    metrics = Metrics()
    emitter = Emitter(store, bus, metrics, max_batch=batch)
    await emitter.start()
    kinds = [kind_for(i) for i in range(n)]
    t0 = time.perf_counter()
    for i, kind in enumerate(kinds):
        await emitter.emit("ws", f"agent-{i % streams}", kind)
    await emitter.flush()
    dt = time.perf_counter() - t0
    print(
        f"emitter       : {n} events, max_batch {batch}: {n / dt:,.0f} events/s ({dt:.2f}s), "
        f"{sub.pending()} published"
    )
    await emitter.close()
    await store.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--streams", type=int, default=50)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pr-bench-") as d:
        await bench_store(Path(d) / "a.db", a.events, a.batch, a.streams)
        await bench_emitter(Path(d) / "b.db", a.events, a.batch, a.streams)


if __name__ == "__main__":
    asyncio.run(main())
