"""SQLite implementation of the AutomationStore seam (docs/automations.md), tables in
`events.db` (created if missing, on the store's own connection and thread):

- `automations(id PRIMARY KEY, name UNIQUE, doc JSON, secret, last_fired)`: `doc` is the
  `Automation` (its `webhook` and `last_fired` come from the columns);
- `automation_runs(seq INTEGER PRIMARY KEY, id UNIQUE, automation_id, tick, trigger,
  fired_at, state, agent_id, error, UNIQUE(automation_id, tick))`;
- `automation_signatures(automation_id, signature, seen_at, PRIMARY KEY(automation_id,
  signature))`.

`claim_run` and `claim_signature` run inside `BEGIN IMMEDIATE`, so they are atomic across
processes sharing the file too.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from prospero.core.store.automations import RUN_HISTORY, DuplicateName
from prospero.core.store.sqlite.db import LazySqliteStore, create_tables, immediate
from prospero.types.automations import Automation, AutomationRun, RunState

log = logging.getLogger(__name__)


_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS automations (
        id         TEXT PRIMARY KEY,
        name       TEXT NOT NULL UNIQUE,
        doc        TEXT NOT NULL,
        secret     TEXT,
        last_fired TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS automation_runs (
        seq           INTEGER PRIMARY KEY AUTOINCREMENT,
        id            TEXT NOT NULL UNIQUE,
        automation_id TEXT NOT NULL,
        tick          TEXT NOT NULL,
        trigger       TEXT NOT NULL,
        fired_at      TEXT NOT NULL,
        state         TEXT NOT NULL,
        agent_id      TEXT,
        error         TEXT,
        UNIQUE (automation_id, tick)
    )""",
    "CREATE INDEX IF NOT EXISTS automation_runs_by ON automation_runs (automation_id, seq)",
    """CREATE TABLE IF NOT EXISTS automation_signatures (
        automation_id TEXT NOT NULL,
        signature     TEXT NOT NULL,
        seen_at       REAL NOT NULL,
        PRIMARY KEY (automation_id, signature)
    ) WITHOUT ROWID""",
)

_RUN_COLS = "id, automation_id, tick, trigger, fired_at, state, agent_id, error"


def _init(conn: sqlite3.Connection) -> None:
    create_tables(conn, _SCHEMA)


def _doc(a: Automation) -> str:
    return a.model_dump_json(exclude={"webhook", "last_fired", "next_fire"})


def _automation(row: tuple[Any, ...]) -> Automation | None:
    id_, doc, has_secret, last_fired = row
    try:
        a = Automation.model_validate_json(doc)
    except ValidationError as e:
        log.warning("automation %r: unreadable stored row skipped: %s", id_, e)
        return None
    return a.model_copy(update={"webhook": bool(has_secret), "last_fired": last_fired})


def _run(row: tuple[Any, ...]) -> AutomationRun | None:
    try:
        return AutomationRun(**dict(zip(_RUN_COLS.split(", "), row, strict=True)))
    except ValidationError as e:
        log.warning("automation run %r: unreadable stored row skipped: %s", row[0], e)
        return None


_SELECT = "SELECT id, doc, secret IS NOT NULL, last_fired FROM automations"


class SqliteAutomationStore(LazySqliteStore):
    """AutomationStore on a SQLite file (conventionally prosperod's `events.db`)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, thread="automations", label="automation store", init=_init)

    async def create(self, automation: Automation, secret: str | None) -> None:
        def job(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(
                    "INSERT INTO automations (id, name, doc, secret, last_fired) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (automation.id, automation.name, _doc(automation), secret, None),
                )
            except sqlite3.IntegrityError as e:
                raise DuplicateName(automation.name) from e

        await self._run(job, "create")

    async def _one(self, where: str, arg: str) -> Automation | None:
        def job(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = conn.execute(
                f"{_SELECT} WHERE {where} = ?", (arg,)
            ).fetchone()
            return row

        row = await self._run(job, "get")
        return _automation(row) if row is not None else None

    async def get(self, automation_id: str) -> Automation | None:
        return await self._one("id", automation_id)

    async def by_name(self, name: str) -> Automation | None:
        return await self._one("name", name)

    async def all(self) -> list[Automation]:
        def job(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return list(conn.execute(f"{_SELECT} ORDER BY name").fetchall())

        rows = await self._run(job, "list")
        return [a for a in (_automation(r) for r in rows) if a is not None]

    async def update(self, automation: Automation) -> bool:
        def job(conn: sqlite3.Connection) -> bool:
            try:
                cur = conn.execute(
                    "UPDATE automations SET name = ?, doc = ? WHERE id = ?",
                    (automation.name, _doc(automation), automation.id),
                )
            except sqlite3.IntegrityError as e:
                raise DuplicateName(automation.name) from e
            return cur.rowcount == 1

        return await self._run(job, "update")

    async def delete(self, automation_id: str) -> bool:
        def job(conn: sqlite3.Connection) -> bool:
            def body() -> bool:
                cur = conn.execute("DELETE FROM automations WHERE id = ?", (automation_id,))
                conn.execute(
                    "DELETE FROM automation_runs WHERE automation_id = ?", (automation_id,)
                )
                conn.execute(
                    "DELETE FROM automation_signatures WHERE automation_id = ?", (automation_id,)
                )
                return cur.rowcount == 1

            return immediate(conn, body)

        return await self._run(job, "delete")

    async def secret(self, automation_id: str) -> str | None:
        def job(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT secret FROM automations WHERE id = ?", (automation_id,)
            ).fetchone()
            return None if row is None or row[0] is None else str(row[0])

        return await self._run(job, "secret")

    async def set_secret(self, automation_id: str, secret: str | None) -> bool:
        def job(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE automations SET secret = ? WHERE id = ?", (secret, automation_id)
            )
            return cur.rowcount == 1

        return await self._run(job, "set_secret")

    async def claim_run(self, run: AutomationRun, history: int = RUN_HISTORY) -> bool:
        row = (
            run.id,
            run.automation_id,
            run.tick,
            run.trigger,
            run.fired_at,
            run.state,
            run.agent_id,
            run.error,
        )

        def job(conn: sqlite3.Connection) -> bool:
            def body() -> bool:
                if (
                    conn.execute(
                        "SELECT 1 FROM automations WHERE id = ?", (run.automation_id,)
                    ).fetchone()
                    is None
                ):
                    return False
                cur = conn.execute(
                    f"INSERT OR IGNORE INTO automation_runs ({_RUN_COLS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    row,
                )
                if cur.rowcount != 1:
                    return False
                conn.execute(
                    "UPDATE automations SET last_fired = ? WHERE id = ?",
                    (run.fired_at, run.automation_id),
                )
                conn.execute(
                    "DELETE FROM automation_runs WHERE automation_id = ? AND seq NOT IN "
                    "(SELECT seq FROM automation_runs WHERE automation_id = ? "
                    "ORDER BY seq DESC LIMIT ?)",
                    (run.automation_id, run.automation_id, max(1, history)),
                )
                return True

            return immediate(conn, body)

        return await self._run(job, "claim_run")

    async def finish_run(
        self, run_id: str, state: RunState, *, agent_id: str | None, error: str | None
    ) -> None:
        def job(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE automation_runs SET state = ?, agent_id = ?, error = ? WHERE id = ?",
                (state, agent_id, error, run_id),
            )

        await self._run(job, "finish_run")

    async def abandon_runs(self, fired_before: str, error: str) -> int:
        def job(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "UPDATE automation_runs SET state = 'failed', error = ? "
                "WHERE state = 'firing' AND fired_at < ?",
                (error, fired_before),
            )
            return cur.rowcount

        return int(await self._run(job, "abandon_runs"))

    async def get_run(self, run_id: str) -> AutomationRun | None:
        def job(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = conn.execute(
                f"SELECT {_RUN_COLS} FROM automation_runs WHERE id = ?", (run_id,)
            ).fetchone()
            return row

        row = await self._run(job, "get_run")
        return _run(row) if row is not None else None

    async def runs(self, automation_id: str, limit: int = RUN_HISTORY) -> list[AutomationRun]:
        def job(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return list(
                conn.execute(
                    f"SELECT {_RUN_COLS} FROM automation_runs WHERE automation_id = ? "
                    "ORDER BY seq DESC LIMIT ?",
                    (automation_id, max(0, int(limit))),
                ).fetchall()
            )

        rows = await self._run(job, "runs")
        return [r for r in (_run(row) for row in rows) if r is not None]

    async def claim_signature(
        self, automation_id: str, signature: str, now: float, window: float
    ) -> bool:
        def job(conn: sqlite3.Connection) -> bool:
            def body() -> bool:
                conn.execute("DELETE FROM automation_signatures WHERE seen_at < ?", (now - window,))
                cur = conn.execute(
                    "INSERT OR IGNORE INTO automation_signatures (automation_id, signature, "
                    "seen_at) VALUES (?, ?, ?)",
                    (automation_id, signature, now),
                )
                return cur.rowcount == 1

            return immediate(conn, body)

        return await self._run(job, "claim_signature")
