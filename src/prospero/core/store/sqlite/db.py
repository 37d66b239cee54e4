"""One SQLite connection pinned to its own thread, shared by every SQLite-backed store.

sqlite3 releases the GIL inside each statement, so running a store's work on a dedicated
thread overlaps it with the event loop; pinning one connection to one thread keeps its
transactions serial.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from prospero.core.errors import StoreError

log = logging.getLogger(__name__)

T = TypeVar("T")

BUSY_TIMEOUT_MS = 5000


def immediate(conn: sqlite3.Connection, fn: Callable[[], T]) -> T:
    """`fn()` in one `BEGIN IMMEDIATE` transaction: committed, or rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        out = fn()
        conn.execute("COMMIT")
        return out
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def create_tables(conn: sqlite3.Connection, statements: tuple[str, ...]) -> None:
    """A store's schema (`CREATE ... IF NOT EXISTS` statements), in one transaction."""

    def body() -> None:
        for stmt in statements:
            conn.execute(stmt)

    immediate(conn, body)


def connect(path: str) -> sqlite3.Connection:
    # isolation_level=None: autocommit; transactions are explicit (BEGIN IMMEDIATE).
    conn = sqlite3.connect(
        path,
        timeout=BUSY_TIMEOUT_MS / 1000,
        isolation_level=None,
        check_same_thread=False,
    )
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
    if mode is None or str(mode[0]).lower() != "wal":
        log.warning("sqlite %s: could not enable WAL (journal_mode=%s)", path, mode)
    # In WAL mode NORMAL is safe against application crashes; only an OS crash / power loss
    # can lose the last commits (never corrupt the file).
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = OFF")
    return conn


class SqliteDb:
    """One sqlite connection pinned to its own single-thread executor."""

    def __init__(self, path: str, name: str) -> None:
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sqlite-{name}")
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        def _open() -> None:
            if self._conn is None:
                self._conn = connect(self._path)

        await asyncio.get_running_loop().run_in_executor(self._executor, _open)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def job() -> T:
            if self._conn is None:
                raise StoreError("sqlite store is not open")
            return fn(self._conn)

        loop = asyncio.get_running_loop()
        try:
            fut = loop.run_in_executor(self._executor, job)
        except RuntimeError as e:  # executor shut down
            raise StoreError(f"sqlite store is closed: {e}") from e
        return await fut

    def submit(self, fn: Callable[[sqlite3.Connection], T]) -> Future[T]:
        """Queue `fn` on the connection's thread now; a failed submission is a failed future."""

        def job() -> T:
            if self._conn is None:
                raise StoreError("sqlite store is not open")
            return fn(self._conn)

        try:
            return self._executor.submit(job)
        except RuntimeError as e:  # executor shut down
            failed: Future[T] = Future()
            failed.set_exception(StoreError(f"sqlite store is closed: {e}"))
            return failed

    async def close(self) -> None:
        def _close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, _close)
        except RuntimeError:
            pass
        self._executor.shutdown(wait=True)


class LazySqliteStore:
    """Base of a store that keeps one SqliteDb of its own, opened lazily on first use
    (`open()`/`close()` are available for explicit lifecycles).

    `init` runs on the connection once it is open (schema creation); a sqlite3 error there
    or in `_run` surfaces as StoreError(f"{label} {what} failed: ..."), where `what` is
    `open_what` for the open."""

    def __init__(
        self,
        path: str | Path,
        *,
        thread: str,
        label: str,
        init: Callable[[sqlite3.Connection], None],
        open_what: str = "open",
    ) -> None:
        self.path = str(path)
        self._db: SqliteDb | None = None
        self._lock = asyncio.Lock()
        self._thread = thread
        self._label = label
        self._init = init
        self._open_what = open_what

    def _error(self, e: sqlite3.Error, what: str) -> StoreError:
        return StoreError(f"{self._label} {what} failed: {e}")

    async def open(self) -> None:
        async with self._lock:
            if self._db is not None:
                return
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = SqliteDb(self.path, self._thread)
            try:
                await db.open()
                await db.run(self._init)
            except Exception as e:
                await db.close()
                if isinstance(e, sqlite3.Error):
                    raise self._error(e, self._open_what) from e
                raise
            self._db = db

    async def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await db.close()

    async def _run(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        if self._db is None:
            await self.open()
        db = self._db
        if db is None:
            raise StoreError(f"{self._label} is closed")
        try:
            return await db.run(fn)
        except sqlite3.Error as e:
            raise self._error(e, what) from e
