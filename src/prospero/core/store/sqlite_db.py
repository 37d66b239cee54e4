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
from typing import TypeVar

from prospero.core.errors import StoreError

log = logging.getLogger(__name__)

T = TypeVar("T")

BUSY_TIMEOUT_MS = 5000


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
