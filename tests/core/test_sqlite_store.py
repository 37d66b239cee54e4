"""SQLite stores: both conformance suites, plus SQLite specifics (WAL, restart, corruption,
failure mapping, shared file, off-loop concurrency)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from prospero.core.errors import SeqConflict, StoreError
from prospero.core.store import sqlite as sqlite_mod
from prospero.core.store.base import ConfigStore, EventStore
from prospero.core.store.sqlite import SqliteConfigStore, SqliteEventStore
from prospero.types.events import Output
from prospero.types.model import AgentStatus, RegisteredWorkspace
from tests.conformance.eventstore import (
    DAY1,
    DAY2,
    ConfigStoreConformance,
    ConfigStoreFactory,
    EventStoreConformance,
    StoreFactory,
    ev,
    finished,
    status,
    ts,
)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "events.db"


class TestSqliteEventStore(EventStoreConformance):
    @pytest.fixture
    async def store_factory(self, db_path: Path) -> AsyncIterator[StoreFactory]:
        opened: list[SqliteEventStore] = []

        async def make() -> EventStore:
            s = SqliteEventStore(db_path)
            await s.open()
            opened.append(s)
            return s

        yield make
        for s in opened:
            await s.close()


class TestSqliteConfigStore(ConfigStoreConformance):
    @pytest.fixture
    async def config_store_factory(self, db_path: Path) -> AsyncIterator[ConfigStoreFactory]:
        opened: list[SqliteConfigStore] = []

        async def make() -> ConfigStore:
            s = SqliteConfigStore(db_path)
            await s.open()
            opened.append(s)
            return s

        yield make
        for s in opened:
            await s.close()


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SqliteEventStore]:
    s = SqliteEventStore(db_path)
    await s.open()
    yield s
    await s.close()


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


async def test_wal_mode_and_schema(store: SqliteEventStore, db_path: Path) -> None:
    conn = raw(db_path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"events", "usage_daily", "cursors", "workspaces", "stream_heads"} <= tables
        cols = [r[1] for r in conn.execute("PRAGMA table_info(events)")]
        assert cols == [
            "ordinal",
            "stream_key",
            "seq",
            "ts",
            "repo",
            "agent_id",
            "kind_tag",
            "kind",
        ]
    finally:
        conn.close()


async def test_stored_row_layout(store: SqliteEventStore, db_path: Path) -> None:
    await store.append_batch([ev("a", 1, status(AgentStatus.done))])
    conn = raw(db_path)
    try:
        row = conn.execute(
            "SELECT stream_key, seq, repo, agent_id, kind_tag, kind FROM events"
        ).fetchone()
    finally:
        conn.close()
    assert row[:5] == ("a", 1, "ws", "a", "status_changed")
    assert row[5] == '{"kind":"status_changed","from":"running","to":"done"}'


async def test_restart_keeps_everything(db_path: Path) -> None:
    s1 = SqliteEventStore(db_path)
    await s1.open()
    o1 = await s1.append_batch(
        [ev("a", i, at=ts(DAY1)) for i in range(1, 501)]
        + [ev("b", 1, finished(turns=3, cost=0.5), at=ts(DAY2))]
    )
    await s1.close()
    await s1.close()  # idempotent
    s2 = SqliteEventStore(db_path)
    await s2.open()
    try:
        assert await s2.high_water("a") == 500
        assert await s2.last_ordinal() == o1[-1]
        [row] = await s2.usage(DAY2, DAY2)
        assert row.turns == 3 and row.runs == 1 and row.cost_usd == 0.5
        o2 = await s2.append_batch(
            [
                ev("a", 501),
                ev("b", 1, finished(turns=1, cost=0.25), at=ts(DAY2)).model_copy(update={"seq": 2}),
            ]
        )
        assert o2[0] == o1[-1] + 1
        [row] = await s2.usage(DAY2, DAY2)
        assert row.turns == 4 and row.runs == 2 and row.cost_usd == 0.75
    finally:
        await s2.close()


async def test_not_open_raises_store_error(db_path: Path) -> None:
    s = SqliteEventStore(db_path)
    with pytest.raises(StoreError):
        await s.append_batch([ev("a", 1)])
    with pytest.raises(StoreError):
        await s.replay("a")
    assert await s.writable() is False
    await s.open()
    await s.close()
    with pytest.raises(StoreError):
        await s.high_water("a")


async def test_unwritable_store(store: SqliteEventStore) -> None:
    # Simulate a store that can no longer write (e.g. read-only volume) on the writer connection.
    await store._w().run(lambda c: c.execute("PRAGMA query_only = ON"))
    assert await store.writable() is False
    with pytest.raises(StoreError) as info:
        await store.append_batch([ev("a", 1)])
    assert not isinstance(info.value, SeqConflict)
    await store._w().run(lambda c: c.execute("PRAGMA query_only = OFF"))
    assert await store.writable() is True
    assert await store.append_batch([ev("a", 1)]) == [1]


async def test_unreadable_row_is_skipped(store: SqliteEventStore, db_path: Path) -> None:
    await store.append_batch([ev("a", 1), ev("a", 2), ev("a", 3)])
    conn = raw(db_path)
    try:
        conn.execute('UPDATE events SET kind = \'{"kind":"from_the_future"}\' WHERE seq = 2')
    finally:
        conn.close()
    assert [e.seq for e in await store.replay("a")] == [1, 3]
    assert [s.event.seq for s in await store.replay_fleet()] == [1, 3]


async def test_newer_schema_is_refused(db_path: Path) -> None:
    conn = raw(db_path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    s = SqliteEventStore(db_path)
    with pytest.raises(StoreError, match="newer"):
        await s.open()


async def test_prune_in_chunks(store: SqliteEventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_mod, "PRUNE_CHUNK", 100)
    await store.append_batch([ev(f"s{i % 3}", i // 3 + 1, at=ts(DAY1)) for i in range(1050)])
    await store.append_batch([ev("s0", 1000, at=ts(DAY2))])
    assert await store.prune(ts(DAY2, "00:00:00.000000")) == 1050
    assert [e.seq for e in await store.replay("s0")] == [1000]


async def test_event_and_config_store_share_one_file(db_path: Path) -> None:
    es = SqliteEventStore(db_path)
    cs = SqliteConfigStore(db_path)
    await es.open()
    try:
        # The config store opens lazily on first use.
        await cs.upsert_workspace(RegisteredWorkspace(name="w", root="/w"))
        await es.append_batch([ev("a", 1)])
        assert [w.name for w in await cs.list_workspaces()] == ["w"]
        assert await es.high_water("a") == 1
    finally:
        await cs.close()
        await es.close()


async def test_reads_run_while_writes_are_in_flight(store: SqliteEventStore) -> None:
    """Blocking sqlite work is off the loop: a reader and the loop stay live during appends."""
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    async def writer() -> None:
        for b in range(20):
            await store.append_batch([ev("w", b * 500 + i + 1) for i in range(500)])

    async def reader() -> int:
        n = 0
        while not stop.is_set():
            await store.high_water("w")
            n += 1
        return n

    t = asyncio.create_task(ticker())
    r = asyncio.create_task(reader())
    await writer()
    stop.set()
    reads = await r
    await t
    assert reads > 1 and ticks > 1
    assert await store.high_water("w") == 10_000


async def test_two_handles_conflict_across_connections(db_path: Path) -> None:
    a, b = SqliteEventStore(db_path), SqliteEventStore(db_path)
    await a.open()
    await b.open()
    try:
        await a.append_batch([ev("x", 1)])
        with pytest.raises(SeqConflict):
            await b.append_batch([ev("x", 1), ev("y", 1)])
        assert await b.high_water("x") == 1 and await b.high_water("y") == 0
        await b.append_batch([ev("x", 2, Output(chunk="b"))])
        assert [e.seq for e in await a.replay("x")] == [1, 2]
    finally:
        await a.close()
        await b.close()
