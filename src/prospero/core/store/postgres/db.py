"""One asyncpg pool per database, and versioned migrations that several replicas can run at
boot at the same time.

`PgDb(dsn)` is shared by the PostgreSQL stores of one prosperod (each store also accepts a DSN
and then owns a `PgDb` of its own). `open()` is idempotent and turns an unreachable or refusing
server into a `StoreError` that names the server (never the password).

`migrate(component, steps)` brings one component's tables (`events`, `config`, ...) to
`len(steps)`: each step is SQL (or an async callable taking the connection) run once, in order,
recorded in `schema_versions (component, version)`. All of it runs in one transaction under a
transaction-scoped advisory lock, so replicas booting together apply each step exactly once and
wait for each other; a database whose version is newer than this code knows is refused (an
older prosperod must not write to a schema it does not understand).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from prospero.core.errors import StoreError

# pg_advisory_xact_lock key for schema changes: any constant shared by every replica.
MIGRATION_LOCK = 0x70726F73  # "pros"

# A connection from the pool (asyncpg hands out proxies of `Connection`).
Conn = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy
Step = str | Callable[[Conn], Awaitable[None]]

SCHEMA_VERSIONS = """
CREATE TABLE IF NOT EXISTS schema_versions (
    component text PRIMARY KEY,
    version integer NOT NULL
)
"""


def redact(dsn: str) -> str:
    """The DSN without its password (for logs and errors)."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparseable database URL>"
    if parts.password is None:
        return dsn
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


class PgDb:
    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self.dsn = dsn
        self.min_size = min_size
        self.max_size = max_size
        self._pool: asyncpg.Pool | None = None
        self._lock = asyncio.Lock()

    @property
    def where(self) -> str:
        return redact(self.dsn)

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreError(f"database {self.where} is not open")
        return self._pool

    async def open(self) -> None:
        async with self._lock:
            if self._pool is not None:
                return
            try:
                self._pool = await asyncpg.create_pool(
                    self.dsn, min_size=self.min_size, max_size=self.max_size
                )
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as e:
                raise StoreError(f"cannot open database {self.where}: {e}") from e

    async def close(self) -> None:
        async with self._lock:
            pool, self._pool = self._pool, None
            if pool is not None:
                await pool.close()

    async def migrate(self, component: str, steps: Sequence[Step]) -> int:
        """Apply `component`'s steps not yet applied; returns its version afterwards."""
        target = len(steps)
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
                await conn.execute(SCHEMA_VERSIONS)
                current = await conn.fetchval(
                    "SELECT version FROM schema_versions WHERE component = $1", component
                )
                current = int(current or 0)
                if current > target:
                    raise StoreError(
                        f"database {self.where}: the {component} schema is version {current}, "
                        f"newer than this prosperod knows ({target}); upgrade prosperod"
                    )
                for step in steps[current:]:
                    if isinstance(step, str):
                        await conn.execute(step)
                    else:
                        await step(conn)
                if current != target:
                    await conn.execute(
                        "INSERT INTO schema_versions (component, version) VALUES ($1, $2) "
                        "ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version",
                        component,
                        target,
                    )
                return target
        except StoreError:
            raise
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            raise StoreError(f"database {self.where}: migrating {component} failed: {e}") from e


T = TypeVar("T")

DB_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
)


class PgComponentStore:
    """A store over one component's tables: takes a shared `PgDb` (left open at `close()`) or
    a DSN (then it owns a `PgDb` of its own and closes it at `close()`).

    Like the SQLite stores it opens lazily on first use; `open()` (idempotent) opens the pool
    and brings the component's tables to the code's version (`PgDb.migrate`). A database
    error surfaces as StoreError(f"{label} {what} failed: ...")."""

    component: str = ""
    steps: Sequence[Step] = ()
    label: str = ""

    def __init__(self, db: PgDb | str) -> None:
        self._owns = isinstance(db, str)
        self.db = PgDb(db) if isinstance(db, str) else db
        self._ready = False
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        async with self._lock:
            if self._ready:
                return
            await self.db.open()
            try:
                await self._prepare()
                await self.db.migrate(self.component, self.steps)
            except BaseException:
                if self._owns:
                    await self.db.close()
                raise
            self._ready = True

    async def _prepare(self) -> None:
        """Checks before the migration (a subclass's; none by default)."""

    async def close(self) -> None:
        async with self._lock:
            self._ready = False
            if self._owns:
                await self.db.close()

    async def _run(self, fn: Callable[[Conn], Awaitable[T]], what: str) -> T:
        if not self._ready:
            await self.open()
        try:
            async with self.db.pool.acquire() as conn:
                return await fn(conn)
        except DB_ERRORS as e:
            raise StoreError(f"{self.label} {what} failed ({self.db.where}): {e}") from e
