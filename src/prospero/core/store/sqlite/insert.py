"""How a batch's rows get into SQLite, and the cursor rows with them.

Every sqlite3 step releases the GIL and must take it back (see `sqlite.py`), so a batch goes in
as *one* statement: `INSERT_JSON_ROWS`, the rows (`rows.encode_batch`) passed as one JSON array
(`json_rows`). Without SQLite's JSON functions (`has_json`), or for rows JSON cannot carry
exactly (a NUL character), the rows are bound as parameters of a few multi-row INSERTs
instead (`insert_bound`). Cursor rows likewise go in few multi-row upserts (`upsert_cursors`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from prospero.core.store.base import CursorMark
from prospero.core.store.rows import encode_batch
from prospero.types.events import EventRun, FleetEvent

# The whole batch in one statement: rows as one JSON array of 7-element arrays, in order.
INSERT_JSON_ROWS = (
    "INSERT INTO events (stream_key, seq, ts, repo, agent_id, kind_tag, kind) "
    "SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), "
    "json_extract(value, '$[2]'), json_extract(value, '$[3]'), json_extract(value, '$[4]'), "
    "json_extract(value, '$[5]'), json_extract(value, '$[6]') "
    "FROM json_each(?) ORDER BY key"
)

# Fallback (no JSON functions, or a NUL in the batch): rows bound as parameters of multi-row
# INSERTs of at most this many rows (a power of two, capped by the parameter limit at runtime).
ROWS_PER_INSERT = 256
_EVENT_COLS = 7


def _insert_rows_sql(n: int) -> str:
    return (
        "INSERT INTO events (stream_key, seq, ts, repo, agent_id, kind_tag, kind) VALUES "
        + ",".join(["(?, ?, ?, ?, ?, ?, ?)"] * n)
    )


_INSERT_ROWS_SQL: dict[int, str] = {}


UPSERT_CURSOR = (
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


def upsert_cursors(conn: sqlite3.Connection, marks: Mapping[str, bytes]) -> None:
    """Write the cursor rows (distinct keys) in few statements."""
    items = list(marks.items())
    for at in range(0, len(items), _CURSORS_PER_UPSERT):
        part = items[at : at + _CURSORS_PER_UPSERT]
        sql = _UPSERT_CURSORS_SQL.get(len(part))
        if sql is None:
            sql = _UPSERT_CURSORS_SQL[len(part)] = _upsert_cursors_sql(len(part))
        conn.execute(sql, [v for k, data in part for v in (k, bytes(data))])


def json_rows(
    entries: Sequence[FleetEvent | EventRun | CursorMark],
) -> tuple[bytes | None, list[Any]]:
    """The rows as one JSON array for `INSERT_JSON_ROWS` (None when JSON could not carry them
    exactly: SQLite's JSON text ends at a NUL character; checked conservatively, an escaped NUL
    inside a kind's JSON also sends the batch down the bound-parameter path) and the usage rows."""
    rows, usage = encode_batch(entries)
    try:
        blob = orjson.dumps(rows)
    except TypeError:  # e.g. a str orjson refuses; binding reports it properly
        return None, usage
    return (None if b"\\u0000" in blob else blob), usage


def has_json(conn: sqlite3.Connection) -> bool:
    try:
        row = conn.execute(
            "SELECT json_extract(value, '$[0]') FROM json_each('[[\"x\"]]')"
        ).fetchone()
    except sqlite3.Error:
        return False
    return row is not None and row[0] == "x"


def rows_per_insert(conn: sqlite3.Connection) -> int:
    """The largest power of two <= ROWS_PER_INSERT that fits the host parameter limit."""
    limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    n = ROWS_PER_INSERT
    while n > 1 and n * _EVENT_COLS > limit:
        n //= 2
    return n


def insert_bound(conn: sqlite3.Connection, rows: list[tuple[Any, ...]], per: int) -> int:
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
