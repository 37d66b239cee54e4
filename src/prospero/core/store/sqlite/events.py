"""SQLite implementations of the EventStore and ConfigStore seams (prospero-surface.md §4.6).

One database file (conventionally `events.db`) holds every table; `SqliteEventStore` and
`SqliteConfigStore` may point at the same file and each keeps its own connections.

Threading: sqlite3 blocks, so all work runs off the event loop. Each store owns one *writer*
connection on a dedicated single-thread executor (every write is serialised there, which is also
what makes group commit cheap) and one *reader* connection on a second single-thread executor
(WAL lets it read committed data while the writer commits).

Schema and migrations: `schema.py` (the tables, user_version 3). The rows themselves
(kind JSON, `kind_tag`, poison reduction, usage folding) are `rows.py`, shared with any other
store; the batch INSERT statements are `insert.py`; `SqliteConfigStore` is
`config.py` (re-exported here).

Appending is built around the GIL: every sqlite3 step releases it and must take it back, and
taking it back while the event loop is busy can cost a whole switch interval (5 ms). So a batch
goes in as *one* statement (`INSERT ... SELECT ... FROM json_each(?)`, the rows passed as one
JSON array; the bound-parameter fallback and the statements are `insert.py`), atomic on
its own; only batches that also update `usage_daily` or `cursors` use an explicit transaction.
A poison kind is written in its reduced form and replaced by it in the batch (`rows.py`).
`submit_append` queues an append to the writer thread without awaiting (the emitter's
pipeline; `after=` chains it to an earlier append); `append_batch` awaits the same job.
`append_now` does it on the calling thread (the event loop's) when the write lock is free this
instant, on a connection of its own that never waits and never checkpoints (`inline.py`):
the emitter's live path, with the rows bound as parameters (no GIL to save there).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from prospero.core.errors import SeqConflict, StoreError
from prospero.core.store.base import (
    CursorMark,
    Fence,
    KindScan,
    RawEvent,
    StoreCapabilities,
    StoredEvent,
    UsageDay,
)
from prospero.core.store.rows import OUTCOMES, encode_batch, raw_events, row_to_event
from prospero.core.store.sqlite.config import SqliteConfigStore as SqliteConfigStore
from prospero.core.store.sqlite.db import SqliteDb
from prospero.core.store.sqlite.inline import InlineWriter, WriteLockBusy, is_busy
from prospero.core.store.sqlite.insert import (
    INSERT_JSON_ROWS,
    ROWS_PER_INSERT,
    UPSERT_CURSOR,
    has_json,
    insert_bound,
    json_rows,
    rows_per_insert,
    upsert_cursors,
)
from prospero.core.store.sqlite.schema import SCHEMA_VERSION as SCHEMA_VERSION
from prospero.core.store.sqlite.schema import UPSERT_USAGE, init_schema
from prospero.types.events import EventRun, FleetEvent

log = logging.getLogger(__name__)


T = TypeVar("T")

# What `submit_append` takes: events, runs of events, and cursor marks, in order.
_Entry = FleetEvent | EventRun | CursorMark

# Rows deleted per retention transaction: keeps the write lock short so appends interleave.
PRUNE_CHUNK = 5000

# Highest seq of a stream: what retention folded into stream_heads, or what is still stored.
_HIGH_WATER = (
    "SELECT max(coalesce((SELECT high_water FROM stream_heads WHERE stream_key = ?1), 0), "
    "coalesce((SELECT max(seq) FROM events WHERE stream_key = ?1), 0))"
)


# `_HIGH_WATER` of many streams in one statement (the keys bound as a VALUES list).
def _high_waters_sql(n: int) -> str:
    return (
        "WITH k(key) AS (VALUES " + ",".join(["(?)"] * n) + ") SELECT key, "
        "max(coalesce((SELECT high_water FROM stream_heads WHERE stream_key = key), 0), "
        "coalesce((SELECT max(seq) FROM events WHERE stream_key = key), 0)) FROM k"
    )


# Streams bound per statement of `scan_kinds` (well under any host-parameter limit).
_SCAN_CHUNK = 250

# Before a prune chunk is deleted: fold its streams' max seq into stream_heads.
_FOLD_PRUNED_HEADS = (
    "INSERT INTO stream_heads (stream_key, high_water) "
    "SELECT stream_key, max(seq) FROM events "
    "WHERE ordinal IN (SELECT ordinal FROM temp.prune_chunk) GROUP BY stream_key "
    "ON CONFLICT (stream_key) DO UPDATE SET high_water = max(high_water, excluded.high_water)"
)

_SELECT_EVENT_COLS = "seq, ts, repo, agent_id, kind"

# The raw reads: the kind's JSON as stored (bytes, no UTF-8 round trip), spliced as it is.
_SELECT_RAW_COLS = "seq, ts, repo, agent_id, kind_tag, CAST(kind AS BLOB)"


class AppendSkipped(StoreError):
    """An append queued `after` one that failed: nothing of it was written."""


def _wrap(e: Exception, what: str) -> StoreError:
    return StoreError(f"sqlite {what} failed: {e}")


class SqliteEventStore:
    """Durable event store on one SQLite file. Call `open()` before use."""

    # Both fast paths of `PipelinedAppends` (each still says None when it must not be used);
    # one prosperod per file.
    capabilities = StoreCapabilities(pipelined_appends=True, inline_appends=True)

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._writer: SqliteDb | None = None
        self._reader: SqliteDb | None = None
        self._json: bool | None = None  # SQLite has json_each (probed on first append)
        self._inline: InlineWriter | None = None  # appends on the loop's thread (`append_now`)
        self._checkpointing = False
        self._rows_per_insert = ROWS_PER_INSERT

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        if self._writer is not None:
            return
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        writer = SqliteDb(self.path, "w")
        reader = SqliteDb(self.path, "r")
        try:
            await writer.open()
            await writer.run(init_schema)
            await reader.open()
        except Exception as e:
            await writer.close()
            await reader.close()
            if isinstance(e, sqlite3.Error):
                raise _wrap(e, "open") from e
            raise
        self._writer, self._reader = writer, reader
        self._inline = InlineWriter(self.path, self._request_checkpoint)

    async def close(self) -> None:
        writer, reader = self._writer, self._reader
        self._writer = self._reader = None
        inline, self._inline = self._inline, None
        if inline is not None:
            inline.close()
        if reader is not None:
            await reader.close()
        if writer is not None:
            await writer.close()

    def _request_checkpoint(self) -> None:
        """A PASSIVE WAL checkpoint on the writer thread (the inline writer never checkpoints:
        see `inline`), unless one is already queued."""
        if self._checkpointing or self._writer is None:
            return
        self._checkpointing = True

        def job(conn: sqlite3.Connection) -> None:
            try:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.Error as e:
                log.info("sqlite: WAL checkpoint failed: %s", e)
            finally:
                self._checkpointing = False

        if self._writer.submit(job).done():  # not queued (the executor is shut down)
            self._checkpointing = False

    def _w(self) -> SqliteDb:
        if self._writer is None:
            raise StoreError("sqlite event store is not open")
        return self._writer

    def _r(self) -> SqliteDb:
        if self._reader is None:
            raise StoreError("sqlite event store is not open")
        return self._reader

    # -- writes --------------------------------------------------------------------------

    async def append_batch(
        self,
        events: Sequence[FleetEvent],
        *,
        cursors: Mapping[str, bytes] | None = None,
        fences: Collection[Fence] | None = None,
    ) -> list[int]:
        """(`fences` are ignored: a SQLite file has one writer, `capabilities.fenced_appends`
        is False and the emitter passes none.)"""
        if not events and not cursors:
            return []
        if not cursors:  # (a subclass's `submit_append` may not take cursors)
            return await asyncio.wrap_future(self.submit_append(events))
        return await asyncio.wrap_future(self.submit_append(events, cursors=cursors))

    def batch_submitter(
        self,
    ) -> Callable[[Sequence[_Entry], Future[list[int]] | None], Future[list[int]]] | None:
        """`submit_append`, unless `append_batch` is customised (by a subclass, or patched on
        the instance): then every append must go through it, so there is no synchronous path.
        Asked again for every batch."""
        if type(self).append_batch is not SqliteEventStore.append_batch or (
            "append_batch" in vars(self)
        ):
            return None
        return self.submit_append

    def submit_append(
        self,
        events: Sequence[_Entry],
        after: Future[list[int]] | None = None,
        *,
        cursors: Mapping[str, bytes] | None = None,
    ) -> Future[list[int]]:
        """`append_batch`, started right now (synchronously queued to the writer thread): the
        returned future resolves to the ordinals or fails with SeqConflict / StoreError exactly
        like `append_batch`. Lets the emitter hand a batch over without an event-loop turn.
        Takes `EventRun`s as well as events (a run counts as its events, in order), and
        `CursorMark`s: the `cursors` rows written in the same transaction (the last mark of a
        key wins; `cursors` after every mark).

        `after`: an append submitted earlier; unless it succeeded, this one writes nothing and
        fails with `AppendSkipped` (so a caller can queue the next batch before the previous one
        is known to be committed, and still retry them in order)."""
        job = self._append_job(events, cursors, after)
        if job is None:
            done: Future[list[int]] = Future()
            done.set_result([])
            return done
        return self._w().submit(job)

    def inline_appender(self) -> Callable[[Sequence[_Entry]], list[int] | None] | None:
        """`append_now` while the store is open, unless `append_batch` or `submit_append` is
        customised (a subclass's, or patched on the instance: every append must then go
        through it). Asked again for every batch."""
        if self._inline is None or self.batch_submitter() is None:
            return None
        if type(self).submit_append is not SqliteEventStore.submit_append or (
            "submit_append" in vars(self)
        ):
            return None
        return self.append_now

    def append_now(self, events: Sequence[_Entry]) -> list[int] | None:
        """`submit_append(events)`, done right here on the calling thread (the event loop's),
        if the database's write lock is free this instant: the ordinals, or SeqConflict /
        StoreError exactly as the future would fail. None: the lock is held (by the writer
        thread, another connection or process); nothing was written, use `submit_append`.
        Never waits for a lock and never checkpoints (see `inline`)."""
        inline = self._inline
        if inline is None:
            raise StoreError("sqlite event store is not open")
        job = self._append_job(events, None, None, bound=True)
        if job is None:
            return []
        return inline.run(job)

    def _append_job(
        self,
        events: Sequence[_Entry],
        cursors: Mapping[str, bytes] | None,
        after: Future[list[int]] | None,
        *,
        bound: bool = False,
    ) -> Callable[[sqlite3.Connection], list[int]] | None:
        """The append as a job for a connection (None when there is nothing to do). `bound`:
        rows as bound parameters, never the one-JSON-array statement: on the loop's own thread
        there is no GIL hand-off to save, and binding costs less CPU than SQLite's JSON parsing
        (measured: 2.8 vs 4.0 ms for 100 events with 50 cursor rows)."""
        n = 0
        marks: dict[str, bytes] = {}
        for e in events:
            t = type(e)
            if t is EventRun:
                n += len(e)  # type: ignore[arg-type]
            elif t is CursorMark:
                marks[e.key] = e.data  # type: ignore[union-attr]
            else:
                n += 1
        if cursors:
            marks.update(cursors)
        if n == 0 and not marks and after is None:
            return None

        def job(conn: sqlite3.Connection) -> list[int]:
            # Appends run one at a time, in submission order: `after` has finished by now.
            if after is not None and (after.cancelled() or after.exception() is not None):
                raise AppendSkipped("the previous append did not succeed")
            if n == 0 and not marks:
                return []
            try:
                last = insert(conn)
            except sqlite3.IntegrityError as e:
                raise SeqConflict(f"(stream_key, seq) already stored: {e}") from e
            except (sqlite3.Error, UnicodeError) as e:
                if is_busy(e):  # nothing written (the transaction, if begun, rolled back)
                    raise WriteLockBusy(f"sqlite append failed: {e}") from e
                raise _wrap(e, "append") from e
            # Contiguous: the batch was inserted under one write lock (AUTOINCREMENT).
            return list(range(last - n + 1, last + 1)) if n else []

        def insert(conn: sqlite3.Connection) -> int:
            # Serialising here keeps the pydantic work off the event loop.
            if self._json is None:
                self._json = has_json(conn)
                self._rows_per_insert = rows_per_insert(conn)
            blob: bytes | None = None
            rows: list[Any] = []
            usage_rows: list[Any] = []
            if n and self._json and not bound:
                blob, usage_rows = json_rows(events)
            if n and blob is None:
                rows, usage_rows = encode_batch(events)
            if blob is not None and not usage_rows and not marks:
                # One statement: atomic by itself.
                cur = conn.execute(INSERT_JSON_ROWS, (blob,))
                return cur.lastrowid or 0
            conn.execute("BEGIN IMMEDIATE")
            try:
                last = 0
                if blob is not None:
                    last = conn.execute(INSERT_JSON_ROWS, (blob,)).lastrowid or 0
                elif rows:
                    last = insert_bound(conn, rows, self._rows_per_insert)
                if usage_rows:
                    conn.executemany(UPSERT_USAGE, usage_rows)
                if marks:
                    upsert_cursors(conn, marks)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return last

        return job

    async def prune(self, before_ts: str) -> int:
        def chunk(conn: sqlite3.Connection) -> int:
            conn.execute(
                "CREATE TEMP TABLE IF NOT EXISTS prune_chunk (ordinal INTEGER PRIMARY KEY)"
            )
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("DELETE FROM temp.prune_chunk")
                conn.execute(
                    "INSERT INTO temp.prune_chunk SELECT ordinal FROM events WHERE ts < ? LIMIT ?",
                    (before_ts, PRUNE_CHUNK),
                )
                # The heads first, so high_water never goes backwards (see the module doc).
                conn.execute(_FOLD_PRUNED_HEADS)
                cur = conn.execute(
                    "DELETE FROM events WHERE ordinal IN (SELECT ordinal FROM temp.prune_chunk)"
                )
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return cur.rowcount

        total = 0
        try:
            while True:
                # One short transaction per chunk so appends interleave with a large sweep.
                n = await self._w().run(chunk)
                total += n
                if n < PRUNE_CHUNK:
                    return total
        except sqlite3.Error as e:
            raise _wrap(e, "prune") from e

    async def writable(self) -> bool:
        def probe(conn: sqlite3.Connection) -> bool:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "INSERT OR REPLACE INTO cursors (key, data) VALUES (?, ?)",
                    ("__prospero_writable_probe__", b""),
                )
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            return True

        try:
            return await self._w().run(probe)
        except (sqlite3.Error, StoreError) as e:
            log.warning("sqlite store %s is not writable: %s", self.path, e)
            return False

    async def save_cursor(self, key: str, data: bytes) -> None:
        def job(conn: sqlite3.Connection) -> None:
            conn.execute(UPSERT_CURSOR, (key, bytes(data)))

        try:
            await self._w().run(job)
        except sqlite3.Error as e:
            raise _wrap(e, "save_cursor") from e

    # -- reads ---------------------------------------------------------------------------

    async def _read(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        try:
            return await self._r().run(fn)
        except sqlite3.Error as e:
            raise _wrap(e, what) from e

    async def replay(
        self,
        stream_key: str,
        from_seq: int = 0,
        limit: int | None = None,
        *,
        kinds: Collection[str] | None = None,
    ) -> list[FleetEvent]:
        tags = sorted(set(kinds)) if kinds is not None else None
        if tags is not None and not tags:
            return []

        def job(conn: sqlite3.Connection) -> list[FleetEvent]:
            # kind_tag filters before any JSON is decoded: a totals fold over the few
            # turn/finish events of a long run does not pay for its output chunks.
            where = "" if tags is None else f" AND kind_tag IN ({','.join('?' * len(tags))})"
            rows = conn.execute(
                f"SELECT {_SELECT_EVENT_COLS} FROM events WHERE stream_key = ? AND seq >= ?"
                f"{where} ORDER BY seq LIMIT ?",
                (stream_key, from_seq, *(tags or ()), -1 if limit is None else limit),
            ).fetchall()
            return [ev for ev in map(row_to_event, rows) if ev is not None]

        return await self._read(job, "replay")

    async def replay_fleet(
        self, after_ordinal: int = 0, limit: int | None = None
    ) -> list[StoredEvent]:
        def job(conn: sqlite3.Connection) -> list[StoredEvent]:
            rows = conn.execute(
                f"SELECT ordinal, {_SELECT_EVENT_COLS} FROM events WHERE ordinal > ? "
                "ORDER BY ordinal LIMIT ?",
                (after_ordinal, -1 if limit is None else limit),
            ).fetchall()
            out: list[StoredEvent] = []
            for row in rows:
                ev = row_to_event(row[1:])
                if ev is not None:
                    out.append(StoredEvent(row[0], ev))
            return out

        return await self._read(job, "replay_fleet")

    async def replay_raw(
        self,
        stream_key: str,
        from_seq: int = 0,
        limit: int | None = None,
        *,
        kinds: Collection[str] | None = None,
    ) -> list[RawEvent]:
        tags = sorted(set(kinds)) if kinds is not None else None
        if tags is not None and not tags:
            return []

        def job(conn: sqlite3.Connection) -> list[RawEvent]:
            where = "" if tags is None else f" AND kind_tag IN ({','.join('?' * len(tags))})"
            rows = conn.execute(
                f"SELECT {_SELECT_RAW_COLS} FROM events WHERE stream_key = ? AND seq >= ?"
                f"{where} ORDER BY seq LIMIT ?",
                (stream_key, from_seq, *(tags or ()), -1 if limit is None else limit),
            ).fetchall()
            return raw_events(rows, False)

        return await self._read(job, "replay")

    async def replay_fleet_raw(
        self,
        after_ordinal: int = 0,
        limit: int | None = None,
        *,
        kinds: Collection[str] | None = None,
    ) -> list[RawEvent]:
        tags = sorted(set(kinds)) if kinds is not None else None
        if tags == []:
            return []

        def job(conn: sqlite3.Connection) -> list[RawEvent]:
            where = "" if tags is None else f" AND kind_tag IN ({','.join('?' * len(tags))})"
            rows = conn.execute(
                f"SELECT ordinal, {_SELECT_RAW_COLS} FROM events WHERE ordinal > ?{where} "
                "ORDER BY ordinal LIMIT ?",
                (after_ordinal, *(tags or ()), -1 if limit is None else limit),
            ).fetchall()
            return raw_events(rows, True)

        return await self._read(job, "replay_fleet")

    async def high_water(self, stream_key: str) -> int:
        def job(conn: sqlite3.Connection) -> int:
            row = conn.execute(_HIGH_WATER, (stream_key,)).fetchone()
            return int(row[0]) if row and row[0] is not None else 0

        return await self._read(job, "high_water")

    async def scan_kinds(
        self,
        streams: Collection[str],
        kinds: Collection[str],
        *,
        after_ordinal: int = 0,
        known: Collection[str] = (),
    ) -> KindScan:
        wanted = set(streams)
        known_set = wanted.intersection(known)
        fresh = sorted(wanted - known_set)
        tags = sorted(set(kinds))
        after = max(0, after_ordinal)
        in_tags = ",".join("?" * len(tags))

        def chunks(keys: list[str]) -> Iterator[list[str]]:
            for i in range(0, len(keys), _SCAN_CHUNK):
                yield keys[i : i + _SCAN_CHUNK]

        def scan(conn: sqlite3.Connection) -> KindScan:
            row = conn.execute("SELECT max(ordinal) FROM events").fetchone()
            last = max(after, int(row[0]) if row and row[0] is not None else 0)
            rows: list[tuple[str, int, bytes]] = []
            if tags and fresh and after > 0:
                # What the caller has not folded of its new streams, up to after_ordinal:
                # through the (stream_key, seq) index (`+ordinal`: not a rowid range scan).
                older: list[tuple[int, str, int, bytes]] = []
                for part in chunks(fresh):
                    older += conn.execute(
                        "SELECT ordinal, stream_key, seq, CAST(kind AS BLOB) FROM events "
                        f"WHERE stream_key IN ({','.join('?' * len(part))}) "
                        f"AND +ordinal <= ? AND kind_tag IN ({in_tags})",
                        (*part, after, *tags),
                    ).fetchall()
                older.sort()
                rows += [(k, seq, kind) for _, k, seq, kind in older]
            if tags and wanted and last > after:
                # What is new, every stream: a rowid range, kind_tag tested before any JSON.
                for k, seq, kind in conn.execute(
                    "SELECT stream_key, seq, CAST(kind AS BLOB) FROM events "
                    f"WHERE ordinal > ? AND ordinal <= ? AND kind_tag IN ({in_tags}) "
                    "ORDER BY ordinal",
                    (after, last, *tags),
                ):
                    if k in wanted:
                        rows.append((k, seq, kind))
            changed = list(fresh)
            if known_set and last > after:
                changed += [
                    k
                    for (k,) in conn.execute(
                        "SELECT DISTINCT stream_key FROM events WHERE ordinal > ? AND ordinal <= ?",
                        (after, last),
                    )
                    if k in known_set
                ]
            heads: dict[str, int] = {}
            for part in chunks(changed):
                for k, hw in conn.execute(_high_waters_sql(len(part)), part):
                    heads[k] = int(hw)
            return KindScan(last_ordinal=last, heads=heads, rows=rows)

        def job(conn: sqlite3.Connection) -> KindScan:
            # One read transaction: every statement sees the same snapshot (WAL).
            conn.execute("BEGIN")
            try:
                return scan(conn)
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")

        return await self._read(job, "scan_kinds")

    async def last_ordinal(self) -> int:
        def job(conn: sqlite3.Connection) -> int:
            row = conn.execute("SELECT max(ordinal) FROM events").fetchone()
            return int(row[0]) if row and row[0] is not None else 0

        return await self._read(job, "last_ordinal")

    async def usage(self, since_day: str, until_day: str) -> list[UsageDay]:
        def job(conn: sqlite3.Connection) -> list[UsageDay]:
            rows = conn.execute(
                "SELECT workspace, day, input_tokens, output_tokens, cost_usd, turns, runs, "
                "done, failed, killed, crashed, budget_exceeded FROM usage_daily "
                "WHERE day >= ? AND day <= ? ORDER BY workspace, day",
                (since_day, until_day),
            ).fetchall()
            return [
                UsageDay(
                    workspace=r[0],
                    day=r[1],
                    input_tokens=r[2],
                    output_tokens=r[3],
                    cost_usd=r[4],
                    turns=r[5],
                    runs=r[6],
                    outcomes=dict(zip(OUTCOMES, r[7:12], strict=True)),
                )
                for r in rows
            ]

        return await self._read(job, "usage")

    async def load_cursor(self, key: str) -> bytes | None:
        def job(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute("SELECT data FROM cursors WHERE key = ?", (key,)).fetchone()
            return bytes(row[0]) if row else None

        return await self._read(job, "load_cursor")
