"""The topology switch: which backend a prosperod's stores live in (issue 12).

No database URL: standalone, every store in one SQLite file (`<data dir>/events.db`), as
always. A `postgresql://` URL: the event, config, agent-metadata and decision stores live in
that PostgreSQL database (`core/store/postgres`), over one connection pool, with the schema
created or migrated at boot (safe when replicas boot together), and the lease authority
(`leases`) under which the replicas sharing it own agents and workspaces (`core/ownership.py`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from prospero.core.errors import StoreError
from prospero.core.leases import LeaseAuthority
from prospero.core.store.automations import AutomationStore
from prospero.core.store.base import AgentMetaStore, ConfigStore, EventStore
from prospero.core.store.decisions import DecisionStore
from prospero.core.store.notifications import NotificationStore

POSTGRES_SCHEMES = ("postgresql", "postgres")


class Closable(Protocol):
    async def close(self) -> None: ...


@dataclass
class StoreBackend:
    """The stores of one prosperod. `events`, `config` and `agents` are open; `decisions` is
    opened by the DecisionService that owns it."""

    kind: Literal["sqlite", "postgres"]
    where: str  # the SQLite file, or the database URL without its password
    events: EventStore
    config: ConfigStore
    agents: AgentMetaStore
    decisions: DecisionStore
    leases: LeaseAuthority | None = None  # PostgreSQL: the `leases` table
    automations: AutomationStore | None = None  # open; closed with the backend
    notifications: NotificationStore | None = None  # open; closed with the backend
    _closers: list[Closable] = field(default_factory=list, repr=False)

    async def close(self) -> None:
        """Close the stores (the decision store is closed by its service) and release what the
        backend holds, newest first; idempotent."""
        closers, self._closers = self._closers, []
        for c in reversed(closers):
            with contextlib.suppress(Exception):
                await c.close()


def is_database_url(url: str) -> bool:
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    return scheme in POSTGRES_SCHEMES


async def open_backend(database_url: str | None, db_path: Path) -> StoreBackend:
    if not database_url:
        return await _open_sqlite(db_path)
    if not is_database_url(database_url):
        raise StoreError(
            "the database URL must be postgresql://user[:password]@host[:port]/database "
            f"(got scheme {database_url.split('://', 1)[0]!r})"
            if "://" in database_url
            else "the database URL must be postgresql://user[:password]@host[:port]/database"
        )
    return await _open_postgres(database_url)


async def _open_sqlite(db_path: Path) -> StoreBackend:
    from prospero.core.store.sqlite.agents import SqliteAgentMetaStore
    from prospero.core.store.sqlite.automations import SqliteAutomationStore
    from prospero.core.store.sqlite.decisions import SqliteDecisionStore
    from prospero.core.store.sqlite.events import SqliteConfigStore, SqliteEventStore
    from prospero.core.store.sqlite.notifications import SqliteNotificationStore

    events = SqliteEventStore(db_path)
    config = SqliteConfigStore(db_path)
    agents = SqliteAgentMetaStore(db_path)
    backend = StoreBackend(
        "sqlite", str(db_path), events, config, agents, SqliteDecisionStore(db_path)
    )
    automations = backend.automations = SqliteAutomationStore(db_path)
    notifications = backend.notifications = SqliteNotificationStore(db_path)
    try:
        for store in (events, config, agents, automations, notifications):
            await store.open()
            backend._closers.append(store)
    except BaseException:
        await backend.close()
        raise
    return backend


async def _open_postgres(url: str) -> StoreBackend:
    from prospero.core.store.postgres.agents import PostgresAgentMetaStore
    from prospero.core.store.postgres.automations import PostgresAutomationStore
    from prospero.core.store.postgres.config import PostgresConfigStore
    from prospero.core.store.postgres.db import PgDb
    from prospero.core.store.postgres.decisions import PostgresDecisionStore
    from prospero.core.store.postgres.events import PostgresEventStore
    from prospero.core.store.postgres.leases import PgLeases
    from prospero.core.store.postgres.notifications import PostgresNotificationStore

    db = PgDb(url)
    events = PostgresEventStore(db)
    config = PostgresConfigStore(db)
    agents = PostgresAgentMetaStore(db)
    leases = PgLeases(db)
    backend = StoreBackend(
        "postgres", db.where, events, config, agents, PostgresDecisionStore(db), leases
    )
    automations = backend.automations = PostgresAutomationStore(db)
    notifications = backend.notifications = PostgresNotificationStore(db)
    try:
        await db.open()
        backend._closers.append(db)
        for store in (leases, events, config, agents, automations, notifications):
            await store.open()
            backend._closers.append(store)
    except BaseException:
        await backend.close()
        raise
    return backend
