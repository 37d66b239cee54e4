"""SQLite implementation of the AgentMetaStore seam: Prospero's own per-agent metadata.

The table lives in the same file as the events (`events.db`), created if missing, never
touching the event store's schema version:

- `agent_meta(agent_id PRIMARY KEY, workspace, meta JSON)`; `meta` is the AgentMeta as JSON
  (unknown keys are ignored on read, so a newer prosperod's rows stay readable).

Like the config and decision stores it keeps its own connection pinned to its own thread
(SqliteDb); metadata is written once per spawn or adoption and read once per agent per
process, so one connection serves both.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from pydantic import ValidationError

from prospero.core.store.sqlite.db import LazySqliteStore
from prospero.types.model import AgentMeta

log = logging.getLogger(__name__)

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS agent_meta (
        agent_id  TEXT PRIMARY KEY,
        workspace TEXT NOT NULL,
        meta      TEXT NOT NULL
    )""",
)


def _init(conn: sqlite3.Connection) -> None:
    for stmt in _SCHEMA:
        conn.execute(stmt)


def _parse(agent_id: str, raw: str) -> AgentMeta | None:
    try:
        return AgentMeta.model_validate_json(raw)
    except ValidationError as e:
        log.warning("agent %s: unreadable stored metadata, ignored: %s", agent_id, e)
        return None


class SqliteAgentMetaStore(LazySqliteStore):
    """AgentMeta rows on a SQLite file (normally the event store's `events.db`).

    Opens lazily on first use; `open()`/`close()` are available for explicit lifecycles."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(
            path, thread="agents", label="agent metadata", init=_init, open_what="store open"
        )

    async def get_meta(self, agent_id: str) -> AgentMeta | None:
        def job(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT meta FROM agent_meta WHERE agent_id = ?", (agent_id,)
            ).fetchone()
            return str(row[0]) if row is not None else None

        raw = await self._run(job, "get")
        return _parse(agent_id, raw) if raw is not None else None

    async def put_meta(self, meta: AgentMeta) -> None:
        data = meta.model_dump_json()

        def job(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO agent_meta (agent_id, workspace, meta) VALUES (?, ?, ?) "
                "ON CONFLICT (agent_id) DO UPDATE SET workspace = excluded.workspace, "
                "meta = excluded.meta",
                (meta.agent_id, meta.workspace, data),
            )

        await self._run(job, "put")

    async def list_meta(self) -> list[AgentMeta]:
        def job(conn: sqlite3.Connection) -> list[tuple[str, str]]:
            rows = conn.execute("SELECT agent_id, meta FROM agent_meta ORDER BY agent_id")
            return [(str(a), str(m)) for a, m in rows.fetchall()]

        out: list[AgentMeta] = []
        for agent_id, raw in await self._run(job, "list"):
            meta = _parse(agent_id, raw)
            if meta is not None:
                out.append(meta)
        return out

    async def delete_meta(self, agent_id: str) -> bool:
        def job(conn: sqlite3.Connection) -> bool:
            cur = conn.execute("DELETE FROM agent_meta WHERE agent_id = ?", (agent_id,))
            return cur.rowcount > 0

        return await self._run(job, "delete")


class MemoryAgentMetaStore:
    """An in-process AgentMetaStore (tests, and managers built without a SQLite file)."""

    def __init__(self) -> None:
        self._rows: dict[str, AgentMeta] = {}

    async def get_meta(self, agent_id: str) -> AgentMeta | None:
        meta = self._rows.get(agent_id)
        return meta.model_copy() if meta is not None else None

    async def put_meta(self, meta: AgentMeta) -> None:
        self._rows[meta.agent_id] = meta.model_copy()

    async def list_meta(self) -> list[AgentMeta]:
        return [self._rows[k].model_copy() for k in sorted(self._rows)]

    async def delete_meta(self, agent_id: str) -> bool:
        return self._rows.pop(agent_id, None) is not None

    async def close(self) -> None:
        return None
