"""`PostgresAutomationStore`: the AutomationStore seam (docs/automations.md) on PostgreSQL,
shared by every replica of a cluster.

Component `automations`, tables (the SQLite layout; compared text is `COLLATE "C"`):

- `automations(id PRIMARY KEY, name UNIQUE, doc JSON text, secret, last_fired)`;
- `automation_runs(seq identity, id UNIQUE, automation_id, tick, trigger, fired_at, state,
  agent_id, error, UNIQUE(automation_id, tick))`;
- `automation_signatures(automation_id, signature, seen_at, PRIMARY KEY(automation_id,
  signature))`.

`claim_run` is `INSERT ... ON CONFLICT (automation_id, tick) DO NOTHING` in a transaction that
first locks the automation's row (`FOR UPDATE`, so a concurrent delete and the history prune
serialise): of replicas claiming one tick, exactly one inserts. `claim_signature` likewise
inserts on conflict do nothing.
"""

from __future__ import annotations

import logging

import asyncpg
from pydantic import ValidationError

from prospero.core.store.automations import RUN_HISTORY, DuplicateName
from prospero.core.store.postgres.config import affected
from prospero.core.store.postgres.db import Conn, PgComponentStore, Step
from prospero.types.automations import Automation, AutomationRun, RunState

log = logging.getLogger(__name__)

STEPS: tuple[Step, ...] = (
    """CREATE TABLE automations (
        id         text COLLATE "C" PRIMARY KEY,
        name       text COLLATE "C" NOT NULL UNIQUE,
        doc        text NOT NULL,
        secret     text,
        last_fired text
    );
    CREATE TABLE automation_runs (
        seq           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id            text COLLATE "C" NOT NULL UNIQUE,
        automation_id text COLLATE "C" NOT NULL,
        tick          text COLLATE "C" NOT NULL,
        trigger       text NOT NULL,
        fired_at      text NOT NULL,
        state         text NOT NULL,
        agent_id      text,
        error         text,
        UNIQUE (automation_id, tick)
    );
    CREATE INDEX automation_runs_by ON automation_runs (automation_id, seq);
    CREATE TABLE automation_signatures (
        automation_id text COLLATE "C" NOT NULL,
        signature     text COLLATE "C" NOT NULL,
        seen_at       double precision NOT NULL,
        PRIMARY KEY (automation_id, signature)
    )""",
)

_RUN_FIELDS = ("id", "automation_id", "tick", "trigger", "fired_at", "state", "agent_id", "error")
_RUN_COLS = ", ".join(_RUN_FIELDS)
_SELECT = "SELECT id, doc, secret IS NOT NULL AS has_secret, last_fired FROM automations"


def _doc(a: Automation) -> str:
    # PostgreSQL text holds no NUL; JSON escapes it.
    return a.model_dump_json(exclude={"webhook", "last_fired", "next_fire"})


def _automation(row: asyncpg.Record) -> Automation | None:
    try:
        a = Automation.model_validate_json(row["doc"])
    except ValidationError as e:
        log.warning("automation %r: unreadable stored row skipped: %s", row["id"], e)
        return None
    return a.model_copy(
        update={"webhook": bool(row["has_secret"]), "last_fired": row["last_fired"]}
    )


def _run(row: asyncpg.Record) -> AutomationRun | None:
    try:
        return AutomationRun(**{f: row[f] for f in _RUN_FIELDS})
    except ValidationError as e:
        log.warning("automation run %r: unreadable stored row skipped: %s", row["id"], e)
        return None


class PostgresAutomationStore(PgComponentStore):
    """AutomationStore on PostgreSQL (component `automations`)."""

    component = "automations"
    steps = STEPS
    label = "postgres automation store"

    async def create(self, automation: Automation, secret: str | None) -> None:
        async def job(conn: Conn) -> None:
            try:
                await conn.execute(
                    "INSERT INTO automations (id, name, doc, secret) VALUES ($1, $2, $3, $4)",
                    automation.id,
                    automation.name,
                    _doc(automation),
                    secret,
                )
            except asyncpg.UniqueViolationError as e:
                raise DuplicateName(automation.name) from e

        await self._run(job, "create")

    async def _one(self, col: str, arg: str) -> Automation | None:
        async def job(conn: Conn) -> asyncpg.Record | None:
            row: asyncpg.Record | None = await conn.fetchrow(f"{_SELECT} WHERE {col} = $1", arg)
            return row

        row = await self._run(job, "get")
        return _automation(row) if row is not None else None

    async def get(self, automation_id: str) -> Automation | None:
        return await self._one("id", automation_id)

    async def by_name(self, name: str) -> Automation | None:
        return await self._one("name", name)

    async def all(self) -> list[Automation]:
        async def job(conn: Conn) -> list[asyncpg.Record]:
            return list(await conn.fetch(f"{_SELECT} ORDER BY name"))

        rows = await self._run(job, "list")
        return [a for a in (_automation(r) for r in rows) if a is not None]

    async def update(self, automation: Automation) -> bool:
        async def job(conn: Conn) -> bool:
            try:
                status = await conn.execute(
                    "UPDATE automations SET name = $1, doc = $2 WHERE id = $3",
                    automation.name,
                    _doc(automation),
                    automation.id,
                )
            except asyncpg.UniqueViolationError as e:
                raise DuplicateName(automation.name) from e
            return bool(status == "UPDATE 1")

        return await self._run(job, "update")

    async def delete(self, automation_id: str) -> bool:
        async def job(conn: Conn) -> bool:
            async with conn.transaction():
                status = await conn.execute("DELETE FROM automations WHERE id = $1", automation_id)
                await conn.execute(
                    "DELETE FROM automation_runs WHERE automation_id = $1", automation_id
                )
                await conn.execute(
                    "DELETE FROM automation_signatures WHERE automation_id = $1", automation_id
                )
            return bool(status == "DELETE 1")

        return await self._run(job, "delete")

    async def secret(self, automation_id: str) -> str | None:
        async def job(conn: Conn) -> str | None:
            value = await conn.fetchval(
                "SELECT secret FROM automations WHERE id = $1", automation_id
            )
            return None if value is None else str(value)

        return await self._run(job, "secret")

    async def set_secret(self, automation_id: str, secret: str | None) -> bool:
        async def job(conn: Conn) -> bool:
            status = await conn.execute(
                "UPDATE automations SET secret = $1 WHERE id = $2", secret, automation_id
            )
            return bool(status == "UPDATE 1")

        return await self._run(job, "set_secret")

    async def claim_run(self, run: AutomationRun, history: int = RUN_HISTORY) -> bool:
        async def job(conn: Conn) -> bool:
            async with conn.transaction():
                found = await conn.fetchval(
                    "SELECT 1 FROM automations WHERE id = $1 FOR UPDATE", run.automation_id
                )
                if found is None:
                    return False
                status = await conn.execute(
                    f"INSERT INTO automation_runs ({_RUN_COLS}) VALUES "
                    "($1, $2, $3, $4, $5, $6, $7, $8) "
                    "ON CONFLICT (automation_id, tick) DO NOTHING",
                    run.id,
                    run.automation_id,
                    run.tick,
                    run.trigger,
                    run.fired_at,
                    run.state,
                    run.agent_id,
                    run.error,
                )
                if status != "INSERT 0 1":
                    return False
                await conn.execute(
                    "UPDATE automations SET last_fired = $1 WHERE id = $2",
                    run.fired_at,
                    run.automation_id,
                )
                await conn.execute(
                    "DELETE FROM automation_runs WHERE automation_id = $1 AND seq NOT IN "
                    "(SELECT seq FROM automation_runs WHERE automation_id = $1 "
                    "ORDER BY seq DESC LIMIT $2)",
                    run.automation_id,
                    max(1, history),
                )
                return True

        return await self._run(job, "claim_run")

    async def finish_run(
        self, run_id: str, state: RunState, *, agent_id: str | None, error: str | None
    ) -> None:
        async def job(conn: Conn) -> None:
            await conn.execute(
                "UPDATE automation_runs SET state = $1, agent_id = $2, error = $3 WHERE id = $4",
                state,
                agent_id,
                None if error is None else error.replace("\x00", "\\0"),
                run_id,
            )

        await self._run(job, "finish_run")

    async def abandon_runs(self, fired_before: str, error: str) -> int:
        async def job(conn: Conn) -> int:
            status: str = await conn.execute(
                "UPDATE automation_runs SET state = 'failed', error = $1 "
                "WHERE state = 'firing' AND fired_at < $2",
                error,
                fired_before,
            )
            return affected(status)

        return int(await self._run(job, "abandon_runs"))

    async def get_run(self, run_id: str) -> AutomationRun | None:
        async def job(conn: Conn) -> asyncpg.Record | None:
            row: asyncpg.Record | None = await conn.fetchrow(
                f"SELECT {_RUN_COLS} FROM automation_runs WHERE id = $1", run_id
            )
            return row

        row = await self._run(job, "get_run")
        return _run(row) if row is not None else None

    async def runs(self, automation_id: str, limit: int = RUN_HISTORY) -> list[AutomationRun]:
        async def job(conn: Conn) -> list[asyncpg.Record]:
            return list(
                await conn.fetch(
                    f"SELECT {_RUN_COLS} FROM automation_runs WHERE automation_id = $1 "
                    "ORDER BY seq DESC LIMIT $2",
                    automation_id,
                    max(0, int(limit)),
                )
            )

        rows = await self._run(job, "runs")
        return [r for r in (_run(row) for row in rows) if r is not None]

    async def claim_signature(
        self, automation_id: str, signature: str, now: float, window: float
    ) -> bool:
        async def job(conn: Conn) -> bool:
            async with conn.transaction():
                await conn.execute(
                    "DELETE FROM automation_signatures WHERE seen_at < $1", now - window
                )
                status = await conn.execute(
                    "INSERT INTO automation_signatures (automation_id, signature, seen_at) "
                    "VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                    automation_id,
                    signature,
                    now,
                )
            return bool(status == "INSERT 0 1")

        return await self._run(job, "claim_signature")
