"""PgDb on a real throwaway PostgreSQL (`pg_dsn`): versioned migrations that replicas booting
together apply once, a newer schema refused, errors that never show the password, an
idempotent open/close."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from prospero.core.errors import StoreError
from prospero.core.store.postgres.db import Conn, PgDb, Step, redact
from prospero.testkit.postgres import free_port

SECRET = "s3cr3t-Pa55"


def with_password(dsn: str, password: str = SECRET) -> str:
    parts = urlsplit(dsn)
    user, host = parts.netloc.rsplit("@", 1)
    return urlunsplit(parts._replace(netloc=f"{user.split(':')[0]}:{password}@{host}"))


async def log_step(conn: Conn) -> None:
    await conn.execute("INSERT INTO applied (step) VALUES ('callable')")


# Each step fails if it ever runs twice (no IF NOT EXISTS, a unique column).
STEPS: list[Step] = [
    "CREATE TABLE applied (step text PRIMARY KEY)",
    "INSERT INTO applied (step) VALUES ('two')",
    log_step,
    "CREATE TABLE widgets (id integer PRIMARY KEY); INSERT INTO applied (step) VALUES ('four')",
]


@pytest.fixture
async def dbs(pg_dsn: str) -> AsyncIterator[list[PgDb]]:
    made = [PgDb(pg_dsn, max_size=2) for _ in range(5)]
    yield made
    for db in made:
        await db.close()


async def applied(db: PgDb) -> list[str]:
    async with db.pool.acquire() as conn:
        return [r[0] for r in await conn.fetch("SELECT step FROM applied ORDER BY step")]


async def version(db: PgDb, component: str) -> int | None:
    async with db.pool.acquire() as conn:
        v = await conn.fetchval(
            "SELECT version FROM schema_versions WHERE component = $1", component
        )
        return None if v is None else int(v)


async def test_concurrent_boots_apply_each_step_once(dbs: list[PgDb]) -> None:
    await asyncio.gather(*(db.open() for db in dbs))
    versions = await asyncio.gather(*(db.migrate("widgets", STEPS[:3]) for db in dbs))
    assert versions == [3] * 5
    assert await applied(dbs[0]) == ["callable", "two"]
    assert await version(dbs[0], "widgets") == 3
    # a newer prosperod adds a step; five replicas boot with it at once: applied once
    versions = await asyncio.gather(*(db.migrate("widgets", STEPS) for db in dbs))
    assert versions == [4] * 5
    assert await applied(dbs[1]) == ["callable", "four", "two"]
    assert await version(dbs[2], "widgets") == 4
    # up to date: nothing runs again
    assert await dbs[3].migrate("widgets", STEPS) == 4
    assert await applied(dbs[3]) == ["callable", "four", "two"]


async def test_components_are_versioned_separately(dbs: list[PgDb]) -> None:
    db = dbs[0]
    await db.open()
    assert await db.migrate("widgets", STEPS[:2]) == 2
    other: list[Step] = ["CREATE TABLE gadgets (id integer)"]
    assert await db.migrate("gadgets", other) == 1
    assert await db.migrate("nothing", []) == 0
    assert (await version(db, "widgets"), await version(db, "gadgets")) == (2, 1)
    assert await version(db, "nothing") is None


async def test_a_newer_schema_is_refused(dbs: list[PgDb]) -> None:
    new, old = dbs[0], dbs[1]
    await new.open()
    await new.migrate("widgets", STEPS)
    await old.open()
    with pytest.raises(StoreError) as err:
        await old.migrate("widgets", STEPS[:2])
    msg = str(err.value)
    assert "widgets schema is version 4" in msg and "(2)" in msg and "upgrade prosperod" in msg
    # nothing changed
    assert await version(old, "widgets") == 4
    assert await applied(old) == ["callable", "four", "two"]


async def test_a_failing_step_applies_nothing(dbs: list[PgDb]) -> None:
    db = dbs[0]
    await db.open()
    await db.migrate("widgets", STEPS[:1])
    broken: list[Step] = [*STEPS[:2], "INSERT INTO no_such_table VALUES (1)"]
    with pytest.raises(StoreError, match="migrating widgets failed"):
        await db.migrate("widgets", broken)
    # the whole migration rolled back: step two is not there, the version did not move
    assert await applied(db) == []
    assert await version(db, "widgets") == 1
    assert await db.migrate("widgets", STEPS) == 4


async def test_unreachable_server_is_a_store_error_without_the_password() -> None:
    port = free_port()  # nothing listens there
    dsn = f"postgresql://prospero:{SECRET}@127.0.0.1:{port}/prospero"
    db = PgDb(dsn)
    with pytest.raises(StoreError) as err:
        await db.open()
    msg = str(err.value)
    assert SECRET not in msg and f"127.0.0.1:{port}" in msg and "cannot open database" in msg
    assert SECRET not in db.where
    with pytest.raises(StoreError, match="not open") as err:
        _ = db.pool
    assert SECRET not in str(err.value)
    await db.close()  # nothing to close: fine


async def test_refusing_server_is_a_store_error_without_the_password(pg_dsn: str) -> None:
    missing = with_password(pg_dsn.rsplit("/", 1)[0] + "/no_such_database")
    db = PgDb(missing)
    with pytest.raises(StoreError) as err:
        await db.open()
    msg = str(err.value)
    assert SECRET not in msg and "no_such_database" in msg
    await db.close()


async def test_open_close_idempotent(pg_dsn: str) -> None:
    db = PgDb(with_password(pg_dsn))  # trust auth: the password is ignored
    assert SECRET not in db.where and ":***@" in db.where
    await asyncio.gather(db.open(), db.open())
    pool = db.pool
    await db.open()
    assert db.pool is pool
    assert await db.pool.fetchval("SELECT 1") == 1
    await db.close()
    await db.close()
    with pytest.raises(StoreError, match="not open"):
        _ = db.pool
    with pytest.raises(StoreError, match="not open"):
        await db.migrate("widgets", STEPS)
    # reopened after a close: a new pool that works
    await db.open()
    assert db.pool is not pool
    assert await db.migrate("widgets", STEPS) == 4
    await db.close()


async def test_lost_connection_during_migrate_is_a_store_error(pg_dsn: str) -> None:
    db = PgDb(pg_dsn, min_size=1, max_size=1)
    await db.open()

    async def die(conn: Conn) -> None:
        # the server ends this very connection mid-migration
        await conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    try:
        with pytest.raises(StoreError, match="migrating widgets failed"):
            await db.migrate("widgets", [STEPS[0], die])
    finally:
        await db.close()
    check = await asyncpg.connect(pg_dsn)
    try:
        assert await check.fetchval("SELECT to_regclass('applied')") is None
    finally:
        await check.close()


def test_redact() -> None:
    assert redact(f"postgresql://u:{SECRET}@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"
    assert redact(f"postgresql://u:{SECRET}@h/db?sslmode=require").endswith("?sslmode=require")
    assert SECRET not in redact(f"postgres://:{SECRET}@h/db")
