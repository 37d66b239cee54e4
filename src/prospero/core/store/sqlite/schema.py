"""The SQLite schema of `events.db` and its migrations.

`init_schema` runs when a store opens a file: creates what is missing, refuses a file newer
than this build, and migrates an older one (in one transaction).

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
  state) and `agent_finished` (one run and its outcome, see `types.events.run_result`), as
  `rows.account` folds them. Null sums stay null until an event reports a value. Retention
  does not touch it (usage history outlives raw events; the rows are tiny). Version 1-2 files
  counted tokens, cost and turns from `agent_finished` and outcomes from terminal
  `status_changed`: opening one rebuilds the rows of the days whose events are still stored
  (`_rebuild_usage`).
- `cursors(key PRIMARY KEY, data BLOB)`: driver resume states, written by `save_cursor` or in
  the append transaction of the events they cover (`CursorMark`s in a batch, `cursors=`).
- `workspaces(name PRIMARY KEY, root, config JSON)`.
"""

from __future__ import annotations

import logging
import sqlite3

from prospero.core.errors import StoreError
from prospero.core.store.rows import UsageAcc, account
from prospero.types.events import EVENT_KIND_ADAPTER

log = logging.getLogger("prospero.core.store.sqlite")

SCHEMA_VERSION = 4

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
    budget_exceeded INTEGER NOT NULL DEFAULT 0,
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


def _null_add(col: str) -> str:
    # "Not reported" (null) stays null until some event reports a value.
    return (
        f"{col} = CASE WHEN excluded.{col} IS NULL THEN usage_daily.{col} "
        f"ELSE coalesce(usage_daily.{col}, 0) + excluded.{col} END"
    )


UPSERT_USAGE = (
    "INSERT INTO usage_daily (workspace, day, input_tokens, output_tokens, cost_usd, turns, runs,"
    " done, failed, killed, crashed, budget_exceeded)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
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
            "budget_exceeded = usage_daily.budget_exceeded + excluded.budget_exceeded",
        ]
    )
)


def init_schema(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"database schema version {version} is newer than this build ({SCHEMA_VERSION})"
            )
        if 0 < version < 4:  # version 4: runs stopped at their budget, counted on their own
            cols = {r[1] for r in conn.execute("PRAGMA table_info(usage_daily)")}
            if cols and "budget_exceeded" not in cols:
                conn.execute(
                    "ALTER TABLE usage_daily ADD COLUMN budget_exceeded INTEGER NOT NULL DEFAULT 0"
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
    """Version 3 folds usage per turn (see `rows.account`); a version 1-2 file's rows counted
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
    usage: dict[tuple[str, str], UsageAcc] = {}
    cur = conn.execute(
        "SELECT repo, ts, kind FROM events WHERE kind_tag IN ('turn_finished', 'agent_finished')"
        " ORDER BY ordinal"
    )
    for repo, ts, body in cur:
        try:
            kind = EVENT_KIND_ADAPTER.validate_json(body)
        except ValueError:
            continue
        account(usage, kind, repo, ts)
    conn.execute(f"DELETE FROM usage_daily WHERE day {op} ?", (first_day,))
    rows = [acc.row(ws, day) for (ws, day), acc in usage.items() if day > first_day or not pruned]
    conn.executemany(UPSERT_USAGE, rows)
    log.info("usage aggregates rebuilt from stored events (per-turn accounting, schema 3)")
