"""`PostgresAgentMetaStore`: the AgentMetaStore seam (Prospero's own per-agent metadata) on
PostgreSQL.

Component `agents`, tables:

- `agent_meta(agent_id PRIMARY KEY, workspace, meta JSON as text)`; `meta` is the AgentMeta
  as JSON (unknown keys are ignored on read, so a newer prosperod's rows stay readable; an
  unreadable row is logged and skipped, as SQLite does). Agent ids compare byte-wise
  (`COLLATE "C"`) so `list_meta` is in the same order as SQLite's.
"""

from __future__ import annotations

import logging

import asyncpg
from pydantic import ValidationError

from prospero.core.store.postgres.config import affected
from prospero.core.store.postgres.db import Conn, PgComponentStore, Step
from prospero.types.model import AgentMeta

log = logging.getLogger(__name__)

STEPS: tuple[Step, ...] = (
    """CREATE TABLE agent_meta (
        agent_id  text COLLATE "C" PRIMARY KEY,
        workspace text NOT NULL,
        meta      text NOT NULL
    )""",
)


def _parse(agent_id: str, raw: str) -> AgentMeta | None:
    try:
        return AgentMeta.model_validate_json(raw)
    except ValidationError as e:
        log.warning("agent %s: unreadable stored metadata, ignored: %s", agent_id, e)
        return None


class PostgresAgentMetaStore(PgComponentStore):
    """AgentMeta rows on PostgreSQL (component `agents`)."""

    component = "agents"
    steps = STEPS
    label = "postgres agent metadata"

    async def get_meta(self, agent_id: str) -> AgentMeta | None:
        async def job(conn: Conn) -> str | None:
            raw = await conn.fetchval("SELECT meta FROM agent_meta WHERE agent_id = $1", agent_id)
            return str(raw) if raw is not None else None

        raw = await self._run(job, "get")
        return _parse(agent_id, raw) if raw is not None else None

    async def put_meta(self, meta: AgentMeta) -> None:
        data = meta.model_dump_json()

        async def job(conn: Conn) -> None:
            await conn.execute(
                "INSERT INTO agent_meta (agent_id, workspace, meta) VALUES ($1, $2, $3) "
                "ON CONFLICT (agent_id) DO UPDATE SET workspace = EXCLUDED.workspace, "
                "meta = EXCLUDED.meta",
                meta.agent_id,
                meta.workspace,
                data,
            )

        await self._run(job, "put")

    async def list_meta(self) -> list[AgentMeta]:
        async def job(conn: Conn) -> list[asyncpg.Record]:
            return list(await conn.fetch("SELECT agent_id, meta FROM agent_meta ORDER BY agent_id"))

        out: list[AgentMeta] = []
        for row in await self._run(job, "list"):
            meta = _parse(row["agent_id"], row["meta"])
            if meta is not None:
                out.append(meta)
        return out

    async def delete_meta(self, agent_id: str) -> bool:
        async def job(conn: Conn) -> bool:
            status = await conn.execute("DELETE FROM agent_meta WHERE agent_id = $1", agent_id)
            return affected(status) > 0

        return await self._run(job, "delete")
