"""SQLite implementation of the NotificationStore seam, tables in `events.db`:

- `notify_targets(id PRIMARY KEY, name UNIQUE, doc JSON)`;
- `notify_deliveries(id INTEGER PRIMARY KEY, target_id, ordinal, ..., UNIQUE(target_id,
  ordinal))` (a test message has a NULL ordinal: NULLs are distinct);
- `notify_cursor(name PRIMARY KEY, ordinal)`.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from prospero.core.store.notifications import DELIVERY_LOG, DuplicateTarget
from prospero.core.store.sqlite.db import LazySqliteStore, create_tables, immediate
from prospero.types.notifications import Delivery, DeliveryState, NotificationTarget

log = logging.getLogger(__name__)

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS notify_targets (
        id   TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        doc  TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS notify_deliveries (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        target_id   TEXT NOT NULL,
        ordinal     INTEGER,
        event       TEXT NOT NULL,
        agent_id    TEXT,
        workspace   TEXT,
        summary     TEXT NOT NULL,
        state       TEXT NOT NULL,
        attempts    INTEGER NOT NULL,
        http_status INTEGER,
        error       TEXT,
        created_at  TEXT NOT NULL,
        updated_at  TEXT NOT NULL,
        UNIQUE (target_id, ordinal)
    )""",
    "CREATE INDEX IF NOT EXISTS notify_deliveries_by ON notify_deliveries (target_id, id)",
    """CREATE TABLE IF NOT EXISTS notify_cursor (
        name    TEXT PRIMARY KEY,
        ordinal INTEGER NOT NULL
    )""",
)

COLS = (
    "id, target_id, ordinal, event, agent_id, workspace, summary, state, attempts, "
    "http_status, error, created_at, updated_at"
)
FIELDS = tuple(c.strip() for c in COLS.split(","))


def _init(conn: sqlite3.Connection) -> None:
    create_tables(conn, _SCHEMA)


def target_doc(t: NotificationTarget) -> str:
    return t.model_dump_json()


def target_of(doc: str) -> NotificationTarget | None:
    try:
        return NotificationTarget.model_validate_json(doc)
    except ValidationError as e:
        log.warning("notification target: unreadable stored row skipped: %s", e)
        return None


def delivery_of(row: Any) -> Delivery:
    return Delivery(**dict(zip(FIELDS, tuple(row), strict=True)))


class SqliteNotificationStore(LazySqliteStore):
    def __init__(self, path: str | Path) -> None:
        super().__init__(path, thread="notifications", label="notification store", init=_init)

    async def create_target(self, target: NotificationTarget) -> None:
        def job(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(
                    "INSERT INTO notify_targets (id, name, doc) VALUES (?, ?, ?)",
                    (target.id, target.name, target_doc(target)),
                )
            except sqlite3.IntegrityError as e:
                raise DuplicateTarget(target.name) from e

        await self._run(job, "create")

    async def get_target(self, target_id: str) -> NotificationTarget | None:
        def job(conn: sqlite3.Connection) -> Any:
            return conn.execute(
                "SELECT doc FROM notify_targets WHERE id = ?", (target_id,)
            ).fetchone()

        row = await self._run(job, "get")
        return target_of(row[0]) if row is not None else None

    async def targets(self) -> list[NotificationTarget]:
        def job(conn: sqlite3.Connection) -> list[Any]:
            return list(conn.execute("SELECT doc FROM notify_targets ORDER BY name").fetchall())

        rows = await self._run(job, "list")
        return [t for t in (target_of(r[0]) for r in rows) if t is not None]

    async def update_target(self, target: NotificationTarget) -> bool:
        def job(conn: sqlite3.Connection) -> bool:
            try:
                cur = conn.execute(
                    "UPDATE notify_targets SET name = ?, doc = ? WHERE id = ?",
                    (target.name, target_doc(target), target.id),
                )
            except sqlite3.IntegrityError as e:
                raise DuplicateTarget(target.name) from e
            return cur.rowcount == 1

        return await self._run(job, "update")

    async def delete_target(self, target_id: str) -> bool:
        def job(conn: sqlite3.Connection) -> bool:
            def body() -> bool:
                cur = conn.execute("DELETE FROM notify_targets WHERE id = ?", (target_id,))
                conn.execute("DELETE FROM notify_deliveries WHERE target_id = ?", (target_id,))
                return cur.rowcount == 1

            return immediate(conn, body)

        return await self._run(job, "delete")

    async def claim(self, delivery: Delivery, keep: int = DELIVERY_LOG) -> int | None:
        d = delivery

        def job(conn: sqlite3.Connection) -> int | None:
            def body() -> int | None:
                cur = conn.execute(
                    "INSERT OR IGNORE INTO notify_deliveries (target_id, ordinal, event, "
                    "agent_id, workspace, summary, state, attempts, http_status, error, "
                    "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, 'pending', 0, NULL, "
                    "NULL, ?, ?)",
                    (
                        d.target_id,
                        d.ordinal,
                        d.event,
                        d.agent_id,
                        d.workspace,
                        d.summary,
                        d.created_at,
                        d.created_at,
                    ),
                )
                new = cur.lastrowid if cur.rowcount == 1 else None
                if new is not None:
                    conn.execute(
                        "DELETE FROM notify_deliveries WHERE target_id = ? AND id <= "
                        "(SELECT id FROM notify_deliveries WHERE target_id = ? "
                        "ORDER BY id DESC LIMIT 1 OFFSET ?)",
                        (d.target_id, d.target_id, max(1, keep)),
                    )
                return new

            return immediate(conn, body)

        return await self._run(job, "claim")

    async def finish(
        self,
        delivery_id: int,
        state: DeliveryState,
        *,
        attempts: int,
        http_status: int | None,
        error: str | None,
        at: str,
    ) -> None:
        def job(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE notify_deliveries SET state = ?, attempts = ?, http_status = ?, "
                "error = ?, updated_at = ? WHERE id = ?",
                (state, attempts, http_status, error, at, delivery_id),
            )

        await self._run(job, "finish")

    async def deliveries(self, target_id: str | None = None, limit: int = 100) -> list[Delivery]:
        def job(conn: sqlite3.Connection) -> list[Any]:
            if target_id is None:
                q = f"SELECT {COLS} FROM notify_deliveries ORDER BY id DESC LIMIT ?"
                return list(conn.execute(q, (max(0, limit),)).fetchall())
            q = f"SELECT {COLS} FROM notify_deliveries WHERE target_id = ? ORDER BY id DESC LIMIT ?"
            return list(conn.execute(q, (target_id, max(0, limit))).fetchall())

        return [delivery_of(r) for r in await self._run(job, "deliveries")]

    async def pending(self) -> list[Delivery]:
        def job(conn: sqlite3.Connection) -> list[Any]:
            q = f"SELECT {COLS} FROM notify_deliveries WHERE state = 'pending' ORDER BY id"
            return list(conn.execute(q).fetchall())

        return [delivery_of(r) for r in await self._run(job, "pending")]

    async def load_cursor(self) -> int | None:
        def job(conn: sqlite3.Connection) -> Any:
            return conn.execute("SELECT ordinal FROM notify_cursor WHERE name = 'fleet'").fetchone()

        row = await self._run(job, "load_cursor")
        return int(row[0]) if row is not None else None

    async def save_cursor(self, ordinal: int) -> None:
        def job(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO notify_cursor (name, ordinal) VALUES ('fleet', ?) "
                "ON CONFLICT (name) DO UPDATE SET ordinal = max(ordinal, excluded.ordinal)",
                (ordinal,),
            )

        await self._run(job, "save_cursor")
