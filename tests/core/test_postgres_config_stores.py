"""PostgreSQL (a real throwaway server, `pg_dsn`): the ConfigStore, AgentMetaStore and
DecisionStore conformance suites, plus what is PostgreSQL's own: a shared PgDb, the schema
versions of each component, byte-wise order whatever the database locale, unreadable rows."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from prospero.core.errors import StoreError
from prospero.core.store.base import AgentMetaStore, ConfigStore
from prospero.core.store.decisions import DecisionStore
from prospero.core.store.postgres import agents as pg_agents
from prospero.core.store.postgres import config as pg_config
from prospero.core.store.postgres import decisions as pg_decisions
from prospero.core.store.postgres.agents import PostgresAgentMetaStore
from prospero.core.store.postgres.config import PgComponentStore, PostgresConfigStore
from prospero.core.store.postgres.db import PgDb
from prospero.core.store.postgres.decisions import PostgresDecisionStore
from prospero.types.model import RegisteredWorkspace
from tests.conformance.agent_meta_store import (
    AgentMetaStoreConformance,
    AgentMetaStoreFactory,
    meta,
)
from tests.conformance.decision_store import (
    DecisionStoreConformance,
    DecisionStoreFactory,
    decision,
)
from tests.conformance.eventstore import ConfigStoreConformance, ConfigStoreFactory


class TestPostgresConfigStore(ConfigStoreConformance):
    @pytest.fixture
    async def config_store_factory(self, pg_dsn: str) -> AsyncIterator[ConfigStoreFactory]:
        opened: list[PostgresConfigStore] = []

        async def make() -> ConfigStore:
            s = PostgresConfigStore(pg_dsn)
            await s.open()
            opened.append(s)
            return s

        yield make
        for s in opened:
            await s.close()


class TestPostgresAgentMetaStore(AgentMetaStoreConformance):
    @pytest.fixture
    async def agent_meta_store_factory(self, pg_dsn: str) -> AsyncIterator[AgentMetaStoreFactory]:
        opened: list[PostgresAgentMetaStore] = []

        async def make() -> AgentMetaStore:
            s = PostgresAgentMetaStore(pg_dsn)
            await s.open()
            opened.append(s)
            return s

        yield make
        for s in opened:
            await s.close()


class TestPostgresDecisionStore(DecisionStoreConformance):
    @pytest.fixture
    async def decision_store_factory(self, pg_dsn: str) -> AsyncIterator[DecisionStoreFactory]:
        opened: list[PostgresDecisionStore] = []

        async def make() -> DecisionStore:
            s = PostgresDecisionStore(pg_dsn)
            await s.open()
            opened.append(s)
            return s

        yield make
        for s in opened:
            await s.close()


# ---- PostgreSQL's own -------------------------------------------------------------------------


@pytest.fixture
async def shared(pg_dsn: str) -> AsyncIterator[PgDb]:
    db = PgDb(pg_dsn)
    await db.open()
    yield db
    await db.close()


async def test_stores_share_one_pgdb_and_leave_it_open(shared: PgDb) -> None:
    cfg = PostgresConfigStore(shared)
    agents = PostgresAgentMetaStore(shared)
    decisions = PostgresDecisionStore(shared)
    # lazy: the first use opens and migrates
    await cfg.upsert_workspace(RegisteredWorkspace(name="w", root="/w"))
    await agents.put_meta(meta())
    await decisions.insert(decision("d1"))
    for store in (cfg, agents, decisions):
        await store.close()
        await store.close()
    # the shared pool is still open and everything is there
    async with shared.pool.acquire() as conn:
        rows = await conn.fetch("SELECT component, version FROM schema_versions")
        versions = {r["component"]: r["version"] for r in rows}
        assert await conn.fetchval("SELECT count(*) FROM workspaces") == 1
    assert versions == {
        "config": len(pg_config.STEPS),
        "agents": len(pg_agents.STEPS),
        "decisions": len(pg_decisions.STEPS),
    }
    # a closed store on a shared db reopens lazily, like the SQLite ones
    assert [m.agent_id for m in await agents.list_meta()] == ["a1"]
    await agents.close()


async def test_an_owned_pgdb_is_closed_with_the_store(pg_dsn: str) -> None:
    store = PostgresConfigStore(pg_dsn)
    await store.open()
    await store.open()  # idempotent
    await store.upsert_workspace(RegisteredWorkspace(name="w", root="/w"))
    await store.close()
    with pytest.raises(StoreError, match="not open"):
        _ = store.db.pool
    # used again: reopens on its own
    assert [w.name for w in await store.list_workspaces()] == ["w"]
    await store.close()


@pytest.fixture
async def icu_dsn(pg_dsn: str) -> AsyncIterator[str]:
    """A database whose default collation is linguistic (ICU en-US), not byte order."""
    name = f"icu_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(
            f'CREATE DATABASE "{name}" TEMPLATE template0 LOCALE_PROVIDER icu '
            "ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
        )
        yield pg_dsn.rsplit("/", 1)[0] + f"/{name}"
        await conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def test_order_is_bytewise_whatever_the_database_locale(icu_dsn: str) -> None:
    """The compared columns are COLLATE "C": on a database whose default collation is
    linguistic, the stores still list in SQLite's (byte) order."""
    names = ["b", "B", "a", "_a", "A-1"]
    stamps = ["2026-01-01T00:00:00.5+00:00", "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00Z"]
    conn = await asyncpg.connect(icu_dsn)
    try:
        linguistic = [
            r[0] for r in await conn.fetch("SELECT x FROM unnest($1::text[]) x ORDER BY x", names)
        ]
        lingo_stamps = [
            r[0] for r in await conn.fetch("SELECT x FROM unnest($1::text[]) x ORDER BY x", stamps)
        ]
    finally:
        await conn.close()
    # the database's own order differs (else this test would prove nothing)
    assert linguistic != sorted(names) and lingo_stamps != sorted(stamps)
    db = PgDb(icu_dsn)
    cfg, agents, decisions = (
        PostgresConfigStore(db),
        PostgresAgentMetaStore(db),
        PostgresDecisionStore(db),
    )
    try:
        for n in names:
            await cfg.upsert_workspace(RegisteredWorkspace(name=n, root=f"/{n}"))
            await agents.put_meta(meta(n))
        for i, stamp in enumerate(stamps):
            await decisions.insert(decision(f"d{i}", created_at=stamp))
        assert [w.name for w in await cfg.list_workspaces()] == sorted(names)
        assert [m.agent_id for m in await agents.list_meta()] == sorted(names)
        assert [d.created_at for d in await decisions.query()] == sorted(stamps)
        assert [d.created_at for d in await decisions.query(limit=2)] == sorted(stamps)[1:]
    finally:
        for store in (cfg, agents, decisions):
            await store.close()
        await db.close()


async def test_unreadable_rows_are_skipped_not_fatal(pg_dsn: str) -> None:
    db = PgDb(pg_dsn)
    agents = PostgresAgentMetaStore(db)
    decisions = PostgresDecisionStore(db)
    cfg = PostgresConfigStore(db)
    try:
        await agents.put_meta(meta("a1"))
        await decisions.insert(decision("d1", 1))
        await decisions.insert(decision("d2", 2))
        await cfg.upsert_workspace(RegisteredWorkspace(name="w", root="/w"))
        async with db.pool.acquire() as conn:
            await conn.execute("INSERT INTO agent_meta VALUES ('zz', 'ws', '{\"nope\":')")
            await conn.execute("UPDATE decisions SET options = '[{\"label\": 1' WHERE id = 'd1'")
            await conn.execute(
                "INSERT INTO decision_policies VALUES ('ws', '{\"posture\": \"sideways\"}')"
            )
            await conn.execute("UPDATE workspaces SET config = 'not json'")
        assert await agents.get_meta("zz") is None
        assert [m.agent_id for m in await agents.list_meta()] == ["a1"]
        assert await decisions.get("d1") is None
        assert [d.id for d in await decisions.query()] == ["d2"]
        assert await decisions.get_policy("ws") is None
        [ws] = await cfg.list_workspaces()
        assert ws == RegisteredWorkspace(name="w", root="/w")
    finally:
        for store in (agents, decisions, cfg):
            await store.close()
        await db.close()


async def test_database_errors_are_store_errors(pg_dsn: str) -> None:
    store = PostgresDecisionStore(pg_dsn)
    try:
        await store.insert(decision("d1"))
        async with store.db.pool.acquire() as conn:
            await conn.execute("DROP TABLE decision_policies")
        with pytest.raises(StoreError, match="postgres decision store get_policy failed"):
            await store.get_policy("ws")
        # the store is still usable for what still exists
        assert (await store.get("d1")) == decision("d1")
    finally:
        await store.close()


async def test_a_newer_schema_is_refused_at_open(pg_dsn: str) -> None:
    store = PostgresDecisionStore(pg_dsn)
    await store.open()
    async with store.db.pool.acquire() as conn:
        await conn.execute("UPDATE schema_versions SET version = 99 WHERE component = 'decisions'")
    await store.close()
    again = PostgresDecisionStore(pg_dsn)
    with pytest.raises(StoreError, match="decisions schema is version 99"):
        await again.open()
    # the failed open left no pool behind
    with pytest.raises(StoreError, match="not open"):
        _ = again.db.pool
    await again.close()


def test_every_pg_store_is_a_component_store() -> None:
    for cls, component in (
        (PostgresConfigStore, "config"),
        (PostgresAgentMetaStore, "agents"),
        (PostgresDecisionStore, "decisions"),
    ):
        assert issubclass(cls, PgComponentStore) and cls.component == component
    assert isinstance(PostgresConfigStore("postgresql://x@127.0.0.1:1/db"), ConfigStore)
    assert isinstance(PostgresAgentMetaStore("postgresql://x@127.0.0.1:1/db"), AgentMetaStore)
    assert isinstance(PostgresDecisionStore("postgresql://x@127.0.0.1:1/db"), DecisionStore)
