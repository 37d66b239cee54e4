"""PgBus (core/bus/postgres.py): the NOTIFY doorbell of PostgreSQL appends, new rows read from
the store, delivered to every replica's subscribers in commit order — on a real server, with
two "replicas" (their own stores, emitters and buses) on one database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest

from prospero.core.bus import BusItem, Lagged
from prospero.core.bus.postgres import BUS_LISTEN_RECONNECTS, PgBus
from prospero.core.emitter import Emitter
from prospero.core.metrics import Metrics
from prospero.core.store.postgres.events import PostgresEventStore
from prospero.core.subscription import RawPage, follow_fleet, follow_stream
from prospero.types.events import AgentFinished, Output
from tests.support import wait_until


@dataclass
class Replica:
    store: PostgresEventStore
    bus: PgBus
    emitter: Emitter
    metrics: Metrics


async def replica(dsn: str, *, heal: float = 0.3, buffer: int = 4096) -> Replica:
    store = PostgresEventStore(dsn)
    await store.open()
    metrics = Metrics()
    bus = PgBus(store, dsn, buffer=buffer, metrics=metrics, heal_interval=heal)
    await bus.start()
    emitter = Emitter(store, bus, metrics)
    await emitter.start()
    return Replica(store, bus, emitter, metrics)


@pytest.fixture
async def pair(pg_dsn: str) -> AsyncIterator[tuple[Replica, Replica]]:
    a, b = await replica(pg_dsn), await replica(pg_dsn)
    yield a, b
    for r in (a, b):
        await r.emitter.close()
        await r.bus.close()
        await r.store.close()


async def drain(sub: object, want: int, within: float = 10.0) -> list[BusItem]:
    got: list[BusItem] = []

    async def enough() -> bool:
        try:
            items = await asyncio.wait_for(sub.batch(), 0.05)  # type: ignore[attr-defined]
        except TimeoutError:
            return len(got) >= want
        for it in items:
            assert not isinstance(it, Lagged), it
            got.append(it)
        return len(got) >= want

    await wait_until(enough, within, interval=0.0, what=f"{want} bus items")
    return got


async def test_every_replica_gets_every_event_once_in_commit_order(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    sub_a, sub_b = a.bus.subscribe(), b.bus.subscribe()
    writes = []
    for i in range(30):
        writer = a if i % 3 else b
        writes.append(writer.emitter.emit("ws", f"agent-{i % 4}", Output(chunk=f"c{i}")))
    await asyncio.gather(*writes)
    for r in (a, b):
        await r.emitter.flush()
    got_a, got_b = await drain(sub_a, 30), await drain(sub_b, 30)
    for got in (got_a, got_b):
        assert [it.ordinal for it in got] == list(range(1, 31))  # contiguous, in commit order
        chunks = sorted(it.event.kind.chunk for it in got)  # type: ignore[union-attr]
        assert chunks == sorted(f"c{i}" for i in range(30))
    assert [it.json for it in got_a] == [it.json for it in got_b]
    assert a.bus.wants("agent-0") is False  # the emitter's own publish is not needed


async def test_a_dropped_listen_connection_reconnects_and_catches_up(
    pair: tuple[Replica, Replica], pg_dsn: str
) -> None:
    a, b = pair
    sub = b.bus.subscribe()
    admin = await asyncpg.connect(pg_dsn)
    try:
        # Kill every LISTENing session: b's (and a's) doorbells go silent for a while.
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
        )
        for i in range(10):
            await a.emitter.emit("ws", "agent", Output(chunk=f"while-down-{i}"))
        await a.emitter.flush()
        got = await drain(sub, 10)
        assert [it.event.seq for it in got] == list(range(1, 11))
        await wait_until(
            lambda: b.metrics.get(BUS_LISTEN_RECONNECTS) >= 1,
            10.0,
            what="b listens again",
        )
        await a.emitter.emit("ws", "agent", Output(chunk="after"))
        [after] = await drain(sub, 1)
        assert after.event.seq == 11
    finally:
        await admin.close()


async def test_a_lost_doorbell_heals_from_the_store(pg_dsn: str) -> None:
    r = await replica(pg_dsn, heal=0.2)
    try:
        sub = r.bus.subscribe()
        # An append that rings no bell: rows written by hand in one transaction, exactly as the
        # store writes them (the counter, then the row), but without the NOTIFY.
        conn = await asyncpg.connect(pg_dsn)
        try:
            async with conn.transaction():
                last = await conn.fetchval("UPDATE fleet_head SET last = last + 1 RETURNING last")
                await conn.execute(
                    "INSERT INTO events (ordinal, stream_key, seq, ts, repo, agent_id, kind_tag, "
                    "kind) VALUES ($1, 'x', 1, '2026-12-01T00:00:00.000000+00:00', 'ws', 'x', "
                    '\'output\', \'{"kind":"output","stream":"stdout","chunk":"quiet"}\')',
                    last,
                )
        finally:
            await conn.close()
        [item] = await drain(sub, 1)
        assert item.ordinal == 1 and item.event.kind == Output(chunk="quiet")
    finally:
        await r.emitter.close()
        await r.bus.close()
        await r.store.close()


async def test_followers_on_another_replica_join_history_and_live_without_gap_or_duplicate(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    for i in range(25):
        await a.emitter.emit("ws", "agent", Output(chunk=f"h{i}"))
    await a.emitter.flush()
    stream = follow_stream(b.store, b.bus, "agent", 0, page=10)
    fleet = follow_fleet(b.store, b.bus, 0, page=10)
    seqs: list[int] = []
    ordinals: list[int] = []

    async def read_stream() -> None:
        async for item in stream:
            if isinstance(item, RawPage):
                seqs.extend(e.seq for e in item.events)
                if item.events[-1].kind == "agent_finished":
                    return

    async def read_fleet() -> None:
        async for item in fleet:
            if isinstance(item, RawPage):
                ordinals.extend(e.cursor for e in item.events)
                if len(ordinals) >= 51:
                    return

    readers = asyncio.gather(read_stream(), read_fleet())
    for i in range(25):  # live, while the followers page through the history
        await a.emitter.emit("ws", "agent", Output(chunk=f"l{i}"))
    await a.emitter.emit("ws", "agent", AgentFinished(outcome="EndOfTurn", turns=1))
    await a.emitter.flush()
    await asyncio.wait_for(readers, 15)
    assert seqs == list(range(1, 52))
    assert ordinals == list(range(1, 52))
    await stream.aclose()
    await fleet.aclose()
