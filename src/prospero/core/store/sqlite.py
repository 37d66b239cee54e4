"""SQLite implementations of the EventStore and ConfigStore seams (prospero-surface.md §4.6).

One database file (conventionally `events.db`) holds every table; `SqliteEventStore` and
`SqliteConfigStore` may point at the same file and each keeps its own connections.

Threading: sqlite3 blocks, so all work runs off the event loop. Each store owns one *writer*
connection on a dedicated single-thread executor (every write is serialised there, which is also
what makes group commit cheap) and one *reader* connection on a second single-thread executor
(WAL lets it read committed data while the writer commits).

Schema (user_version 1):

- `events(ordinal INTEGER PRIMARY KEY AUTOINCREMENT, stream_key, seq, ts, repo, agent_id,
  kind_tag, kind /*JSON of EventKind*/, UNIQUE(stream_key, seq))` plus an index on `ts` for
  retention. AUTOINCREMENT so an ordinal (the fleet stream's resume cursor) is never reused,
  even after retention has deleted the newest rows.
- `stream_heads(stream_key PRIMARY KEY, high_water)`: the highest seq ever appended per stream,
  maintained in the append transaction, so `high_water` is O(1) and never goes backwards when
  retention prunes a whole stream (a reused seq would be silently deduplicated away by a client
  resuming with `?from=`).
- `usage_daily(workspace, day, input_tokens, output_tokens, cost_usd, turns, runs, done, failed,
  killed, crashed, PRIMARY KEY(workspace, day))`: maintained in the append transaction from
  `agent_finished` (tokens, cost, turns, runs) and terminal `status_changed` (outcomes). Null
  sums stay null until an event reports a value. Retention does not touch it (usage history
  outlives raw events; the rows are tiny).
- `cursors(key PRIMARY KEY, data BLOB)`, `workspaces(name PRIMARY KEY, root, config JSON)`.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

from prospero.core.errors import SeqConflict, StoreError
from prospero.core.store.base import StoredEvent, UsageDay
from prospero.types.events import (
    EVENT_KIND_ADAPTER,
    AgentFinished,
    FleetEvent,
    StatusChanged,
)
from prospero.types.model import RegisteredWorkspace, RepoProviderConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 5000
# Rows deleted per retention transaction: keeps the write lock short so appends interleave.
PRUNE_CHUNK = 5000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    ordinal    INTEGER PRIMARY KEY AUTOINCREMENT,
    stream_key TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    ts         TEXT    NOT NULL,
    repo       TEXT    NOT NULL,
    agent_id   TEXT    NOT NULL,
    kind_tag   TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    UNIQUE (stream_key, seq)
);
CREATE INDEX IF NOT EXISTS events_ts ON events (ts);
CREATE TABLE IF NOT EXISTS stream_heads (
    stream_key TEXT PRIMARY KEY,
    high_water INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS usage_daily (
    workspace     TEXT    NOT NULL,
    day           TEXT    NOT NULL,
    input_tokens  INTEGER,
    output_tokens INTEGER,
    cost_usd      REAL,
    turns         INTEGER NOT NULL DEFAULT 0,
    runs          INTEGER NOT NULL DEFAULT 0,
    done          INTEGER NOT NULL DEFAULT 0,
    failed        INTEGER NOT NULL DEFAULT 0,
    killed        INTEGER NOT NULL DEFAULT 0,
    crashed       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (workspace, day)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cursors (
    key  TEXT PRIMARY KEY,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS workspaces (
    name   TEXT PRIMARY KEY,
    root   TEXT NOT NULL,
    config TEXT NOT NULL
);
"""

_INSERT_EVENT = (
    "INSERT INTO events (stream_key, seq, ts, repo, agent_id, kind_tag, kind) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)

_UPSERT_HEAD = (
    "INSERT INTO stream_heads (stream_key, high_water) VALUES (?, ?) "
    "ON CONFLICT (stream_key) DO UPDATE SET high_water = max(high_water, excluded.high_water)"
)


def _null_add(col: str) -> str:
    # "Not reported" (null) stays null until some event reports a value.
    return (
        f"{col} = CASE WHEN excluded.{col} IS NULL THEN usage_daily.{col} "
        f"ELSE coalesce(usage_daily.{col}, 0) + excluded.{col} END"
    )


_UPSERT_USAGE = (
    "INSERT INTO usage_daily (workspace, day, input_tokens, output_tokens, cost_usd, turns, runs,"
    " done, failed, killed, crashed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (workspace, day) DO UPDATE SET "
    + ", ".join(
        [
            _null_add("input_tokens"),
            _null_add("output_tokens"),
            _null_add("cost_usd"),
            "turns = usage_daily.turns + excluded.turns",
            "runs = usage_daily.runs + excluded.runs",
            "done = usage_daily.done + excluded.done",
            "failed = usage_daily.failed + excluded.failed",
            "killed = usage_daily.killed + excluded.killed",
            "crashed = usage_daily.crashed + excluded.crashed",
        ]
    )
)

_SELECT_EVENT_COLS = "seq, ts, repo, agent_id, kind"

_OUTCOMES = ("done", "failed", "killed", "crashed")


def _connect(path: str) -> sqlite3.Connection:
    # isolation_level=None: autocommit; transactions are explicit (BEGIN IMMEDIATE).
    conn = sqlite3.connect(
        path,
        timeout=BUSY_TIMEOUT_MS / 1000,
        isolation_level=None,
        check_same_thread=False,
    )
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
    if mode is None or str(mode[0]).lower() != "wal":
        log.warning("sqlite %s: could not enable WAL (journal_mode=%s)", path, mode)
    # In WAL mode NORMAL is safe against application crashes; only an OS crash / power loss
    # can lose the last commits (never corrupt the file).
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = OFF")
    return conn


def _init_schema(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"database schema version {version} is newer than this build ({SCHEMA_VERSION})"
            )
        for stmt in _SCHEMA.split(";"):
            if stmt.strip():
                conn.execute(stmt)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


class _Db:
    """One sqlite connection pinned to its own single-thread executor."""

    def __init__(self, path: str, name: str) -> None:
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sqlite-{name}")
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        def _open() -> None:
            if self._conn is None:
                self._conn = _connect(self._path)

        await asyncio.get_running_loop().run_in_executor(self._executor, _open)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def job() -> T:
            if self._conn is None:
                raise StoreError("sqlite store is not open")
            return fn(self._conn)

        loop = asyncio.get_running_loop()
        try:
            fut = loop.run_in_executor(self._executor, job)
        except RuntimeError as e:  # executor shut down
            raise StoreError(f"sqlite store is closed: {e}") from e
        return await fut

    async def close(self) -> None:
        def _close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, _close)
        except RuntimeError:
            pass
        self._executor.shutdown(wait=True)


@dataclass(slots=True)
class _UsageAcc:
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    turns: int = 0
    runs: int = 0
    done: int = 0
    failed: int = 0
    killed: int = 0
    crashed: int = 0

    def row(self, workspace: str, day: str) -> tuple[Any, ...]:
        return (
            workspace,
            day,
            self.input_tokens,
            self.output_tokens,
            self.cost_usd,
            self.turns,
            self.runs,
            self.done,
            self.failed,
            self.killed,
            self.crashed,
        )


def _nadd(a: Any, b: Any) -> Any:
    if b is None:
        return a
    if a is None:
        return b
    return a + b


def _prepare(
    events: Sequence[FleetEvent],
) -> tuple[list[tuple[Any, ...]], list[tuple[str, int]], list[tuple[Any, ...]]]:
    """Rows for events, stream heads and usage deltas (folded per workspace and day)."""
    rows: list[tuple[Any, ...]] = []
    heads: dict[str, int] = {}
    usage: dict[tuple[str, str], _UsageAcc] | None = None
    for ev in events:
        kind = ev.kind
        tag = kind.kind
        key = ev.stream_key
        rows.append(
            (key, ev.seq, ev.ts, ev.repo, ev.agent_id, tag, kind.model_dump_json(by_alias=True))
        )
        if heads.get(key, -1) < ev.seq:
            heads[key] = ev.seq
        if tag == "agent_finished" or tag == "status_changed":
            if usage is None:
                usage = {}
            if isinstance(kind, AgentFinished):
                acc = usage.setdefault((ev.repo, ev.ts[:10]), _UsageAcc())
                acc.runs += 1
                acc.turns += kind.turns
                acc.cost_usd = _nadd(acc.cost_usd, kind.cost_usd)
                if kind.usage is not None:
                    acc.input_tokens = _nadd(acc.input_tokens, kind.usage.input_tokens)
                    acc.output_tokens = _nadd(acc.output_tokens, kind.usage.output_tokens)
            elif isinstance(kind, StatusChanged) and kind.to.terminal:
                acc = usage.setdefault((ev.repo, ev.ts[:10]), _UsageAcc())
                name = kind.to.value
                setattr(acc, name, getattr(acc, name) + 1)
    usage_rows = [acc.row(ws, day) for (ws, day), acc in usage.items()] if usage else []
    return rows, list(heads.items()), usage_rows


def _row_to_event(row: tuple[Any, ...]) -> FleetEvent | None:
    seq, ts, repo, agent_id, kind = row
    try:
        return FleetEvent(
            seq=seq,
            ts=ts,
            repo=repo,
            agent_id=agent_id,
            kind=EVENT_KIND_ADAPTER.validate_json(kind),
        )
    except ValueError as e:
        log.warning("skipping unreadable stored event (%r, seq %s): %s", agent_id or repo, seq, e)
        return None


def _wrap(e: sqlite3.Error, what: str) -> StoreError:
    return StoreError(f"sqlite {what} failed: {e}")


class SqliteEventStore:
    """Durable event store on one SQLite file. Call `open()` before use."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._writer: _Db | None = None
        self._reader: _Db | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        if self._writer is not None:
            return
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        writer = _Db(self.path, "w")
        reader = _Db(self.path, "r")
        try:
            await writer.open()
            await writer.run(_init_schema)
            await reader.open()
        except Exception as e:
            await writer.close()
            await reader.close()
            if isinstance(e, sqlite3.Error):
                raise _wrap(e, "open") from e
            raise
        self._writer, self._reader = writer, reader

    async def close(self) -> None:
        writer, reader = self._writer, self._reader
        self._writer = self._reader = None
        if reader is not None:
            await reader.close()
        if writer is not None:
            await writer.close()

    def _w(self) -> _Db:
        if self._writer is None:
            raise StoreError("sqlite event store is not open")
        return self._writer

    def _r(self) -> _Db:
        if self._reader is None:
            raise StoreError("sqlite event store is not open")
        return self._reader

    # -- writes --------------------------------------------------------------------------

    async def append_batch(self, events: Sequence[FleetEvent]) -> list[int]:
        if not events:
            return []
        n = len(events)

        def job(conn: sqlite3.Connection) -> int:
            # Serialising here keeps ~1.5 µs/event of pydantic work off the event loop.
            rows, heads, usage_rows = _prepare(events)
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(_INSERT_EVENT, rows)
                last: int = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
                conn.executemany(_UPSERT_HEAD, heads)
                if usage_rows:
                    conn.executemany(_UPSERT_USAGE, usage_rows)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return last

        try:
            last = await self._w().run(job)
        except sqlite3.IntegrityError as e:
            raise SeqConflict(f"(stream_key, seq) already stored: {e}") from e
        except sqlite3.Error as e:
            raise _wrap(e, "append") from e
        # Ordinals are contiguous: the batch was inserted under one write lock (AUTOINCREMENT).
        return list(range(last - n + 1, last + 1))

    async def prune(self, before_ts: str) -> int:
        def chunk(conn: sqlite3.Connection) -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                cur = conn.execute(
                    "DELETE FROM events WHERE ordinal IN "
                    "(SELECT ordinal FROM events WHERE ts < ? LIMIT ?)",
                    (before_ts, PRUNE_CHUNK),
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
            conn.execute(
                "INSERT INTO cursors (key, data) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET data = excluded.data",
                (key, bytes(data)),
            )

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
        self, stream_key: str, from_seq: int = 0, limit: int | None = None
    ) -> list[FleetEvent]:
        def job(conn: sqlite3.Connection) -> list[FleetEvent]:
            rows = conn.execute(
                f"SELECT {_SELECT_EVENT_COLS} FROM events WHERE stream_key = ? AND seq >= ? "
                "ORDER BY seq LIMIT ?",
                (stream_key, from_seq, -1 if limit is None else limit),
            ).fetchall()
            return [ev for ev in map(_row_to_event, rows) if ev is not None]

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
                ev = _row_to_event(row[1:])
                if ev is not None:
                    out.append(StoredEvent(row[0], ev))
            return out

        return await self._read(job, "replay_fleet")

    async def high_water(self, stream_key: str) -> int:
        def job(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT high_water FROM stream_heads WHERE stream_key = ?", (stream_key,)
            ).fetchone()
            return int(row[0]) if row else 0

        return await self._read(job, "high_water")

    async def last_ordinal(self) -> int:
        def job(conn: sqlite3.Connection) -> int:
            row = conn.execute("SELECT max(ordinal) FROM events").fetchone()
            return int(row[0]) if row and row[0] is not None else 0

        return await self._read(job, "last_ordinal")

    async def usage(self, since_day: str, until_day: str) -> list[UsageDay]:
        def job(conn: sqlite3.Connection) -> list[UsageDay]:
            rows = conn.execute(
                "SELECT workspace, day, input_tokens, output_tokens, cost_usd, turns, runs, "
                "done, failed, killed, crashed FROM usage_daily "
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
                    outcomes=dict(zip(_OUTCOMES, r[7:11], strict=True)),
                )
                for r in rows
            ]

        return await self._read(job, "usage")

    async def load_cursor(self, key: str) -> bytes | None:
        def job(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute("SELECT data FROM cursors WHERE key = ?", (key,)).fetchone()
            return bytes(row[0]) if row else None

        return await self._read(job, "load_cursor")


class SqliteConfigStore:
    """Registered workspaces on a SQLite file (may be the event store's `events.db`).

    Opens lazily on first use; `open()`/`close()` are available for explicit lifecycles.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._db: _Db | None = None
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        async with self._lock:
            if self._db is not None:
                return
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = _Db(self.path, "cfg")
            try:
                await db.open()
                await db.run(_init_schema)
            except Exception as e:
                await db.close()
                if isinstance(e, sqlite3.Error):
                    raise _wrap(e, "open") from e
                raise
            self._db = db

    async def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await db.close()

    async def _run(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        if self._db is None:
            await self.open()
        assert self._db is not None
        try:
            return await self._db.run(fn)
        except sqlite3.Error as e:
            raise _wrap(e, what) from e

    async def list_workspaces(self) -> list[RegisteredWorkspace]:
        def job(conn: sqlite3.Connection) -> list[RegisteredWorkspace]:
            rows = conn.execute(
                "SELECT name, root, config FROM workspaces ORDER BY name"
            ).fetchall()
            out: list[RegisteredWorkspace] = []
            for name, root, config in rows:
                try:
                    cfg = RepoProviderConfig.model_validate(orjson.loads(config))
                except ValueError as e:
                    log.warning(
                        "workspace %r: unreadable stored config, using defaults: %s", name, e
                    )
                    cfg = RepoProviderConfig()
                out.append(RegisteredWorkspace(name=name, root=root, config=cfg))
            return out

        return await self._run(job, "list_workspaces")

    async def upsert_workspace(self, ws: RegisteredWorkspace) -> None:
        config = ws.config.model_dump_json(exclude_none=True)

        def job(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO workspaces (name, root, config) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET root = excluded.root, config = excluded.config",
                (ws.name, ws.root, config),
            )

        await self._run(job, "upsert_workspace")

    async def delete_workspace(self, name: str) -> bool:
        def job(conn: sqlite3.Connection) -> bool:
            return conn.execute("DELETE FROM workspaces WHERE name = ?", (name,)).rowcount > 0

        return await self._run(job, "delete_workspace")
