"""`PostgresConfigStore`: the ConfigStore seam (the workspace registry) on PostgreSQL, and
(`PgComponentStore`, the base of the PostgreSQL stores, is in `db.py`.)

Component `config`, tables:

- `workspaces(name PRIMARY KEY, root, config JSON as text)`; names compare byte-wise
  (`COLLATE "C"`), so `list_workspaces` is in the same order as SQLite's, whatever the
  database's locale.
"""

from __future__ import annotations

import logging
from typing import TypeVar

import asyncpg
import orjson

from prospero.core.store.postgres.db import DB_ERRORS as DB_ERRORS
from prospero.core.store.postgres.db import Conn, PgComponentStore, Step
from prospero.types.model import RegisteredWorkspace, RepoProviderConfig

log = logging.getLogger("prospero.core.store.postgres")

T = TypeVar("T")

# What a failed statement or a lost connection raises (asyncpg's errors, socket errors).
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
