"""The NotificationStore conformance suite on SQLite (a real `events.db`) and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from prospero.core.store.notifications import NotificationStore
from prospero.core.store.postgres.notifications import PostgresNotificationStore
from prospero.core.store.sqlite.notifications import SqliteNotificationStore
from tests.conformance.notification_store import (
    NotificationStoreConformance,
    NotificationStoreFactory,
)


class TestSqliteNotificationStore(NotificationStoreConformance):
    @pytest.fixture
    async def notification_store_factory(
        self, tmp_path: Path
    ) -> AsyncIterator[NotificationStoreFactory]:
        opened: list[SqliteNotificationStore] = []

        async def make() -> NotificationStore:
            s = SqliteNotificationStore(tmp_path / "events.db")
            await s.open()
            opened.append(s)
            return s

        yield make
        for s in opened:
            await s.close()


class TestPostgresNotificationStore(NotificationStoreConformance):
    @pytest.fixture
    async def notification_store_factory(
        self, pg_dsn: str
    ) -> AsyncIterator[NotificationStoreFactory]:
        opened: list[PostgresNotificationStore] = []

        async def make() -> NotificationStore:
            s = PostgresNotificationStore(pg_dsn)
            await s.open()
            opened.append(s)
            return s

        yield make
        for s in opened:
            await s.close()
