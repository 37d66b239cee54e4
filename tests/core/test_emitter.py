"""Emitter: sequencing, group commit, durable-first publish, conflict retry, failure markers."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import orjson
import pytest

from prospero.api.sse import agent_frame
from prospero.core.bus import BusItem, InProcessBus
from prospero.core.drivers.ndjson_state import BASE_SUFFIX
from prospero.core.emitter import Emitter
from prospero.core.errors import StoreError
from prospero.core.fleet.manager import _AgentSink
from prospero.core.metrics import APPEND_FAILURES, EVENTS_APPENDED, Metrics
from prospero.core.store.sqlite.events import SqliteEventStore
from prospero.types.events import (
    FleetEvent,
    Output,
    StorePersistFailed,
    ToolStarted,
    TurnFinished,
)
from tests.conformance.eventstore import ev


class ScriptedStore(SqliteEventStore):
    """A real SQLite store with hooks: fail appends, fail high_water, hold appends, count."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.fail_appends = 0  # fail the next N append_batch calls (-1 = forever)
        self.fail_high_water = 0
        self.gate: asyncio.Event | None = None
        self.batches: list[int] = []
        self.cursor_batches: list[dict[str, bytes]] = []

    async def append_batch(
        self, events: Sequence[FleetEvent], *, cursors: Mapping[str, bytes] | None = None
    ) -> list[int]:
        if self.gate is not None:
            await self.gate.wait()
        self.batches.append(len(events))
        self.cursor_batches.append(dict(cursors or {}))
        if self.fail_appends:
            self.fail_appends -= 1 if self.fail_appends > 0 else 0
            raise StoreError("disk I/O error (scripted)")
        return await super().append_batch(events, cursors=cursors)

    async def high_water(self, stream_key: str) -> int:
        if self.fail_high_water:
            self.fail_high_water -= 1
            raise StoreError("read failed (scripted)")
        return await super().high_water(stream_key)


class RecordingBus(InProcessBus):
    """Checks, at publish time, that the event is already committed (a separate connection)."""

    def __init__(self, db: Path) -> None:
        super().__init__(buffer=100_000)
        self.db = db
        self.items: list[BusItem] = []
        self.not_durable: list[BusItem] = []

    def publish(self, item: BusItem) -> None:
        if item.ordinal is not None:
            conn = sqlite3.connect(self.db)
            try:
                row = conn.execute(
                    "SELECT stream_key, seq FROM events WHERE ordinal = ?", (item.ordinal,)
                ).fetchone()
            finally:
                conn.close()
            if row != (item.event.stream_key, item.event.seq):
                self.not_durable.append(item)
        self.items.append(item)
        super().publish(item)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "events.db"


@pytest.fixture
async def store(db: Path) -> AsyncIterator[ScriptedStore]:
    s = ScriptedStore(db)
    await s.open()
    yield s
    await s.close()


async def test_emit_assigns_per_stream_seq_and_publishes_after_commit(
    store: ScriptedStore, db: Path
) -> None:
    bus = RecordingBus(db)
    metrics = Metrics()
    em = Emitter(store, bus, metrics)
    await em.start()
    out = []
    for i in range(30):
        out.append(await em.emit("ws", f"a{i % 3}", Output(chunk=str(i))))
    out.append(await em.emit("ws", "", Output(chunk="repo level")))
    await em.flush()
    assert [e.seq for e in out if e.agent_id == "a0"] == list(range(1, 11))
    assert out[-1].stream_key == "repo:ws" and out[-1].seq == 1
    assert len(bus.items) == 31 and bus.not_durable == []
    assert [i.event for i in bus.items] == out  # publish order = emit order
    ordinals = [i.ordinal for i in bus.items]
    assert ordinals == sorted(ordinals) and None not in ordinals
    assert metrics.get(EVENTS_APPENDED) == 31
    assert [e.seq for e in await store.replay("a1")] == list(range(1, 11))
    await em.close()


async def test_group_commit_batches_up_to_max_batch(store: ScriptedStore) -> None:
    em = Emitter(store, InProcessBus(), max_batch=400)
    for i in range(2000):  # only the 5 seedings suspend: the rest queues while the writer waits
        await em.emit("ws", f"s{i % 5}", Output(chunk=str(i)))
    await em.flush()
    assert sum(store.batches) == 2000
    assert max(store.batches) == 400 and len(store.batches) <= 10
    await em.close()


async def test_seq_seeded_from_store_across_restart(db: Path) -> None:
    s1 = SqliteEventStore(db)
    await s1.open()
    em1 = Emitter(s1, InProcessBus())
    for _ in range(5):
        await em1.emit("ws", "a", Output())
    await em1.close()  # close flushes
    await s1.close()

    s2 = SqliteEventStore(db)
    await s2.open()
    try:
        em2 = Emitter(s2, InProcessBus())
        e = await em2.emit("ws", "a", Output(chunk="after restart"))
        assert e.seq == 6
        assert (await em2.emit("ws", "b", Output())).seq == 1
        await em2.close()
        assert [x.seq for x in await s2.replay("a")] == [1, 2, 3, 4, 5, 6]
    finally:
        await s2.close()


async def test_concurrent_first_emits_seed_once(store: ScriptedStore) -> None:
    await store.append_batch([ev("a", i) for i in range(1, 4)])
    em = Emitter(store, InProcessBus())
    got = await asyncio.gather(*(em.emit("ws", "a", Output(chunk=str(i))) for i in range(50)))
    assert sorted(e.seq for e in got) == list(range(4, 54))
    await em.close()
    assert [e.seq for e in await store.replay("a")] == list(range(1, 54))


async def test_two_emitters_on_one_db_resolve_conflicts(db: Path) -> None:
    s1, s2 = SqliteEventStore(db), SqliteEventStore(db)
    await s1.open()
    await s2.open()
    bus = InProcessBus(buffer=10_000)
    sub = bus.subscribe("shared")
    m1, m2 = Metrics(), Metrics()
    e1, e2 = Emitter(s1, bus, m1, max_batch=16), Emitter(s2, bus, m2, max_batch=16)

    async def produce(em: Emitter, tag: str) -> None:
        for i in range(300):
            await em.emit("ws", "shared", Output(chunk=f"{tag}{i}"))
            if i % 7 == 0:
                await asyncio.sleep(0)

    try:
        await asyncio.gather(produce(e1, "x"), produce(e2, "y"))
        await e1.flush()
        await e2.flush()
        stored = await s1.replay("shared")
        assert [e.seq for e in stored] == list(range(1, 601))  # unique and gap-free
        chunks = [e.kind.chunk for e in stored if isinstance(e.kind, Output)]
        assert sorted(chunks) == sorted(
            [f"x{i}" for i in range(300)] + [f"y{i}" for i in range(300)]
        )
        # Each emitter's own events keep their emit order.
        assert [c for c in chunks if c[0] == "x"] == [f"x{i}" for i in range(300)]
        assert [c for c in chunks if c[0] == "y"] == [f"y{i}" for i in range(300)]
        assert m1.get(APPEND_FAILURES) == 0 and m2.get(APPEND_FAILURES) == 0
        assert m1.get(EVENTS_APPENDED) + m2.get(EVENTS_APPENDED) == 600
        # Every published item carries the stored seq.
        published = []
        while sub.pending():
            it = await sub.__anext__()
            assert isinstance(it, BusItem)
            published.append((it.event.seq, it.ordinal))
        assert sorted(s for s, _ in published) == list(range(1, 601))
    finally:
        await e1.close()
        await e2.close()
        await s1.close()
        await s2.close()


async def test_store_failure_publishes_anyway_with_a_marker(store: ScriptedStore) -> None:
    bus = InProcessBus()
    sub = bus.subscribe("a")
    metrics = Metrics()
    em = Emitter(store, bus, metrics)
    await em.emit("ws", "a", Output(chunk="ok"))
    await em.flush()
    store.fail_appends = 1
    await em.emit("ws", "a", Output(chunk="lost-1"))
    await em.emit("ws", "a", Output(chunk="lost-2"))
    await em.flush()
    await em.flush()  # the marker queued by the failure is committed by the next round
    got = []
    while sub.pending():
        it = await sub.__anext__()
        assert isinstance(it, BusItem)
        got.append(it)
    assert [(i.event.seq, i.ordinal is None) for i in got] == [
        (1, False),
        (2, True),
        (3, True),
        (4, False),
    ]
    marker = got[-1].event.kind
    assert isinstance(marker, StorePersistFailed)
    assert (
        marker.lost_seq == 2 and "disk I/O error" in marker.detail and "2 event(s)" in marker.detail
    )
    assert metrics.get(APPEND_FAILURES) == 2
    # The store has the loss marker where the events are missing.
    stored = await store.replay("a")
    assert [e.seq for e in stored] == [1, 4]
    assert isinstance(stored[1].kind, StorePersistFailed)
    await em.close()


async def test_persistent_failure_does_not_cascade_markers(store: ScriptedStore) -> None:
    bus = InProcessBus()
    sub = bus.subscribe(None)
    metrics = Metrics()
    em = Emitter(store, bus, metrics)
    store.fail_appends = -1
    await em.emit("ws", "a", Output(chunk="x"))
    await em.emit("ws", "b", Output(chunk="y"))
    await em.flush()
    while em.pending:
        await em.flush()
    kinds = []
    while sub.pending():
        it = await sub.__anext__()
        assert isinstance(it, BusItem) and it.ordinal is None
        kinds.append((it.event.stream_key, it.event.seq, it.event.kind.kind))
    assert sorted(kinds) == [
        ("a", 1, "output"),
        ("a", 2, "store_persist_failed"),
        ("b", 1, "output"),
        ("b", 2, "store_persist_failed"),
    ]
    assert metrics.get(APPEND_FAILURES) == 4
    # The store heals: the next events are persisted with seqs after the markers.
    store.fail_appends = 0
    e = await em.emit("ws", "a", Output(chunk="back"))
    await em.flush()
    assert e.seq == 3
    assert [x.seq for x in await store.replay("a")] == [3]
    await em.close()


async def test_unreadable_high_water_is_healed_by_conflict_reseed(store: ScriptedStore) -> None:
    await store.append_batch([ev("a", i) for i in range(1, 11)])
    bus = InProcessBus()
    sub = bus.subscribe("a")
    metrics = Metrics()
    em = Emitter(store, bus, metrics)
    store.fail_high_water = 1
    first = await em.emit("ws", "a", Output(chunk="provisional"))
    assert first.seq == 1  # could not read the high water
    second = await em.emit("ws", "a", Output(chunk="next"))
    await em.flush()
    assert second.seq == 2
    stored = await store.replay("a", from_seq=11)
    assert [(e.seq, e.kind.chunk) for e in stored if isinstance(e.kind, Output)] == [
        (11, "provisional"),
        (12, "next"),
    ]
    items = []
    while sub.pending():
        it = await sub.__anext__()
        assert isinstance(it, BusItem)
        items.append(it.event.seq)
    assert items == [11, 12]  # published with the stored seqs
    assert (await em.emit("ws", "a", Output())).seq == 13
    assert metrics.get(APPEND_FAILURES) == 0
    await em.close()


async def test_backpressure_when_the_store_is_slow(store: ScriptedStore) -> None:
    store.gate = asyncio.Event()
    em = Emitter(store, InProcessBus(), max_batch=2, max_pending=4)
    for i in range(4):
        await em.emit("ws", "a", Output(chunk=str(i)))
    blocked = asyncio.create_task(em.emit("ws", "a", Output(chunk="blocked")))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not blocked.done()
    store.gate.set()
    e = await asyncio.wait_for(blocked, 10)
    await em.flush()
    assert [x.seq for x in await store.replay("a")] == [1, 2, 3, 4, 5]
    assert e.seq == 5
    await em.close()


async def test_flush_and_close_semantics(store: ScriptedStore) -> None:
    em = Emitter(store, InProcessBus())
    await em.flush()  # nothing emitted: returns at once
    await em.emit("ws", "a", Output())
    assert em.pending == 1
    await em.close()
    assert em.pending == 0
    assert await store.high_water("a") == 1
    with pytest.raises(StoreError):
        await em.emit("ws", "a", Output())
    await em.close()  # idempotent


# -- cursors committed with their events (issue 9) ------------------------------------------


class SnapshotBus(InProcessBus):
    """At every publish, reads (in one read transaction of its own connection) the stream's
    stored high water and cursor: whatever is committed must always agree."""

    def __init__(self, db: Path, key: str) -> None:
        super().__init__(buffer=100_000)
        self.db, self.key = db, key
        self.snapshots: list[tuple[int, bytes | None]] = []

    def publish(self, item: BusItem) -> None:
        conn = sqlite3.connect(self.db, isolation_level=None)
        try:
            conn.execute("BEGIN")
            hw = conn.execute(
                "SELECT coalesce(max(seq), 0) FROM events WHERE stream_key = ?", (self.key,)
            ).fetchone()[0]
            row = conn.execute("SELECT data FROM cursors WHERE key = ?", (self.key,)).fetchone()
            conn.execute("COMMIT")
        finally:
            conn.close()
        self.snapshots.append((hw, None if row is None else bytes(row[0])))
        super().publish(item)


def covered(n: int) -> bytes:
    return f"after {n}".encode()


@pytest.mark.parametrize("fast", [True, False], ids=["submit-path", "writer-task"])
async def test_cursor_commits_in_the_transaction_of_its_events(db: Path, fast: bool) -> None:
    store = SqliteEventStore(db) if fast else ScriptedStore(db)
    await store.open()
    bus = SnapshotBus(db, "a")
    em = Emitter(store, bus, max_batch=7)
    try:
        assert (store.batch_submitter() is not None) is fast
        n = 0
        for i in range(40):
            kinds = [Output(chunk=f"{i}.{j}") for j in range(i % 5)]  # 0 to 4 events
            n += len(kinds)
            await em.emit_many("ws", "a", kinds, covered(n))
            if i % 9 == 0:
                await asyncio.sleep(0)
        await em.flush()
        assert await store.load_cursor("a") == covered(n)
        assert await store.high_water("a") == n
        assert em.pending == 0
        # Every committed state seen at publish time: the cursor covers exactly what is stored.
        assert bus.snapshots and all(c == covered(hw) for hw, c in bus.snapshots)
    finally:
        await em.close()
        await store.close()


async def test_a_run_carrying_a_cursor_is_never_split(store: ScriptedStore) -> None:
    em = Emitter(store, InProcessBus(), max_batch=4)
    await em.emit_many("ws", "a", [Output(chunk=str(i)) for i in range(10)], b"ten")
    await em.flush()
    await em.emit_many("ws", "b", [Output(chunk=str(i)) for i in range(10)])
    await em.flush()
    await em.close()
    assert store.batches[0] == 10 and store.cursor_batches[0] == {"a": b"ten"}
    assert store.batches[1:] == [4, 4, 2]  # without a cursor the run is split as before
    assert await store.load_cursor("a") == b"ten"


async def test_failed_append_writes_no_cursor(store: ScriptedStore) -> None:
    bus = InProcessBus()
    sub = bus.subscribe("a")
    em = Emitter(store, bus)
    await em.emit_many("ws", "a", [Output(chunk="x")], b"c1")
    await em.flush()
    store.fail_appends = 1
    await em.emit_many("ws", "a", [Output(chunk="lost")], b"c2")
    await em.flush()
    await em.flush()  # the loss marker
    assert await store.load_cursor("a") == b"c1"  # a restart re-reads what c2 covered
    assert [e.kind.kind for e in await store.replay("a")] == ["output", "store_persist_failed"]
    # A cursor queued alone after the failure still commits, in order.
    await em.emit_many("ws", "a", [], b"c3")
    await em.flush()
    assert await store.load_cursor("a") == b"c3"
    seen = []
    while sub.pending():
        it = await sub.__anext__()
        assert isinstance(it, BusItem)
        seen.append(it.event.seq)
    assert seen == [1, 2, 3]  # marks are never published
    await em.close()


async def test_failed_submit_path_append_writes_no_cursor(db: Path) -> None:
    store = SqliteEventStore(db)
    await store.open()
    conn = sqlite3.connect(db)
    conn.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON events "
        'WHEN NEW.kind LIKE \'%"chunk":"refused"%\' '
        "BEGIN SELECT RAISE(ABORT, 'scripted refusal'); END"
    )
    conn.close()
    metrics = Metrics()
    em = Emitter(store, InProcessBus(), metrics, max_conflict_retries=1)
    try:
        assert store.batch_submitter() is not None
        await em.emit_many("ws", "a", [Output(chunk="ok")], b"c1")
        await em.flush()
        await em.emit_many("ws", "a", [Output(chunk="refused")], b"c2")
        await em.flush()
        while em.pending:
            await em.flush()
        assert await store.load_cursor("a") == b"c1"
        assert metrics.get(APPEND_FAILURES) == 1
        assert [e.kind.kind for e in await store.replay("a")] == ["output", "store_persist_failed"]
        await em.emit_many("ws", "a", [Output(chunk="next")], b"c3")
        await em.flush()
        assert await store.load_cursor("a") == b"c3"
    finally:
        await em.close()
        await store.close()


async def test_cursor_alone_commits_in_order(store: ScriptedStore) -> None:
    store.gate = asyncio.Event()  # hold the writer: everything below queues
    em = Emitter(store, InProcessBus())
    await em.emit_many("ws", "a", [], b"c0")
    await em.emit_many("ws", "a", [Output(chunk="x")], b"c1")
    await em.emit_many("ws", "a", [], b"c1+")
    assert em.pending == 4
    flushed = asyncio.create_task(em.flush())
    store.gate.set()
    await flushed
    assert await store.load_cursor("a") == b"c1+"
    assert await store.high_water("a") == 1
    await em.close()


# -- poison events (issue 9) -------------------------------------------------------------------


def nested(depth: int) -> dict[str, object]:
    root: dict[str, object] = {}
    cur = root
    for _ in range(depth):
        nxt: dict[str, object] = {}
        cur["k"] = nxt
        cur = nxt
    return root


@pytest.mark.parametrize("fast", [True, False], ids=["submit-path", "writer-task"])
async def test_poison_events_never_fail_their_neighbours(db: Path, fast: bool) -> None:
    store = SqliteEventStore(db) if fast else ScriptedStore(db)
    await store.open()
    bus = RecordingBus(db)
    metrics = Metrics()
    em = Emitter(store, bus, metrics)
    try:
        kinds = [
            Output(chunk="before"),
            ToolStarted(id="t1", name="Write", input=nested(500)),
            ("stdout", "after"),
            TurnFinished(turn=0, stop_reason="EndOfTurn", cost_usd=0.5),
        ]
        await em.emit_many("ws", "a", kinds, b"c")  # type: ignore[arg-type]
        await em.emit_many("ws", "a", [("stdout", "lone \ud800 surrogate")])
        await em.emit("ws", "a", Output(chunk="single \udc00"))
        await em.flush()
        assert metrics.get(APPEND_FAILURES) == 0
        stored = await store.replay("a")
        assert [e.seq for e in stored] == [1, 2, 3, 4, 5, 6]
        assert [e.kind.kind for e in stored] == [
            "output",
            "tool_started",
            "output",
            "turn_finished",
            "output",
            "output",
        ]
        assert stored[0].kind == Output(chunk="before")
        assert stored[2].kind == Output(chunk="after")
        tool = stored[1].kind
        assert isinstance(tool, ToolStarted) and tool.input["_reduced"] is True
        assert stored[4].kind == Output(chunk="lone \\ud800 surrogate")
        assert stored[5].kind == Output(chunk="single \\udc00")
        assert await store.load_cursor("a") == b"c"
        # Published = stored, each committed first, and every surface can encode them.
        assert bus.not_durable == []
        assert [i.event for i in bus.items] == stored
        for item in bus.items:
            sse = agent_frame(item.event)
            assert sse is not None
            assert orjson.loads(orjson.dumps(item.event.to_json()))["seq"] == item.event.seq
        [row] = await store.usage(stored[3].ts[:10], stored[3].ts[:10])
        assert row.turns == 1 and row.cost_usd == 0.5
    finally:
        await em.close()
        await store.close()


async def test_poison_events_published_without_a_store_are_encodable(
    store: ScriptedStore,
) -> None:
    bus = InProcessBus()
    sub = bus.subscribe("a")
    em = Emitter(store, bus)
    store.fail_appends = -1
    await em.emit("ws", "a", ToolStarted(id="t", input=nested(300)))
    await em.emit("ws", "a", Output(chunk="x\ud800"))
    await em.flush()
    while em.pending:
        await em.flush()
    items = []
    while sub.pending():
        it = await sub.__anext__()
        assert isinstance(it, BusItem) and it.ordinal is None
        items.append(it.event)
    assert [e.kind.kind for e in items[:2]] == ["tool_started", "output"]
    for e in items:
        assert agent_frame(e) is not None
    assert items[1].kind == Output(chunk="x\\ud800")
    await em.close()


# -- the fleet manager's sink ---------------------------------------------------------------


async def test_agent_sink_commits_the_cursor_with_the_batch(store: ScriptedStore) -> None:
    em = Emitter(store, InProcessBus())
    sink = _AgentSink(em, "ws", "a")
    await sink.emit_batch([("stdout", "x"), Output(chunk="y")], b"c1")
    await sink.emit_batch([], b"c2")
    await em.flush()
    assert [e.seq for e in await store.replay("a")] == [1, 2]
    assert await store.load_cursor("a") == b"c2"
    await em.close()


async def test_a_base_row_commits_with_its_delta_in_one_transaction(db: Path) -> None:
    """The FleetManager's sink hands a driver's base row and delta cursor to the emitter
    together: both are stored with the events they cover, under their own keys."""
    store = SqliteEventStore(db)
    await store.open()
    emitter = Emitter(store, InProcessBus())
    try:
        sink = _AgentSink(emitter, "r", "a1")
        await sink.emit_batch([("stdout", "x")], cursor=b"delta-1", cursor_base=b"base-1")
        await sink.emit_batch([("stdout", "y")], cursor=b"delta-2")
        await emitter.flush()
        assert await store.load_cursor("a1") == b"delta-2"
        assert await store.load_cursor("a1" + BASE_SUFFIX) == b"base-1"
        assert [e.seq for e in await store.replay("a1", 1)] == [1, 2]
    finally:
        await emitter.close()
        await store.close()
