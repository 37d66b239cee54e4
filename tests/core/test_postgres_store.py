"""PostgreSQL event store: the EventStore conformance suite on a real throwaway server, plus
what clustering needs of it (commit-ordered ordinals under concurrent appenders, several handles
on one database, failures mapped to StoreError)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from prospero.core.errors import SeqConflict, StoreError
from prospero.core.store.base import CursorMark, EventStore
from prospero.core.store.postgres.db import PgDb
from prospero.core.store.postgres.events import PostgresEventStore
from prospero.types.events import EventRun, FleetEvent, Output
from tests.conformance.eventstore import (
    DAY1,
    DAY3,
    EventStoreConformance,
    StoreFactory,
    ev,
    ts,
    turn,
)
from tests.support import wait_until


class TestPostgresEventStore(EventStoreConformance):
    @pytest.fixture
    async def store_factory(self, pg_dsn: str) -> AsyncIterator[StoreFactory]:
        opened: list[PostgresEventStore] = []

        async def make() -> EventStore:
            s = PostgresEventStore(pg_dsn)
            await s.open()
            opened.append(s)
            return s

        yield make
        for s in opened:
            await s.close()


@pytest.fixture
async def stores(pg_dsn: str) -> AsyncIterator[list[PostgresEventStore]]:
    """Four handles on one database, each with a pool of its own (four replicas)."""
    handles = [PostgresEventStore(pg_dsn) for _ in range(4)]
    await asyncio.gather(*(h.open() for h in handles))  # concurrent boots: one migration
    yield handles
    for h in handles:
        await h.close()


async def test_fleet_reader_never_skips_an_ordinal(
    stores: list[PostgresEventStore],
) -> None:
    """Issue 12: four replicas append many small batches at once (some taking the transaction
    path with usage and cursors, some failing with SeqConflict); a follower reading
    `replay_fleet_raw(after)` meanwhile sees every ordinal 1..N exactly once, in order, each
    page contiguous with the last, never skipping one it would not come back for."""
    reader_store = stores[0]
    per_writer = 40
    written: list[int] = []
    done = asyncio.Event()

    async def writer(w: int, store: PostgresEventStore) -> None:
        seq = 0
        for i in range(per_writer):
            if i % 9 == 4 and seq:  # a duplicate of a stored seq: rolled back, no hole
                with pytest.raises(SeqConflict):
                    await store.append_batch([ev(f"w{w}", seq + 1), ev(f"w{w}", seq)])
                continue
            size = 1 + (i + w) % 3
            batch = [
                ev(f"w{w}", seq + k + 1, turn(cost=0.5) if (i + k) % 4 == 0 else None)
                for k in range(size)
            ]
            cursors = {f"w{w}": b"%d" % i} if i % 2 else None
            ords = await store.append_batch(batch, cursors=cursors)
            assert len(ords) == size and ords == list(range(ords[0], ords[0] + size))
            written.extend(ords)
            seq += size

    async def follow() -> list[int]:
        seen: list[int] = []
        after = 0
        while True:
            finished = done.is_set()  # read before the page: a page after it is complete
            page = await reader_store.replay_fleet_raw(after, limit=7)
            got = [r.cursor for r in page]
            assert got == list(range(after + 1, after + 1 + len(got))), (after, got)
            seen += got
            if got:
                after = got[-1]
            elif finished:
                return seen
            else:
                await asyncio.sleep(0)  # yield to the writers (no fixed wait)

    async def writers() -> None:
        try:
            await asyncio.gather(*(writer(w, s) for w, s in enumerate(stores)))
        finally:
            done.set()

    seen, _ = await asyncio.gather(follow(), writers())
    n = len(written)
    assert n > 4 * per_writer
    assert sorted(written) == list(range(1, n + 1))
    assert seen == list(range(1, n + 1))
    assert await reader_store.last_ordinal() == n


async def test_ordinal_order_is_commit_order(pg_dsn: str) -> None:
    """An append that took its ordinals but has not committed holds the counter: a second
    appender waits for it (taking the next ordinals), and no reader sees a later ordinal
    before the earlier one is committed."""
    store = PostgresEventStore(pg_dsn)
    await store.open()
    other = await asyncpg.connect(pg_dsn)
    try:
        await store.append_batch([ev("a", 1)])
        tx = other.transaction()
        await tx.start()
        # What an append does, held open: ordinal 2 taken, not committed.
        last = await other.fetchval("UPDATE fleet_head SET last = last + 1 RETURNING last")
        assert last == 2
        await other.execute(
            "INSERT INTO events (ordinal, stream_key, seq, ts, repo, agent_id, kind_tag, kind) "
            "VALUES (2, 'x', 1, $1, 'ws', 'x', 'output', "
            """'{"kind":"output","stream":"stdout","chunk":"held"}')""",
            ts(DAY1),
        )
        pending = asyncio.ensure_future(store.append_batch([ev("b", 1)]))

        async def blocked() -> bool:
            waiting = await other.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE '%fleet_head%'"
            )
            return bool(waiting)

        await wait_until(blocked, what="the second append waits for the counter")
        assert not pending.done()
        assert [r.cursor for r in await store.replay_fleet_raw()] == [1]
        assert await store.last_ordinal() == 1
        await tx.commit()
        assert await pending == [3]
        fleet = await store.replay_fleet()
        assert [(s.ordinal, s.event.agent_id) for s in fleet] == [(1, "a"), (2, "x"), (3, "b")]
    finally:
        await other.close()
        await store.close()


async def test_entries_runs_and_cursor_marks(pg_dsn: str) -> None:
    """What the emitter hands over: events, `EventRun`s (compact kinds, outputs as pairs) and
    `CursorMark`s, the marks written in the same transaction (the last mark of a key wins,
    `cursors=` after every mark)."""
    store = PostgresEventStore(pg_dsn)
    await store.open()
    try:
        run = EventRun("ws", "a", ts(DAY1), 2, [("stdout", "x"), turn(cost=1.5), ("thinking", "y")])
        entries = [
            ev("a", 1),
            CursorMark("a", b"after 1"),
            run,
            CursorMark("a", b"after 4"),
            CursorMark("b", b"b0"),
        ]
        ords = await store.append_batch(entries, cursors={"b": b"b1"})  # type: ignore[arg-type]
        assert ords == [1, 2, 3, 4]
        assert await store.replay("a") == [ev("a", 1), *run.events()]
        raw = await store.replay_fleet_raw()
        assert [r.data for r in raw] == [(await store.replay_raw("a"))[i].data for i in range(4)]
        assert await store.load_cursor("a") == b"after 4"
        assert await store.load_cursor("b") == b"b1"
        [day] = await store.usage(DAY1, DAY1)
        assert (day.turns, day.cost_usd) == (1, 1.5)
        # A failed batch writes none of its marks.
        with pytest.raises(SeqConflict):
            await store.append_batch([CursorMark("a", b"lost"), ev("a", 4)])  # type: ignore[list-item]
        assert await store.load_cursor("a") == b"after 4"
        # Marks alone.
        assert await store.append_batch([CursorMark("c", b"\x00")]) == []  # type: ignore[list-item]
        assert await store.load_cursor("c") == b"\x00"
    finally:
        await store.close()


async def test_emitter_on_postgres(pg_dsn: str) -> None:
    from prospero.core.bus import InProcessBus
    from prospero.core.emitter import Emitter

    store = PostgresEventStore(pg_dsn)
    await store.open()
    try:
        em = Emitter(store, InProcessBus())
        await em.emit("ws", "a", Output(chunk="one"))
        await em.emit_many("ws", "a", [("stdout", "two"), turn(cost=0.25)], cursor=b"c2")
        await em.close()
        assert [e.seq for e in await store.replay("a")] == [1, 2, 3]
        assert await store.load_cursor("a") == b"c2"
        em2 = Emitter(store, InProcessBus())
        assert (await em2.emit("ws", "a", Output())).seq == 4  # seeded from the store
        await em2.close()
    finally:
        await store.close()


async def test_last_ordinal_never_goes_back_after_prune(pg_dsn: str) -> None:
    """The counter, not max(ordinal): retention deleting the newest rows moves nothing back."""
    store = PostgresEventStore(pg_dsn)
    await store.open()
    try:
        o = await store.append_batch([ev("a", 1), ev("a", 2)])
        assert await store.prune(ts(DAY3)) == 2
        assert await store.last_ordinal() == o[-1]
        assert await store.high_water("a") == 2
        assert await store.append_batch([ev("a", 3)]) == [o[-1] + 1]
    finally:
        await store.close()


async def test_other_failures_are_store_errors(pg_dsn: str) -> None:
    store = PostgresEventStore(pg_dsn)
    with pytest.raises(StoreError):
        await store.last_ordinal()  # not open
    await store.open()
    try:
        await store.append_batch([ev("a", 1)])
        # A value the server refuses (text cannot hold NUL): a StoreError, not a SeqConflict,
        # nothing of the batch written, the store usable after.
        bad = FleetEvent(seq=1, ts=ts(DAY1), repo="ws", agent_id="nul\x00id", kind=Output())
        with pytest.raises(StoreError) as info:
            await store.append_batch([ev("b", 1), bad])
        assert not isinstance(info.value, SeqConflict)
        assert await store.replay("b") == []
        assert await store.append_batch([ev("b", 1)]) == [2]
    finally:
        await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreError) as refused:
        await PostgresEventStore("postgresql://u:s3cret@127.0.0.1:1/none").open()
    assert "s3cret" not in str(refused.value)


async def test_writable_false_on_a_read_only_database(pg_dsn: str) -> None:
    store = PostgresEventStore(pg_dsn)
    await store.open()
    admin = await asyncpg.connect(pg_dsn)
    try:
        assert await store.writable() is True
        await admin.execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only "
            "= on', current_database()); END $$"
        )
        await store.db.pool.expire_connections()
        assert await store.writable() is False
        with pytest.raises(StoreError):
            await store.append_batch([ev("a", 1)])
    finally:
        await admin.execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET default_transaction_read_only',"
            " current_database()); END $$"
        )
        await admin.close()
        await store.close()
    assert await _count(pg_dsn, "cursors") == 0


async def test_shared_db_between_stores(pg_dsn: str) -> None:
    db = PgDb(pg_dsn)
    s1, s2 = PostgresEventStore(db), PostgresEventStore(db)
    await s1.open()
    await s2.open()
    try:
        await s1.append_batch([ev("a", 1)])
        await s1.close()  # the shared pool stays open
        assert [e.seq for e in await s2.replay("a")] == [1]
    finally:
        await s2.close()
        await db.close()


async def _count(dsn: str, table: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM {table}"))
    finally:
        await conn.close()
