"""`PostgresNotificationStore`: the NotificationStore seam on PostgreSQL (component
`notifications`), shared by a cluster's replicas: the SQLite layout; `claim` is `INSERT ... ON
CONFLICT (target_id, ordinal) DO NOTHING`, so of replicas claiming one event for one target
exactly one inserts (and sends)."""

from __future__ import annotations

import logging

import asyncpg

from prospero.core.store.notifications import DELIVERY_LOG, DuplicateTarget
from prospero.core.store.postgres.db import Conn, PgComponentStore, Step
from prospero.core.store.sqlite.notifications import COLS, FIELDS, target_doc, target_of
from prospero.types.notifications import Delivery, DeliveryState, NotificationTarget

log = logging.getLogger(__name__)

STEPS: tuple[Step, ...] = (
    """CREATE TABLE notify_targets (
        id   text COLLATE "C" PRIMARY KEY,
        name text COLLATE "C" NOT NULL UNIQUE,
        doc  text NOT NULL
    );
    CREATE TABLE notify_deliveries (
        id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        target_id   text COLLATE "C" NOT NULL,
        ordinal     bigint,
        event       text NOT NULL,
        agent_id    text,
        workspace   text,
        summary     text NOT NULL,
        state       text NOT NULL,
        attempts    integer NOT NULL,
        http_status integer,
        error       text,
        created_at  text NOT NULL,
        updated_at  text NOT NULL,
        UNIQUE (target_id, ordinal)
    );
    CREATE INDEX notify_deliveries_by ON notify_deliveries (target_id, id);
    CREATE TABLE notify_cursor (
        name    text PRIMARY KEY,
        ordinal bigint NOT NULL
    )""",
)


def _delivery(row: asyncpg.Record) -> Delivery:
    return Delivery(**{f: row[f] for f in FIELDS})


def _text(s: str | None) -> str | None:
    return None if s is None else s.replace("\x00", "\ufffd")  # text holds no NUL


class PostgresNotificationStore(PgComponentStore):
    component = "notifications"
    steps = STEPS
    label = "postgres notification store"

    async def create_target(self, target: NotificationTarget) -> None:
        async def job(conn: Conn) -> None:
            try:
                await conn.execute(
                    "INSERT INTO notify_targets (id, name, doc) VALUES ($1, $2, $3)",
                    target.id,
                    target.name,
                    target_doc(target),
                )
            except asyncpg.UniqueViolationError as e:
                raise DuplicateTarget(target.name) from e

        await self._run(job, "create")

    async def get_target(self, target_id: str) -> NotificationTarget | None:
        async def job(conn: Conn) -> str | None:
            doc: str | None = await conn.fetchval(
                "SELECT doc FROM notify_targets WHERE id = $1", target_id
            )
            return doc

        doc = await self._run(job, "get")
        return target_of(doc) if doc is not None else None

    async def targets(self) -> list[NotificationTarget]:
        async def job(conn: Conn) -> list[asyncpg.Record]:
            return list(await conn.fetch("SELECT doc FROM notify_targets ORDER BY name"))

        rows = await self._run(job, "list")
        return [t for t in (target_of(r["doc"]) for r in rows) if t is not None]

    async def update_target(self, target: NotificationTarget) -> bool:
        async def job(conn: Conn) -> bool:
            try:
                status = await conn.execute(
                    "UPDATE notify_targets SET name = $1, doc = $2 WHERE id = $3",
                    target.name,
                    target_doc(target),
                    target.id,
                )
            except asyncpg.UniqueViolationError as e:
                raise DuplicateTarget(target.name) from e
            return bool(status.endswith(" 1"))

        return await self._run(job, "update")

    async def delete_target(self, target_id: str) -> bool:
        async def job(conn: Conn) -> bool:
            async with conn.transaction():
                status = await conn.execute("DELETE FROM notify_targets WHERE id = $1", target_id)
                await conn.execute("DELETE FROM notify_deliveries WHERE target_id = $1", target_id)
            return bool(status.endswith(" 1"))

        return await self._run(job, "delete")

    async def claim(self, delivery: Delivery, keep: int = DELIVERY_LOG) -> int | None:
        d = delivery

        async def job(conn: Conn) -> int | None:
            async with conn.transaction():
                new: int | None = await conn.fetchval(
                    "INSERT INTO notify_deliveries (target_id, ordinal, event, agent_id, "
                    "workspace, summary, state, attempts, created_at, updated_at) VALUES "
                    "($1, $2, $3, $4, $5, $6, 'pending', 0, $7, $7) "
                    "ON CONFLICT (target_id, ordinal) DO NOTHING RETURNING id",
                    d.target_id,
                    d.ordinal,
                    d.event,
                    _text(d.agent_id),
                    _text(d.workspace),
                    _text(d.summary),
                    d.created_at,
                )
                if new is not None:
                    await conn.execute(
                        "DELETE FROM notify_deliveries WHERE target_id = $1 AND id <= "
                        "(SELECT id FROM notify_deliveries WHERE target_id = $1 "
                        "ORDER BY id DESC LIMIT 1 OFFSET $2)",
                        d.target_id,
                        max(1, keep),
                    )
            return new

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
        async def job(conn: Conn) -> None:
            await conn.execute(
                "UPDATE notify_deliveries SET state = $1, attempts = $2, http_status = $3, "
                "error = $4, updated_at = $5 WHERE id = $6",
                state,
                attempts,
                http_status,
                _text(error),
                at,
                delivery_id,
            )

        await self._run(job, "finish")

    async def deliveries(self, target_id: str | None = None, limit: int = 100) -> list[Delivery]:
        async def job(conn: Conn) -> list[asyncpg.Record]:
            if target_id is None:
                return list(
                    await conn.fetch(
                        f"SELECT {COLS} FROM notify_deliveries ORDER BY id DESC LIMIT $1",
                        max(0, limit),
                    )
                )
            return list(
                await conn.fetch(
                    f"SELECT {COLS} FROM notify_deliveries WHERE target_id = $1 "
                    "ORDER BY id DESC LIMIT $2",
                    target_id,
                    max(0, limit),
                )
            )

        return [_delivery(r) for r in await self._run(job, "deliveries")]

    async def pending(self) -> list[Delivery]:
        async def job(conn: Conn) -> list[asyncpg.Record]:
            return list(
                await conn.fetch(
                    f"SELECT {COLS} FROM notify_deliveries WHERE state = 'pending' ORDER BY id"
                )
            )

        return [_delivery(r) for r in await self._run(job, "pending")]

    async def load_cursor(self) -> int | None:
        async def job(conn: Conn) -> int | None:
            v: int | None = await conn.fetchval(
                "SELECT ordinal FROM notify_cursor WHERE name = 'fleet'"
            )
            return v

        v = await self._run(job, "load_cursor")
        return int(v) if v is not None else None

    async def save_cursor(self, ordinal: int) -> None:
        async def job(conn: Conn) -> None:
            await conn.execute(
                "INSERT INTO notify_cursor (name, ordinal) VALUES ('fleet', $1) "
                "ON CONFLICT (name) DO UPDATE SET ordinal = "
                "GREATEST(notify_cursor.ordinal, excluded.ordinal)",
                ordinal,
            )

        await self._run(job, "save_cursor")
