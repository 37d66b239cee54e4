"""SQLite implementations of the EventStore and ConfigStore seams (prospero-surface.md §4.6).

One database file (conventionally `events.db`) holds every table; `SqliteEventStore` and
`SqliteConfigStore` may point at the same file and each keeps its own connections.

Threading: sqlite3 blocks, so all work runs off the event loop. Each store owns one *writer*
connection on a dedicated single-thread executor (every write is serialised there, which is also
what makes group commit cheap) and one *reader* connection on a second single-thread executor
(WAL lets it read committed data while the writer commits).

Schema (user_version 3):

- `events(ordinal INTEGER PRIMARY KEY AUTOINCREMENT, stream_key, seq, ts, repo, agent_id,
  kind_tag, kind /*JSON of EventKind*/, UNIQUE(stream_key, seq))` plus an index on `ts` for
  retention. AUTOINCREMENT so an ordinal (the fleet stream's resume cursor) is never reused,
  even after retention has deleted the newest rows.
- `stream_heads(stream_key PRIMARY KEY, high_water)`: per stream, at least the highest seq that
  retention has deleted: each prune transaction folds the max seq of the rows it deletes in
  first. `high_water` = max(that, the highest seq still in `events`; O(log n) through the
  `(stream_key, seq)` index), so it never goes backwards when retention prunes a whole stream
  (a reused seq would be silently deduplicated away by a client resuming with `?from=`), and
  appending does not touch this table at all. Version 1 files kept it up to date on every
  append (still valid, kept); a version 1 build must not write a version 2 file, whose heads it
  would take for complete, hence the version.
- `usage_daily(workspace, day, input_tokens, output_tokens, cost_usd, turns, runs, done, failed,
  killed, crashed, PRIMARY KEY(workspace, day))`: maintained in the append transaction from
  each `turn_finished` (tokens, cost, turns: counted as the turn ends, whatever the agent's
  state) and `agent_finished` (one run and its outcome, see `types.events.run_result`). Null sums stay
  null until an event reports a value. Retention does not touch it (usage history outlives raw
  events; the rows are tiny). Version 1-2 files counted tokens, cost and turns from
  `agent_finished` and outcomes from terminal `status_changed`: opening one rebuilds the rows
  of the days whose events are still stored (`_rebuild_usage`).
- `cursors(key PRIMARY KEY, data BLOB)`: driver resume states, written by `save_cursor` or in
  the append transaction of the events they cover (`CursorMark`s in a batch, `cursors=`).
- `workspaces(name PRIMARY KEY, root, config JSON)`.

Appending is built around the GIL: every sqlite3 step releases it and must take it back, and
taking it back while the event loop is busy can cost a whole switch interval (5 ms). So a batch
goes in as *one* statement (`INSERT ... SELECT ... FROM json_each(?)`, the rows passed as one
JSON array), atomic on its own; only batches that also update `usage_daily` or `cursors` use
an explicit transaction. A poison kind (one that cannot be serialised) is written in its reduced
form (`core.store.reduce`) and replaced by it in the batch, never failing its neighbours. Without SQLite's JSON functions, or for rows JSON cannot carry exactly (a NUL
character), the rows are bound as parameters of a few multi-row INSERTs instead.
`submit_append` queues an append to the writer thread without awaiting (the emitter's
pipeline; `after=` chains it to an earlier append); `append_batch` awaits the same job.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

from prospero.core.errors import SeqConflict, StoreError
from prospero.core.store.base import CursorMark, KindScan, RawEvent, StoredEvent, UsageDay
from prospero.core.store.reduce import free_form_safe, needs_check, reduce_compact, reduce_kind
from prospero.core.store.sqlite_db import LazySqliteStore, SqliteDb
from prospero.types.events import (
    EVENT_KIND_ADAPTER,
    EVENT_KIND_NAMES,
    AgentFinished,
    EventRun,
    FleetEvent,
    TurnFinished,
    run_result,
    stream_key_for,
)
from prospero.types.model import RegisteredWorkspace, RepoProviderConfig

log = logging.getLogger(__name__)


T = TypeVar("T")

# What `submit_append` takes: events, runs of events, and cursor marks, in order.
_Entry = FleetEvent | EventRun | CursorMark

SCHEMA_VERSION = 3
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

# The whole batch in one statement: rows as one JSON array of 7-element arrays, in order.
_INSERT_JSON_ROWS = (
    "INSERT INTO events (stream_key, seq, ts, repo, agent_id, kind_tag, kind) "
    "SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), "
    "json_extract(value, '$[2]'), json_extract(value, '$[3]'), json_extract(value, '$[4]'), "
    "json_extract(value, '$[5]'), json_extract(value, '$[6]') "
    "FROM json_each(?) ORDER BY key"
)

# Fallback (no JSON functions, or a NUL in the batch): rows bound as parameters of multi-row
# INSERTs of at most this many rows (a power of two, capped by the parameter limit at runtime).
_ROWS_PER_INSERT = 256
_EVENT_COLS = 7


def _insert_rows_sql(n: int) -> str:
    return (
        "INSERT INTO events (stream_key, seq, ts, repo, agent_id, kind_tag, kind) VALUES "
        + ",".join(["(?, ?, ?, ?, ?, ?, ?)"] * n)
    )


_INSERT_ROWS_SQL: dict[int, str] = {}


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

_UPSERT_CURSOR = (
    "INSERT INTO cursors (key, data) VALUES (?, ?) "
    "ON CONFLICT (key) DO UPDATE SET data = excluded.data"
)

# Several cursor rows in one statement (one sqlite3 step: one GIL release, where
# `executemany` takes one per row); at most this many rows per statement.
_CURSORS_PER_UPSERT = 64


def _upsert_cursors_sql(n: int) -> str:
    return (
        "INSERT INTO cursors (key, data) VALUES "
        + ",".join(["(?, ?)"] * n)
        + " ON CONFLICT (key) DO UPDATE SET data = excluded.data"
    )


_UPSERT_CURSORS_SQL: dict[int, str] = {}


def _upsert_cursors(conn: sqlite3.Connection, marks: Mapping[str, bytes]) -> None:
    """Write the cursor rows (distinct keys) in few statements."""
    items = list(marks.items())
    for at in range(0, len(items), _CURSORS_PER_UPSERT):
        part = items[at : at + _CURSORS_PER_UPSERT]
        sql = _UPSERT_CURSORS_SQL.get(len(part))
        if sql is None:
            sql = _UPSERT_CURSORS_SQL[len(part)] = _upsert_cursors_sql(len(part))
        conn.execute(sql, [v for k, data in part for v in (k, bytes(data))])


_SELECT_EVENT_COLS = "seq, ts, repo, agent_id, kind"

_OUTCOMES = ("done", "failed", "killed", "crashed")


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
        if 0 < version < 3:
            _rebuild_usage(conn)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _rebuild_usage(conn: sqlite3.Connection) -> None:
    """Version 3 folds usage per turn (see `_account`); a version 1-2 file's rows counted
    tokens, cost and turns from `agent_finished` and outcomes from `status_changed`. Recompute
    the rows of every day whose events are all still stored, from those events: the days after
    the oldest stored event's day (that day may have been pruned in part, its old row is kept),
    and that day too when retention never deleted anything (no stream head folded)."""
    row = conn.execute("SELECT min(ts) FROM events").fetchone()
    if row is None or row[0] is None:
        return
    first_day = str(row[0])[:10]
    pruned = conn.execute("SELECT 1 FROM stream_heads LIMIT 1").fetchone() is not None
    op = ">" if pruned else ">="
    usage: dict[tuple[str, str], _UsageAcc] = {}
    cur = conn.execute(
        "SELECT repo, ts, kind FROM events WHERE kind_tag IN ('turn_finished', 'agent_finished')"
        " ORDER BY ordinal"
    )
    for repo, ts, body in cur:
        try:
            kind = EVENT_KIND_ADAPTER.validate_json(body)
        except ValueError:
            continue
        _account(usage, kind, repo, ts)
    conn.execute(f"DELETE FROM usage_daily WHERE day {op} ?", (first_day,))
    rows = [acc.row(ws, day) for (ws, day), acc in usage.items() if day > first_day or not pruned]
    conn.executemany(_UPSERT_USAGE, rows)
    log.info("usage aggregates rebuilt from stored events (per-turn accounting, schema 3)")


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


def _rows(
    entries: Sequence[FleetEvent | EventRun | CursorMark],
    usage: dict[tuple[str, str], _UsageAcc],
) -> Iterator[tuple[Any, ...]]:
    """The events' rows, in order (cursor marks skipped); folds usage-relevant events into
    `usage` on the way. A poison kind is replaced by its reduced form (`_reduced_body`): in the
    run's kinds, or in `entries` itself when it is a list, so what is published is what is
    stored."""
    for i, entry in enumerate(entries):
        t = type(entry)
        if t is EventRun:
            run: EventRun = entry  # type: ignore[assignment]
            repo, agent_id, ts, seq = run.repo, run.agent_id, run.ts, run.first_seq
            first = seq
            key = agent_id or stream_key_for(repo, agent_id)
            kinds = run.kinds
            for kind in kinds:
                if type(kind) is tuple:  # an Output as (stream, chunk): see CompactKind
                    try:
                        body = _output_json(kind[0], kind[1])
                    except TypeError:  # a lone surrogate
                        kinds[seq - first] = reduced = reduce_compact(kind)
                        _log_reduced(key, seq, "output")
                        body = _output_json(reduced[0], reduced[1])  # type: ignore[index]
                    yield (key, seq, ts, repo, agent_id, "output", body)
                    seq += 1
                    continue
                tag = kind.kind  # type: ignore[union-attr]
                try:
                    # == kind.model_dump_json(by_alias=True), minus the Python-level wrapper.
                    body = kind.__pydantic_serializer__.to_json(kind, by_alias=True).decode()  # type: ignore[union-attr]
                    if needs_check(kind) and not free_form_safe(kind):
                        raise ValueError("free-form value JSON cannot carry as it is")
                except ValueError:
                    kinds[seq - first] = kind = reduce_kind(kind)  # type: ignore[arg-type]
                    _log_reduced(key, seq, tag)
                    body = kind.__pydantic_serializer__.to_json(kind, by_alias=True).decode()
                yield (key, seq, ts, repo, agent_id, tag, body)
                if tag in _USAGE_TAGS:
                    _account(usage, kind, repo, ts)
                seq += 1
            continue
        if t is CursorMark:
            continue
        ev: FleetEvent = entry  # type: ignore[assignment]
        kind = ev.kind
        tag = kind.kind
        repo, agent_id, ts = ev.repo, ev.agent_id, ev.ts
        key = agent_id or stream_key_for(repo, agent_id)
        try:
            body = kind.__pydantic_serializer__.to_json(kind, by_alias=True).decode()
            if needs_check(kind) and not free_form_safe(kind):
                raise ValueError("free-form value JSON cannot carry as it is")
        except ValueError:
            kind = reduce_kind(kind)
            _log_reduced(key, ev.seq, tag)
            body = kind.__pydantic_serializer__.to_json(kind, by_alias=True).decode()
            if isinstance(entries, list):
                entries[i] = ev.model_copy(update={"kind": kind})
        yield (key, ev.seq, ts, repo, agent_id, tag, body)
        if tag in _USAGE_TAGS:
            _account(usage, kind, repo, ts)


def _log_reduced(key: str, seq: int, tag: str) -> None:
    log.warning(
        "agent %r seq %d: the %s event cannot be serialised as it is; stored in its reduced "
        "form (docs/adr/0004)",
        key,
        seq,
        tag,
    )


def _output_json(stream: str, chunk: str) -> str:
    """`Output(stream=stream, chunk=chunk).model_dump_json()`, without building the model:
    orjson and pydantic write the same JSON for these (plain strings; tested)."""
    return orjson.dumps({"kind": "output", "stream": stream, "chunk": chunk}).decode()


def _usage_rows(usage: dict[tuple[str, str], _UsageAcc]) -> list[tuple[Any, ...]]:
    return [acc.row(ws, day) for (ws, day), acc in usage.items()]


def _json_rows(
    entries: Sequence[FleetEvent | EventRun | CursorMark],
) -> tuple[bytes | None, list[Any]]:
    """The rows as one JSON array for `_INSERT_JSON_ROWS` (None when JSON could not carry them
    exactly: SQLite's JSON text ends at a NUL character; checked conservatively, an escaped NUL
    inside a kind's JSON also sends the batch down the bound-parameter path) and the usage rows."""
    usage: dict[tuple[str, str], _UsageAcc] = {}
    rows = list(_rows(entries, usage))  # tuples of atoms: the GC untracks them, never promotes
    try:
        blob = orjson.dumps(rows)
    except TypeError:  # e.g. a str orjson refuses; binding reports it properly
        return None, _usage_rows(usage)
    return (None if b"\\u0000" in blob else blob), _usage_rows(usage)


def _bound_rows(
    entries: Sequence[FleetEvent | EventRun | CursorMark],
) -> tuple[list[Any], list[Any]]:
    usage: dict[tuple[str, str], _UsageAcc] = {}
    rows = list(_rows(entries, usage))
    return rows, _usage_rows(usage)


_USAGE_TAGS = frozenset({"turn_finished", "agent_finished"})


def _account(usage: dict[tuple[str, str], _UsageAcc], kind: Any, repo: str, ts: str) -> None:
    """Fold a usage-relevant event into the per-workspace, per-UTC-day deltas: tokens, cost
    and turns from each `turn_finished` (as it happens, whatever the agent's state), the run
    and its outcome from `agent_finished` (once per run; its own totals are not counted, they
    would count the turns twice)."""
    if isinstance(kind, TurnFinished):
        acc = usage.setdefault((repo, ts[:10]), _UsageAcc())
        acc.turns += 1
        acc.cost_usd = _nadd(acc.cost_usd, kind.cost_usd)
        if kind.usage is not None:
            acc.input_tokens = _nadd(acc.input_tokens, kind.usage.input_tokens)
            acc.output_tokens = _nadd(acc.output_tokens, kind.usage.output_tokens)
    elif isinstance(kind, AgentFinished):
        acc = usage.setdefault((repo, ts[:10]), _UsageAcc())
        acc.runs += 1
        name = run_result(kind.outcome)
        setattr(acc, name, getattr(acc, name) + 1)


def _has_json(conn: sqlite3.Connection) -> bool:
    try:
        row = conn.execute(
            "SELECT json_extract(value, '$[0]') FROM json_each('[[\"x\"]]')"
        ).fetchone()
    except sqlite3.Error:
        return False
    return row is not None and row[0] == "x"


def _rows_per_insert(conn: sqlite3.Connection) -> int:
    """The largest power of two <= _ROWS_PER_INSERT that fits the host parameter limit."""
    limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    n = _ROWS_PER_INSERT
    while n > 1 and n * _EVENT_COLS > limit:
        n //= 2
    return n


def _insert_bound(conn: sqlite3.Connection, rows: list[tuple[Any, ...]], per: int) -> int:
    """Insert the rows, in order, bound as parameters of few multi-row statements: full
    `per`-row ones, then the rest by powers of two (few distinct statements ever prepared).
    Returns the last rowid."""
    total = len(rows)
    done = 0
    last = 0
    while done < total:
        left = total - done
        n = per if left >= per else 1 << (left.bit_length() - 1)
        sql = _INSERT_ROWS_SQL.get(n)
        if sql is None:
            sql = _INSERT_ROWS_SQL[n] = _insert_rows_sql(n)
        cur = conn.execute(sql, [v for row in rows[done : done + n] for v in row])
        last = cur.lastrowid or 0
        done += n
    return last


# The raw reads: the kind's JSON as stored (bytes, no UTF-8 round trip), spliced as it is.
_SELECT_RAW_COLS = "seq, ts, repo, agent_id, kind_tag, CAST(kind AS BLOB)"

# A kind's stored JSON begins with its tag (the discriminator is every kind model's first
# field): checked instead of decoding, so a row the model would not read back is skipped, as
# `_row_to_event` skips it.
_KIND_PREFIX: dict[str, tuple[bytes, bytes]] = {
    tag: (b'{"kind":' + orjson.dumps(tag) + b",", b'{"kind":' + orjson.dumps(tag) + b"}")
    for tag in EVENT_KIND_NAMES
}


def _raw_events(rows: list[tuple[Any, ...]], by_ordinal: bool) -> list[RawEvent]:
    """The rows' events as `FleetEvent.to_json()` JSON bytes (orjson's), spliced from the
    stored columns: `{"seq":…,"ts":…,"repo":…,"agent_id":…,"kind":<stored JSON>}`."""
    dumps = orjson.dumps
    prefix = _KIND_PREFIX
    heads: dict[tuple[str, str], bytes] = {}
    out: list[RawEvent] = []
    append = out.append
    for row in rows:
        if by_ordinal:
            cursor, seq, ts, repo, agent_id, tag, kind = row
        else:
            seq, ts, repo, agent_id, tag, kind = row
            cursor = seq
        p = prefix.get(tag)
        if p is None or not kind.startswith(p) or type(seq) is not int:
            log.warning("skipping unreadable stored event (%r, seq %s)", agent_id or repo, seq)
            continue
        head = heads.get((repo, agent_id))
        if head is None:
            head = heads[(repo, agent_id)] = (
                b',"repo":' + dumps(repo) + b',"agent_id":' + dumps(agent_id) + b',"kind":'
            )
        append(RawEvent(cursor, seq, tag, b'{"seq":%d,"ts":%b%b%b}' % (seq, dumps(ts), head, kind)))
    return out


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


class AppendSkipped(StoreError):
    """An append queued `after` one that failed: nothing of it was written."""


def _wrap(e: Exception, what: str) -> StoreError:
    return StoreError(f"sqlite {what} failed: {e}")


class SqliteEventStore:
    """Durable event store on one SQLite file. Call `open()` before use."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._writer: SqliteDb | None = None
        self._reader: SqliteDb | None = None
        self._json: bool | None = None  # SQLite has json_each (probed on first append)
        self._rows_per_insert = _ROWS_PER_INSERT

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        if self._writer is not None:
            return
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        writer = SqliteDb(self.path, "w")
        reader = SqliteDb(self.path, "r")
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
        self, events: Sequence[FleetEvent], *, cursors: Mapping[str, bytes] | None = None
    ) -> list[int]:
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
            done: Future[list[int]] = Future()
            done.set_result([])
            return done

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
                raise _wrap(e, "append") from e
            # Contiguous: the batch was inserted under one write lock (AUTOINCREMENT).
            return list(range(last - n + 1, last + 1)) if n else []

        def insert(conn: sqlite3.Connection) -> int:
            # Serialising here keeps the pydantic work off the event loop.
            if self._json is None:
                self._json = _has_json(conn)
                self._rows_per_insert = _rows_per_insert(conn)
            blob: bytes | None = None
            rows: list[Any] = []
            usage_rows: list[Any] = []
            if n and self._json:
                blob, usage_rows = _json_rows(events)
            if n and blob is None:
                rows, usage_rows = _bound_rows(events)
            if blob is not None and not usage_rows and not marks:
                # One statement: atomic by itself.
                cur = conn.execute(_INSERT_JSON_ROWS, (blob,))
                return cur.lastrowid or 0
            conn.execute("BEGIN IMMEDIATE")
            try:
                last = 0
                if blob is not None:
                    last = conn.execute(_INSERT_JSON_ROWS, (blob,)).lastrowid or 0
                elif rows:
                    last = _insert_bound(conn, rows, self._rows_per_insert)
                if usage_rows:
                    conn.executemany(_UPSERT_USAGE, usage_rows)
                if marks:
                    _upsert_cursors(conn, marks)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return last

        return self._w().submit(job)

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
            conn.execute(_UPSERT_CURSOR, (key, bytes(data)))

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
            return _raw_events(rows, False)

        return await self._read(job, "replay")

    async def replay_fleet_raw(
        self, after_ordinal: int = 0, limit: int | None = None
    ) -> list[RawEvent]:
        def job(conn: sqlite3.Connection) -> list[RawEvent]:
            rows = conn.execute(
                f"SELECT ordinal, {_SELECT_RAW_COLS} FROM events WHERE ordinal > ? "
                "ORDER BY ordinal LIMIT ?",
                (after_ordinal, -1 if limit is None else limit),
            ).fetchall()
            return _raw_events(rows, True)

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


class SqliteConfigStore(LazySqliteStore):
    """Registered workspaces on a SQLite file (may be the event store's `events.db`).

    Opens lazily on first use; `open()`/`close()` are available for explicit lifecycles.
    """

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, thread="cfg", label="sqlite", init=_init_schema)

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
