"""Appends on the event loop's thread (`SqliteEventStore.append_now`, `store.sqlite.inline`)
and the emitter's use of them: same rows and errors as the writer thread's path, never a wait
for a held write lock (the batch goes to the writer thread instead, in order), checkpoints
asked of the writer thread."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from prospero.core import emitter_commit
from prospero.core.bus import InProcessBus
from prospero.core.emitter import Emitter
from prospero.core.errors import SeqConflict
from prospero.core.store.base import CursorMark
from prospero.core.store.sqlite import inline as sqlite_inline
from prospero.core.store.sqlite.events import SqliteEventStore
from prospero.types.events import EventRun
from tests.support import CollectingBus, wait_until

TS = "2026-12-01T10:00:00.000000Z"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    s = SqliteEventStore(tmp_path / "events.db")
    await s.open()
    yield s
    await s.close()


def run(agent: str, first: int, n: int, text: str = "x") -> EventRun:
    return EventRun("ws", agent, TS, first, [("stdout", f"{text}{i}") for i in range(n)])


def hold_write_lock(path: str) -> sqlite3.Connection:
    """Another connection holding the database's write lock (as a prune or another process
    would) until it commits."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    return other


async def test_append_now_writes_rows_and_cursors_in_one_transaction(
    store: SqliteEventStore,
) -> None:
    first = store.append_now([run("a", 1, 3), CursorMark("a", b"cur-a"), run("b", 1, 2)])
    assert first is not None and len(first) == 5
    assert first == list(range(first[0], first[0] + 5))  # contiguous, in order
    assert [e.seq for e in await store.replay("a")] == [1, 2, 3]
    assert [e.kind.chunk for e in await store.replay("b")] == ["x0", "x1"]  # type: ignore[union-attr]
    assert await store.load_cursor("a") == b"cur-a"
    # Same ordinals as the writer thread's path would give next.
    nxt = await asyncio.wrap_future(store.submit_append([run("a", 4, 1)]))
    assert nxt == [first[-1] + 1]


async def test_append_now_connection_never_waits_and_never_checkpoints(
    store: SqliteEventStore,
) -> None:
    assert store.append_now([run("a", 1, 1)]) is not None
    inline = store._inline
    assert inline is not None and inline._conn is not None
    assert inline._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 0
    assert inline._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0


async def test_append_now_refuses_a_held_write_lock_and_writes_nothing(
    store: SqliteEventStore,
) -> None:
    other = hold_write_lock(store.path)
    try:
        assert store.append_now([run("a", 1, 2), CursorMark("a", b"c")]) is None
        assert store._inline is not None and store._inline.busy == 1
    finally:
        other.execute("COMMIT")
        other.close()
    assert await store.replay("a") == []
    assert await store.load_cursor("a") is None
    assert store.append_now([run("a", 1, 2)]) is not None  # free again: written


async def test_append_now_seq_conflict_is_atomic(store: SqliteEventStore) -> None:
    assert store.append_now([run("a", 1, 2)]) is not None
    with pytest.raises(SeqConflict):
        store.append_now([run("b", 1, 1), run("a", 2, 1), CursorMark("b", b"c")])
    assert await store.replay("b") == []  # nothing of the failed batch
    assert await store.load_cursor("b") is None


async def test_append_now_asks_the_writer_thread_for_checkpoints(
    store: SqliteEventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_inline, "CHECKPOINT_COMMITS", 4)
    monkeypatch.setattr(sqlite_inline, "CHECKPOINT_SECONDS", 3600.0)  # by count only here
    inline = store._inline
    assert inline is not None
    asked = 0
    request = inline._checkpoint

    def counting() -> None:
        nonlocal asked
        asked += 1
        request()

    inline._checkpoint = counting
    for i in range(8):
        assert store.append_now([run("a", i + 1, 1)]) is not None
    assert asked == 2
    await wait_until(lambda: not store._checkpointing, what="the checkpoint job")
    # Everything in the WAL was checkpointed into the database file by that job.
    probe = sqlite3.connect(store.path, isolation_level=None)
    try:
        busy, log, done = probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    finally:
        probe.close()
    assert busy == 0 and log == done


Recorder = CollectingBus


async def test_emitter_commits_inline_when_the_lock_is_free(store: SqliteEventStore) -> None:
    bus = Recorder()
    em = Emitter(store, bus)
    await em.start()
    for i in range(20):
        await em.emit_many("ws", f"a{i % 4}", [("stdout", f"c{i}")], cursor=f"k{i}".encode())
    await em.flush()
    assert store._inline is not None and store._inline.commits >= 1
    assert len(bus.items) == 20
    ordinals = [it.ordinal for it in bus.items]
    assert None not in ordinals and ordinals == sorted(ordinals)
    assert [it.event.kind.chunk for it in bus.items] == [f"c{i}" for i in range(20)]  # type: ignore[union-attr]
    assert await store.load_cursor("a3") == b"k19"
    await em.close()


async def test_emitter_falls_back_to_the_writer_thread_in_order(
    store: SqliteEventStore,
) -> None:
    bus = Recorder()
    em = Emitter(store, bus)
    await em.start()
    await em.emit_many("ws", "a", [("stdout", "before")])
    await em.flush()
    other = hold_write_lock(store.path)
    try:
        for i in range(10):  # refused inline: handed to the writer thread, which waits
            await em.emit_many("ws", "a" if i % 2 else "b", [("stdout", f"held{i}")])
        await wait_until(
            lambda: store._inline is not None and store._inline.busy >= 1, what="a refusal"
        )
        assert len(bus.items) == 1  # nothing published while the lock is held
    finally:
        other.execute("COMMIT")
        other.close()
    for i in range(10):  # after the lock is released: in order behind the held ones
        await em.emit_many("ws", "a", [("stdout", f"after{i}")])
    await em.flush()
    chunks = [it.event.kind.chunk for it in bus.items]  # type: ignore[union-attr]
    assert chunks == ["before"] + [f"held{i}" for i in range(10)] + [f"after{i}" for i in range(10)]
    ordinals = [it.ordinal for it in bus.items]
    assert None not in ordinals and ordinals == sorted(ordinals)
    stored = [e.kind.chunk for e in await store.replay("a")]  # type: ignore[union-attr]
    assert stored == ["before"] + [f"held{i}" for i in range(1, 10, 2)] + [
        f"after{i}" for i in range(10)
    ]
    await em.close()


async def test_emitter_sends_a_run_too_large_for_a_loop_turn_to_the_thread(
    store: SqliteEventStore,
) -> None:
    bus = Recorder()
    em = Emitter(store, bus)
    await em.start()
    big = [("stdout", f"l{i}") for i in range(emitter_commit._INLINE_MAX + 10)]
    await em.emit_many("ws", "a", big, cursor=b"end")
    await em.flush()
    assert store._inline is not None and store._inline.commits == 0  # it went to the thread
    assert len(bus.items) == len(big)
    assert await store.load_cursor("a") == b"end"
    await em.close()


async def test_emitter_inline_seq_conflict_renumbers_in_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another writer took the stream's next seqs: the inline append fails with SeqConflict,
    the writer task re-seeds and commits everything, renumbered, in emit order."""
    db = tmp_path / "events.db"
    store = SqliteEventStore(db)
    await store.open()
    other = SqliteEventStore(db)
    await other.open()
    bus = Recorder()
    em = Emitter(store, bus)
    await em.prepare(["a"])  # seeded at 1 ...
    rival = Emitter(other, InProcessBus())
    for i in range(3):  # ... then the rival takes 1..3
        await rival.emit_many("ws", "a", [("stdout", f"rival{i}")])
    await rival.close()
    caplog.set_level(logging.INFO, logger="prospero.core.emitter")
    for i in range(5):
        await em.emit_many("ws", "a", [("stdout", f"mine{i}")], cursor=f"k{i}".encode())
    await em.flush()
    assert any("seq conflict" in r.getMessage() for r in caplog.records)  # it did conflict
    stored = await store.replay("a")
    assert [e.seq for e in stored] == list(range(1, 9))
    assert [e.kind.chunk for e in stored] == [  # type: ignore[union-attr]
        *(f"rival{i}" for i in range(3)),
        *(f"mine{i}" for i in range(5)),
    ]
    assert [(it.event.seq, it.event.kind.chunk) for it in bus.items] == [  # type: ignore[union-attr]
        (4 + i, f"mine{i}") for i in range(5)
    ]
    assert await store.load_cursor("a") == b"k4"
    await em.close()
    await other.close()
    await store.close()
