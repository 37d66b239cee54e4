"""`PostgresConfigStore`: the ConfigStore seam (the workspace registry) on PostgreSQL, and
`PgComponentStore`, the base of the small PostgreSQL stores (config, agents, decisions).

Component `config`, tables:

- `workspaces(name PRIMARY KEY, root, config JSON as text)`; names compare byte-wise
  (`COLLATE "C"`), so `list_workspaces` is in the same order as SQLite's, whatever the
  database's locale.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import asyncpg
import orjson

from prospero.core.errors import StoreError
from prospero.core.store.postgres.db import Conn, PgDb, Step
from prospero.types.model import RegisteredWorkspace, RepoProviderConfig

log = logging.getLogger("prospero.core.store.postgres")

T = TypeVar("T")

# What a failed statement or a lost connection raises (asyncpg's errors, socket errors).
DB_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
)


class PgComponentStore:
    """A store over one component's tables: takes a shared `PgDb` (left open at `close()`) or
    a DSN (then it owns a `PgDb` of its own and closes it at `close()`).

    Like the SQLite stores it opens lazily on first use; `open()` (idempotent) opens the pool
    and brings the component's tables to the code's version (`PgDb.migrate`). A database
    error surfaces as StoreError(f"{label} {what} failed: ...")."""

    component: str = ""
    steps: Sequence[Step] = ()
    label: str = ""

    def __init__(self, db: PgDb | str) -> None:
        self._owns = isinstance(db, str)
        self.db = PgDb(db) if isinstance(db, str) else db
        self._ready = False
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        async with self._lock:
            if self._ready:
                return
            await self.db.open()
            try:
                await self.db.migrate(self.component, self.steps)
            except BaseException:
                if self._owns:
                    await self.db.close()
                raise
            self._ready = True

    async def close(self) -> None:
        async with self._lock:
            self._ready = False
            if self._owns:
                await self.db.close()

    async def _run(self, fn: Callable[[Conn], Awaitable[T]], what: str) -> T:
        if not self._ready:
            await self.open()
        try:
            async with self.db.pool.acquire() as conn:
                return await fn(conn)
        except DB_ERRORS as e:
            raise StoreError(f"{self.label} {what} failed ({self.db.where}): {e}") from e


STEPS: tuple[Step, ...] = (
    """CREATE TABLE workspaces (
        name   text COLLATE "C" PRIMARY KEY,
        root   text NOT NULL,
        config text NOT NULL
    )""",
)


def _workspace(name: str, root: str, config: str) -> RegisteredWorkspace:
    try:
        cfg = RepoProviderConfig.model_validate(orjson.loads(config))
    except ValueError as e:
        log.warning("workspace %r: unreadable stored config, using defaults: %s", name, e)
        cfg = RepoProviderConfig()
    return RegisteredWorkspace(name=name, root=root, config=cfg)


class PostgresConfigStore(PgComponentStore):
    """Registered workspaces on PostgreSQL (component `config`)."""

    component = "config"
    steps = STEPS
    label = "postgres config store"

    async def list_workspaces(self) -> list[RegisteredWorkspace]:
        async def job(conn: Conn) -> list[asyncpg.Record]:
            return list(await conn.fetch("SELECT name, root, config FROM workspaces ORDER BY name"))

        rows = await self._run(job, "list_workspaces")
        return [_workspace(r["name"], r["root"], r["config"]) for r in rows]

    async def upsert_workspace(self, ws: RegisteredWorkspace) -> None:
        config = ws.config.model_dump_json(exclude_none=True)

        async def job(conn: Conn) -> None:
            await conn.execute(
                "INSERT INTO workspaces (name, root, config) VALUES ($1, $2, $3) "
                "ON CONFLICT (name) DO UPDATE SET root = EXCLUDED.root, config = EXCLUDED.config",
                ws.name,
                ws.root,
                config,
            )

        await self._run(job, "upsert_workspace")

    async def delete_workspace(self, name: str) -> bool:
        async def job(conn: Conn) -> bool:
            status = await conn.execute("DELETE FROM workspaces WHERE name = $1", name)
            return affected(status) > 0

        return await self._run(job, "delete_workspace")


def affected(status: str) -> int:
    """Rows affected, from a command tag such as `DELETE 1` / `UPDATE 0`."""
    try:
        return int(status.rsplit(" ", 1)[-1])
    except ValueError:
        return 0
