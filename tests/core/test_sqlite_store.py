"""SQLite stores: both conformance suites, plus SQLite specifics (WAL, restart, corruption,
failure mapping, shared file, off-loop concurrency)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from prospero.core.errors import SeqConflict, StoreError
from prospero.core.store import reduce
from prospero.core.store.base import ConfigStore, EventStore
from prospero.core.store.sqlite import events as sqlite_mod
from prospero.core.store.sqlite.events import SqliteConfigStore, SqliteEventStore
from prospero.types.events import (
    DecisionPending,
    DecisionToolCall,
    EventRun,
    Output,
    ToolStarted,
    Usage,
)
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
    turn,
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
        + [ev("b", 1, turn(cost=0.5), at=ts(DAY2)), ev("b", 2, finished(turns=1), at=ts(DAY2))],
        cursors={"a": b"a@500"},
    )
    await s1.close()
    await s1.close()  # idempotent
    s2 = SqliteEventStore(db_path)
    await s2.open()
    try:
        assert await s2.high_water("a") == 500
        assert await s2.last_ordinal() == o1[-1]
        assert await s2.load_cursor("a") == b"a@500"
        [row] = await s2.usage(DAY2, DAY2)
        assert row.turns == 1 and row.runs == 1 and row.cost_usd == 0.5
        o2 = await s2.append_batch([ev("a", 501), ev("b", 3, turn(cost=0.25), at=ts(DAY2))])
        assert o2[0] == o1[-1] + 1
        [row] = await s2.usage(DAY2, DAY2)
        assert row.turns == 2 and row.runs == 1 and row.cost_usd == 0.75
    finally:
        await s2.close()


async def _as_version_2_file(db_path: Path, rows: list[tuple[object, ...]]) -> None:
    """Turn the file into what a schema-2 build left: its own usage rows, user_version 2."""
    await _as_old_file(db_path, rows, 2)


async def _as_old_file(db_path: Path, rows: list[tuple[object, ...]], version: int) -> None:
    """A schema-2 or -3 file: usage rows without the budget_exceeded column (version 4)."""
    conn = raw(db_path)
    try:
        conn.execute("ALTER TABLE usage_daily DROP COLUMN budget_exceeded")
        conn.execute("DELETE FROM usage_daily")
        conn.executemany("INSERT INTO usage_daily VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.execute(f"PRAGMA user_version = {version}")
        conn.commit()
    finally:
        conn.close()


async def test_version_2_usage_is_rebuilt_per_turn_at_open(db_path: Path) -> None:
    s1 = SqliteEventStore(db_path)
    await s1.open()
    u = Usage(input_tokens=10, output_tokens=2)
    await s1.append_batch(
        [  # a running agent's two turns (schema 2 counted nothing of them)
            ev("a", 1, turn(cost=0.5, usage=u), at=ts(DAY1)),
            ev("a", 2, turn(cost=0.5, usage=u), at=ts(DAY2)),
            # a run that reported 1 turn at its end, killed after it was done
            ev("b", 1, turn(cost=0.25), at=ts(DAY2)),
            ev("b", 2, finished(turns=1, cost=0.25), at=ts(DAY2)),
            ev("b", 3, status(AgentStatus.done), at=ts(DAY2)),
            ev("b", 4, status(AgentStatus.killed, AgentStatus.done), at=ts(DAY2)),
        ]
    )
    await s1.close()
    # What schema 2 had counted: agent_finished totals, outcomes from terminal statuses.
    await _as_version_2_file(db_path, [("ws", DAY2, None, None, 0.25, 1, 1, 1, 0, 1, 0)])
    s2 = SqliteEventStore(db_path)
    await s2.open()
    try:
        by = {r.day: r for r in await s2.usage(DAY1, DAY2)}
        assert (by[DAY1].turns, by[DAY1].cost_usd, by[DAY1].input_tokens) == (1, 0.5, 10)
        assert by[DAY1].runs == 0
        assert (by[DAY2].turns, by[DAY2].cost_usd, by[DAY2].input_tokens) == (2, 0.75, 10)
        assert by[DAY2].runs == 1
        assert by[DAY2].outcomes == {
            "done": 1,
            "failed": 0,
            "killed": 0,
            "crashed": 0,
            "budget_exceeded": 0,
        }
    finally:
        await s2.close()
    conn = raw(db_path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_mod.SCHEMA_VERSION
    finally:
        conn.close()


async def test_version_3_file_gains_the_budget_outcome_and_keeps_its_rows(
    db_path: Path,
) -> None:
    s1 = SqliteEventStore(db_path)
    await s1.open()
    await s1.append_batch([ev("a", 1, turn(cost=0.5), at=ts(DAY2))])
    await s1.close()
    await _as_old_file(db_path, [("ws", DAY2, 7, 3, 0.5, 1, 1, 0, 1, 0, 0)], 3)
    s2 = SqliteEventStore(db_path)
    await s2.open()
    try:
        [row] = await s2.usage(DAY2, DAY2)  # kept as it was (no rebuild from version 3)
        assert (row.input_tokens, row.cost_usd, row.turns, row.runs) == (7, 0.5, 1, 1)
        assert row.outcomes["failed"] == 1 and row.outcomes["budget_exceeded"] == 0
        await s2.append_batch([ev("a", 2, finished(outcome="budget_exceeded"), at=ts(DAY2))])
        [row] = await s2.usage(DAY2, DAY2)
        assert row.runs == 2 and row.outcomes["budget_exceeded"] == 1
        assert row.outcomes["killed"] == 0  # counted on its own
    finally:
        await s2.close()


async def test_version_2_rebuild_keeps_days_retention_may_have_cut(db_path: Path) -> None:
    s1 = SqliteEventStore(db_path)
    await s1.open()
    await s1.append_batch(
        [
            ev("old", 1, turn(cost=9.0), at=ts(DAY1, "00:00:00.000000")),
            ev("a", 1, turn(cost=0.5), at=ts(DAY1, "12:00:00.000000")),
            ev("a", 2, turn(cost=0.5), at=ts(DAY2)),
        ]
    )
    assert await s1.prune(ts(DAY1, "06:00:00.000000")) == 1  # DAY1 is now partial
    await s1.close()
    await _as_version_2_file(
        db_path,
        [
            ("ws", "2025-12-31", None, None, 4.0, 4, 4, 4, 0, 0, 0),
            ("ws", DAY1, None, None, 9.0, 3, 1, 1, 0, 0, 0),
            ("ws", DAY2, None, None, None, 0, 0, 0, 0, 0, 0),
        ],
    )
    s2 = SqliteEventStore(db_path)
    await s2.open()
    try:
        by = {r.day: r for r in await s2.usage("2025-12-01", DAY2)}
        # Days at or before the oldest stored event keep their rows; later ones are rebuilt.
        assert (by["2025-12-31"].turns, by["2025-12-31"].cost_usd) == (4, 4.0)
        assert (by[DAY1].turns, by[DAY1].cost_usd) == (3, 9.0)
        assert (by[DAY2].turns, by[DAY2].cost_usd) == (1, 0.5)
    finally:
        await s2.close()


async def test_poison_in_a_run_and_via_bound_rows(store: SqliteEventStore) -> None:
    """The reduced form replaces the kind in the run itself (what the emitter publishes),
    on the JSON path and on the bound-parameter path (a NUL in the batch)."""
    run = EventRun("ws", "a", ts(DAY1), 1, [("stdout", "x\ud800"), ("stdout", "nul\x00 ok")])
    fut = store.submit_append([run])
    assert len(await asyncio.wrap_future(fut)) == 2
    assert run.kinds == [("stdout", "x\\ud800"), ("stdout", "nul\x00 ok")]
    back = await store.replay("a")
    assert [e.kind for e in back] == [Output(chunk="x\\ud800"), Output(chunk="nul\x00 ok")]


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
    assert [r.seq for r in await store.replay_raw("a")] == [1, 3]
    assert [r.seq for r in await store.replay_fleet_raw()] == [1, 3]


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


def test_reduced_forms() -> None:
    deep: object = "leaf"
    for _ in range(200):
        deep = [deep]
    ask = DecisionPending(id="d", tool_call=DecisionToolCall(id="t", input={"x": deep}))
    assert reduce.needs_check(ask) and not reduce.free_form_safe(ask)
    small = reduce.reduce_kind(ask)
    assert isinstance(small, DecisionPending) and reduce.free_form_safe(small)
    wrapped = small.tool_call.input
    assert wrapped["_reduced"] is True and set(wrapped) == {"_reduced", "value"}
    small.model_dump_json()
    # Objects JSON has no form for, non-string keys and big ints become strings.
    odd = reduce.reduce_kind(ToolStarted(id="t", input={1: {3, 4}, "n": -(2**80)}))
    assert isinstance(odd, ToolStarted)
    assert odd.input == {"_reduced": True, "value": {"1": "{3, 4}", "n": str(-(2**80))}}
    # What serialises is left alone (the same object).
    fine = ToolStarted(id="t", input={"a": [1, 2.5, None, True, "s"]})
    assert reduce.reduce_kind(fine) is fine and reduce.free_form_safe(fine)
    assert reduce.escape_surrogates("a\ud83d\ude00b\udfff") == "a\\ud83d\\ude00b\\udfff"
