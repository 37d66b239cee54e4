"""Ingest on PostgreSQL against a raw COPY of the same rows, measured in the same run. Not a test.

    uv run python bench/pg_ingest.py [--events 50000] [--batch 500] [--streams 50] [--reps 3]
                                     [--dsn postgresql://...]

Starts a throwaway PostgreSQL server (`prospero.testkit.postgres`, Debian's binaries, fsync off
like every test cluster: the figures compare code paths, not disks) unless `--dsn` names one
(each repetition then creates and drops its own databases there). Each repetition, on fresh
databases:

- `store`: `PostgresEventStore.append_batch` of pre-built events, `--batch` at a time (one
  transaction each: ordinals from the fleet counter, usage folded, rows encoded by `rows.py`);
- `emitter`: the same events through the `Emitter` (seq assignment, group commit, publish to an
  in-process bus with one all-streams subscriber), i.e. what a live prosperod does;
- ceiling: the same rows, already encoded, written with asyncpg's binary COPY
  (`copy_records_to_table`) into a table of the same shape and the same unique (stream_key, seq)
  constraint, one transaction per batch: what PostgreSQL itself takes, with no Prospero code.

Prints each in events/s (median [min-max] of `--reps`) and the ratios to the ceiling's median;
last line `pg_ingest store=<ratio> emitter=<ratio> target=0.5`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import asyncpg

from prospero.core.bus import InProcessBus
from prospero.core.emitter import Emitter
from prospero.core.metrics import Metrics
from prospero.core.store.postgres.events import PostgresEventStore
from prospero.core.store.rows import encode_batch
from prospero.testkit.postgres import PgServer
from prospero.types.events import (
    AgentFinished,
    EventKind,
    FleetEvent,
    Output,
    ToolStarted,
    TurnFinished,
    Usage,
    now_ts,
)

RAW_TABLE = """
CREATE TABLE events_raw (
    ordinal    bigint PRIMARY KEY,
    stream_key text COLLATE "C" NOT NULL,
    seq        bigint NOT NULL,
    ts         text COLLATE "C" NOT NULL,
    repo       text COLLATE "C" NOT NULL,
    agent_id   text COLLATE "C" NOT NULL,
    kind_tag   text COLLATE "C" NOT NULL,
    kind       text NOT NULL,
    UNIQUE (stream_key, seq)
);
CREATE INDEX events_raw_ts ON events_raw (ts);
"""
RAW_COLUMNS = ["ordinal", "stream_key", "seq", "ts", "repo", "agent_id", "kind_tag", "kind"]


def kind_for(i: int) -> EventKind:
    r = i % 50
    if r == 0:
        return ToolStarted(id=f"t{i}", name="bash", input={"cmd": "ls -la", "cwd": "/w"})
    if r == 1:
        return TurnFinished(usage=Usage(input_tokens=1000, output_tokens=200), cost_usd=0.01)
    if r == 2 and i % 1000 == 2:
        return AgentFinished(outcome="EndOfTurn", turns=3, cost_usd=0.01)
    return Output(chunk=f"line {i}: some typical agent output text, about eighty bytes long.\n")


def build(n: int, streams: int) -> list[FleetEvent]:
    seqs: dict[str, int] = {}
    out = []
    ts = now_ts()
    for i in range(n):
        agent = f"agent-{i % streams}"
        seq = seqs.get(agent, 0) + 1
        seqs[agent] = seq
        out.append(FleetEvent(seq=seq, ts=ts, repo="ws", agent_id=agent, kind=kind_for(i)))
    return out


def batches(events: list[FleetEvent], size: int) -> list[list[FleetEvent]]:
    return [events[i : i + size] for i in range(0, len(events), size)]


class Databases:
    def __init__(self, admin_dsn: str) -> None:
        self.admin_dsn = admin_dsn
        self.made: list[str] = []

    def dsn_for(self, name: str) -> str:
        return self.admin_dsn.rsplit("/", 1)[0] + "/" + name

    async def create(self) -> str:
        name = f"bench_{uuid.uuid4().hex[:10]}"
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        finally:
            await conn.close()
        self.made.append(name)
        return self.dsn_for(name)

    async def drop_all(self) -> None:
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            for name in self.made:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


async def run_store(dsn: str, parts: list[list[FleetEvent]]) -> float:
    store = PostgresEventStore(dsn)
    await store.open()
    try:
        t = time.perf_counter()
        for part in parts:
            await store.append_batch(list(part))
        return time.perf_counter() - t
    finally:
        await store.close()


async def run_emitter(dsn: str, parts: list[list[FleetEvent]]) -> float:
    store = PostgresEventStore(dsn)
    await store.open()
    bus = InProcessBus(buffer=1 << 20)
    sub = bus.subscribe()
    emitter = Emitter(store, bus, Metrics())
    await emitter.start()
    try:
        t = time.perf_counter()
        for part in parts:
            by_agent: dict[str, list[EventKind]] = {}
            for ev in part:
                by_agent.setdefault(ev.agent_id, []).append(ev.kind)
            for agent, kinds in by_agent.items():
                await emitter.emit_many("ws", agent, kinds)
        await emitter.flush()
        return time.perf_counter() - t
    finally:
        await emitter.close()
        sub.close()
        await store.close()


async def run_ceiling(dsn: str, parts: list[list[FleetEvent]]) -> float:
    encoded = []
    ordinal = 0
    for part in parts:
        rows, _usage = encode_batch(part)
        records = []
        for row in rows:
            ordinal += 1
            records.append((ordinal, *row))
        encoded.append(records)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(RAW_TABLE)
        t = time.perf_counter()
        for records in encoded:
            async with conn.transaction():
                await conn.copy_records_to_table("events_raw", records=records, columns=RAW_COLUMNS)
        return time.perf_counter() - t
    finally:
        await conn.close()


def summary(label: str, rates: list[float]) -> float:
    med = statistics.median(rates)
    print(f"  {label:<8} median {med:>10,.0f} ev/s  [{min(rates):,.0f}-{max(rates):,.0f}]")
    return med


async def bench(admin_dsn: str, n: int, batch: int, streams: int, reps: int) -> None:
    events = build(n, streams)
    parts = batches(events, batch)
    dbs = Databases(admin_dsn)
    rates: dict[str, list[float]] = {"store": [], "emitter": [], "ceiling": []}
    try:
        for rep in range(reps):
            # Interleaved, each on a fresh database, so drift hits all three alike.
            for what, fn in (
                ("ceiling", run_ceiling),
                ("store", run_store),
                ("emitter", run_emitter),
            ):
                dt = await fn(await dbs.create(), parts)
                rates[what].append(n / dt)
            print(
                f"  rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:,.0f} ev/s" for k, v in rates.items())
            )
    finally:
        await dbs.drop_all()
    ceiling = summary("ceiling", rates["ceiling"])
    store = summary("store", rates["store"])
    emitter = summary("emitter", rates["emitter"])
    print(f"  ratio store {store / ceiling:.3f}, emitter {emitter / ceiling:.3f}")
    print(f"pg_ingest store={store / ceiling:.3f} emitter={emitter / ceiling:.3f} target=0.5")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--dsn", default=None, help="an existing server's admin DSN (a database to connect to)"
    )
    args = ap.parse_args()
    with open("/proc/loadavg") as f:
        print(f"loadavg at start {f.read().split(' ', 3)[:3]}")
    print(f"{args.events} events, batch {args.batch}, {args.streams} streams, {args.reps} reps")
    if args.dsn:
        asyncio.run(bench(args.dsn, args.events, args.batch, args.streams, args.reps))
        return
    with PgServer() as pg:
        asyncio.run(bench(pg.admin_dsn, args.events, args.batch, args.streams, args.reps))


if __name__ == "__main__":
    main()
