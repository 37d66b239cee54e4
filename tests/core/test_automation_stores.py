"""The AutomationStore conformance suite on SQLite (a real `events.db`) and PostgreSQL (a
throwaway server), plus PostgreSQL's schema version."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from prospero.core.store.automations import AutomationStore
from prospero.core.store.postgres import automations as pg_automations
from prospero.core.store.postgres.automations import PostgresAutomationStore
from prospero.core.store.postgres.db import PgDb
from prospero.core.store.sqlite.automations import SqliteAutomationStore
from tests.conformance.automation_store import AutomationStoreConformance, AutomationStoreFactory


class TestSqliteAutomationStore(AutomationStoreConformance):
    @pytest.fixture
    async def automation_store_factory(
        self, tmp_path: Path
    ) -> AsyncIterator[AutomationStoreFactory]:
        opened: list[SqliteAutomationStore] = []

        async def make() -> AutomationStore:
            s = SqliteAutomationStore(tmp_path / "events.db")
            await s.open()
            opened.append(s)
            return s

        yield make
        for s in opened:
            await s.close()


class TestPostgresAutomationStore(AutomationStoreConformance):
    @pytest.fixture
    async def automation_store_factory(self, pg_dsn: str) -> AsyncIterator[AutomationStoreFactory]:
        opened: list[PostgresAutomationStore] = []

        async def make() -> AutomationStore:
            s = PostgresAutomationStore(pg_dsn)
            await s.open()
            opened.append(s)
            return s

        yield make
        for s in opened:
            await s.close()


async def test_postgres_schema_version_is_recorded(pg_dsn: str) -> None:
    db = PgDb(pg_dsn)
    store = PostgresAutomationStore(db)
    try:
        await store.open()
        version = await db.pool.fetchval(
            "SELECT version FROM schema_versions WHERE component = 'automations'"
        )
        assert version == len(pg_automations.STEPS)
    finally:
        await store.close()
        await db.close()
