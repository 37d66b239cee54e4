"""`SqliteConfigStore`: the ConfigStore seam (the workspace registry) on SQLite."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import orjson

from prospero.core.store.sqlite.db import LazySqliteStore
from prospero.core.store.sqlite.schema import init_schema
from prospero.types.model import RegisteredWorkspace, RepoProviderConfig

log = logging.getLogger("prospero.core.store.sqlite")


class SqliteConfigStore(LazySqliteStore):
    """Registered workspaces on a SQLite file (may be the event store's `events.db`).

    Opens lazily on first use; `open()`/`close()` are available for explicit lifecycles.
    """

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, thread="cfg", label="sqlite", init=init_schema)

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
