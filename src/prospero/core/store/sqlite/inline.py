"""Appends done on the event loop's own thread: the live path's group commit.

Why: on the writer thread every append costs GIL hand-offs and, on a busy machine, run-queue
waits for that thread (measured at 50 agents x 100 lines/s on 2 cores: the writer thread waited
longer to be scheduled than it ran, and an event spent ~45 ms between being queued and being
published). A commit of a live batch (tens of rows, no fsync: WAL with synchronous=NORMAL
writes to the page cache) takes a few milliseconds of plain CPU, cheaper done in place.

`InlineWriter` keeps a connection of its own, used only on the loop's thread, that never waits:
its busy timeout is 0, so when the write lock is held (the writer thread's prune or other write,
another connection, another process) the append fails at once with nothing written, and the
caller hands the batch to the writer thread instead. It never checkpoints either (a checkpoint
fsyncs): `wal_autocheckpoint` is off on it, and every CHECKPOINT_COMMITS commits (or after
CHECKPOINT_SECONDS with any) it asks the store to run a PASSIVE checkpoint on the writer thread,
which does not block writers.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from typing import TypeVar

from prospero.core.errors import StoreError
from prospero.core.store.sqlite.db import connect

log = logging.getLogger(__name__)

T = TypeVar("T")

# Ask for a checkpoint after this many inline commits, or after this long with at least one.
CHECKPOINT_COMMITS = 64
CHECKPOINT_SECONDS = 1.0

_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


class WriteLockBusy(StoreError):
    """The database's write lock was held: nothing of the append was written."""


def is_busy(e: BaseException) -> bool:
    """A sqlite3 error saying the database (or a table) is locked by someone else."""
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _BUSY_CODES
    return isinstance(e, sqlite3.OperationalError) and "locked" in str(e)


class InlineWriter:
    """A loop-thread connection for appends that never wait (see the module doc)."""

    def __init__(self, path: str, checkpoint: Callable[[], None]) -> None:
        self._path = path
        self._checkpoint = checkpoint
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._since_checkpoint = 0
        self._asked_at = time.monotonic()
        self.commits = 0  # appends done here
        self.busy = 0  # appends refused because the write lock was held

    def _open(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError("sqlite event store is closed")
        try:
            conn = connect(self._path)
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        except sqlite3.Error as e:
            raise StoreError(f"sqlite open (inline writer) failed: {e}") from e
        self._conn = conn
        return conn

    def run(self, job: Callable[[sqlite3.Connection], T]) -> T | None:
        """`job(conn)` now; None (nothing written) when it hit a held write lock."""
        conn = self._conn if self._conn is not None else self._open()
        try:
            result = job(conn)
        except WriteLockBusy:
            self.busy += 1
            return None
        self.commits += 1
        self._since_checkpoint += 1
        if self._since_checkpoint >= CHECKPOINT_COMMITS or (
            time.monotonic() - self._asked_at >= CHECKPOINT_SECONDS
        ):
            self._since_checkpoint = 0
            self._asked_at = time.monotonic()
            try:
                self._checkpoint()
            except Exception:  # a checkpoint is housekeeping: never fail the append for it
                log.exception("sqlite: requesting a WAL checkpoint failed")
        return result

    def close(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
