"""`PostgresEventStore`: the EventStore seam on PostgreSQL (asyncpg), for prosperod replicas
sharing one database. Same behaviour as `SqliteEventStore` (the reference; both pass
`tests/conformance/eventstore.py`); the schema and statements are `events_sql.py`, the rows
(kind JSON, `kind_tag`, poison reduction, usage folding, raw splicing) `rows.py`, shared with
SQLite.

Appending: the batch's rows (`rows.encode_batch`; a poison kind is stored reduced and replaced
in the caller's list) go in as one `INSERT ... SELECT ... FROM unnest(...)` that takes the
ordinals from the one-row `fleet_head` counter in the same statement. Ordinal order is therefore
commit order, with no hole left by a failed append (see `events_sql`): a reader following
`replay_fleet_raw(after)` never skips an ordinal. A batch without usage rows or cursors is that
one statement, atomic on its own; otherwise one transaction writes the usage deltas, then the
cursors (each in key order, so concurrent appenders cannot deadlock), then the events last,
which keeps the counter's row lock held as briefly as possible. A duplicate `(stream_key, seq)`,
stored or within the batch, is `SeqConflict` with nothing written; any other failure (a lost
connection, a value the server refuses) is `StoreError`.

Fencing (`fences=`, `capabilities.fenced_appends`): a replica writes under leases (agent ids,
`repo:<workspace>`; `core/ownership.py`) that another may take over once it stops renewing.
An append given fences always takes the transaction path and first share-locks, in key order,
the `leases` rows (`PgLeases`' table) still held by each fence's owner with its epoch and
not expired on the database clock (`events_sql.FENCE_CHECK`); any fence not found is
`FenceLost(keys)`, raised with nothing written. The lock makes a takeover wait for the append,
so no write under an old epoch ever commits after the new holder got the key (the new holder
then reads the high water it continues from). Lock order: lease rows, usage, cursors, counter.
Without fences nothing reads the `leases` table (it need not exist).

`append_batch` takes what the emitter queues: `FleetEvent`s, `EventRun`s (a run counts as its
events, in order) and `CursorMark`s (the `cursors` rows written in the same transaction; the
last mark of a key wins, `cursors=` after every mark). There is no synchronous append path
(no `pipelined_appends` / `inline_appends` capability: those are SQLite's), the emitter drives
`append_batch`; `capabilities.shared`: other replicas append to the same tables.

Reads are single statements (one snapshot each) on pooled connections; `scan_kinds` reads in one
REPEATABLE READ, read-only transaction. `last_ordinal` is the counter, so it never goes back,
even when retention deleted the newest rows.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

import asyncpg

from prospero.core.errors import FenceLost, SeqConflict, StoreError
from prospero.core.store.base import (
    AppendEntry,
    CursorMark,
    Fence,
    KindScan,
    RawEvent,
    StoreCapabilities,
    StoredEvent,
    UsageDay,
)
from prospero.core.store.postgres import events_sql as sql
from prospero.core.store.postgres.db import Conn, PgComponentStore
from prospero.core.store.rows import OUTCOMES, encode_batch, raw_events, row_to_event
from prospero.types.events import EventRun, FleetEvent

log = logging.getLogger(__name__)

T = TypeVar("T")

COMPONENT = "events"

# Rows deleted per retention statement: keeps each transaction short.
PRUNE_CHUNK = 5000

# What a failed statement or a lost connection raises (asyncpg's errors, socket errors; a
# string the driver cannot encode).
_DB_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    UnicodeError,
)


class PostgresEventStore(PgComponentStore):
    """Durable event store on PostgreSQL. Takes a shared `PgDb` (left open at `close()`) or a
    DSN (then it owns a `PgDb` of its own, closed at `close()`). Call `open()` before use
    (unlike the smaller stores it does not open itself on first use).
    Shared: other prosperods may append to the same database at the same time."""

    capabilities = StoreCapabilities(shared=True, fenced_appends=True)
    component = COMPONENT
    steps = sql.STEPS
    label = "postgres event store"

    async def _prepare(self) -> None:
        await self._check_encoding()

    async def _check_encoding(self) -> None:
        """The stored kind JSON must come back as the same UTF-8 bytes (`convert_to`)."""
        try:
            enc = await self.db.pool.fetchval("SELECT current_setting('server_encoding')")
        except _DB_ERRORS as e:
            raise StoreError(f"database {self.db.where}: open failed: {e}") from e
        if enc != "UTF8":
            raise StoreError(
                f"database {self.db.where} has encoding {enc}; the event store needs UTF8 "
                "(CREATE DATABASE ... ENCODING 'UTF8')"
            )

    def _pool(self) -> asyncpg.Pool:
        if not self._ready:
            raise StoreError(f"{self.label} is not open")
        return self.db.pool

    async def _run(self, fn: Callable[[Conn], Awaitable[T]], what: str) -> T:
        pool = self._pool()
        try:
            async with pool.acquire() as conn:
                return await fn(conn)
        except SeqConflict:
            raise
        except StoreError:
            raise
        except _DB_ERRORS as e:
            raise StoreError(f"postgres {what} failed ({self.db.where}): {e}") from e

    # -- writes --------------------------------------------------------------------------

    async def append_batch(
        self,
        events: Sequence[AppendEntry],
        *,
        cursors: Mapping[str, bytes] | None = None,
        fences: Collection[Fence] | None = None,
    ) -> list[int]:
        n = 0
        marks: dict[str, bytes] = {}
        for e in events:
            t = type(e)
            if t is EventRun:
                n += len(e)  # type: ignore[arg-type]
            elif t is CursorMark:
                marks[e.key] = e.data  # type: ignore[union-attr]
            else:
                n += 1
        if cursors:
            marks.update(cursors)
        if n == 0 and not marks:
            return []
        rows: list[tuple[Any, ...]] = []
        usage: list[tuple[Any, ...]] = []
        if n:
            rows, usage = encode_batch(events)
            if len(rows) != n:  # (cannot happen: every event has its row)
                raise StoreError(f"postgres append: {len(rows)} rows for {n} events")
        usage.sort(key=lambda r: (r[0], r[1]))
        keys = sorted(marks)
        cols = [list(c) for c in zip(*rows, strict=True)] if rows else []
        guard = _fence_args(fences) if fences else None

        async def insert(conn: Conn) -> int:
            last = await conn.fetchval(sql.INSERT_EVENTS, *cols, n)
            return int(last)

        async def job(conn: Conn) -> int:
            if guard is None:
                if not usage and not keys:
                    return await insert(conn)  # one statement: atomic on its own
                if not n and not usage:  # cursors alone: one statement
                    await conn.execute(sql.UPSERT_CURSORS, keys, [bytes(marks[k]) for k in keys])
                    return 0
            async with conn.transaction():
                # Lease rows, then usage, then cursors, then the counter: one lock order for
                # every appender.
                if guard is not None:
                    await _check_fences(conn, guard)
                if usage:
                    await conn.execute(
                        sql.UPSERT_USAGE, *[list(c) for c in zip(*usage, strict=True)]
                    )
                if keys:
                    await conn.execute(sql.UPSERT_CURSORS, keys, [bytes(marks[k]) for k in keys])
                return await insert(conn) if n else 0

        attempt = 0
        while True:
            try:
                last = await self._run(job, "append")
                break
            except FenceLost:
                raise
            except StoreError as e:
                cause = e.__cause__
                if (
                    isinstance(cause, asyncpg.UniqueViolationError)
                    and cause.constraint_name == sql.SEQ_CONSTRAINT
                ):
                    raise SeqConflict(f"(stream_key, seq) already stored: {cause}") from cause
                if guard is not None and isinstance(cause, _RETRYABLE) and attempt < _RETRIES:
                    # A fenced append share-locks lease rows that a renewal may be updating in
                    # another order: the server broke the cycle by rolling this one back
                    # entirely. Nothing was written: try again.
                    attempt += 1
                    log.info("postgres append: retrying after %s", type(cause).__name__)
                    continue
                raise
        return list(range(last - n + 1, last + 1)) if n else []

    async def save_cursor(self, key: str, data: bytes) -> None:
        async def job(conn: Conn) -> None:
            await conn.execute(sql.UPSERT_CURSOR, key, bytes(data))

        await self._run(job, "save_cursor")

    async def prune(self, before_ts: str) -> int:
        async def chunk(conn: Conn) -> int:
            return int(await conn.fetchval(sql.PRUNE_CHUNK_SQL, before_ts, PRUNE_CHUNK))

        total = 0
        while True:
            # One short statement (its own transaction) per chunk: appends interleave.
            n = await self._run(chunk, "prune")
            total += n
            if n < PRUNE_CHUNK:
                return total

    async def writable(self) -> bool:
        async def probe(conn: Conn) -> bool:
            tx = conn.transaction()
            await tx.start()
            try:
                if await conn.fetchval("SELECT pg_is_in_recovery()"):
                    return False
                await conn.execute(sql.WRITABLE_PROBE)
            finally:
                await tx.rollback()
            return True

        try:
            ok = await self._run(probe, "writable")
        except StoreError as e:
            log.warning("postgres store %s is not writable: %s", self.db.where, e)
            return False
        if not ok:
            log.warning("postgres store %s is not writable: in recovery", self.db.where)
        return ok

    # -- reads ---------------------------------------------------------------------------

    async def replay(
        self,
        stream_key: str,
        from_seq: int = 0,
        limit: int | None = None,
        *,
        kinds: Collection[str] | None = None,
    ) -> list[FleetEvent]:
        records = await self._replay(stream_key, from_seq, limit, kinds, sql.EVENT_COLS)
        return [ev for ev in map(row_to_event, records) if ev is not None]

    async def replay_raw(
        self,
        stream_key: str,
        from_seq: int = 0,
        limit: int | None = None,
        *,
        kinds: Collection[str] | None = None,
    ) -> list[RawEvent]:
        records = await self._replay(stream_key, from_seq, limit, kinds, sql.RAW_COLS)
        return raw_events(records, False)

    async def _replay(
        self,
        stream_key: str,
        from_seq: int,
        limit: int | None,
        kinds: Collection[str] | None,
        cols: str,
    ) -> list[Any]:
        tags = sorted(set(kinds)) if kinds is not None else None
        if tags is not None and not tags:
            return []
        if limit is not None and limit < 0:  # as SQLite's LIMIT -1: no limit
            limit = None
        args: list[Any] = [stream_key, from_seq, limit]
        if tags is not None:
            args.append(tags)
        query = sql.replay_sql(cols, tags is not None)

        async def job(conn: Conn) -> list[Any]:
            # kind_tag filters before any JSON is decoded.
            return list(await conn.fetch(query, *args))

        return await self._run(job, "replay")

    async def replay_fleet(
        self, after_ordinal: int = 0, limit: int | None = None
    ) -> list[StoredEvent]:
        out: list[StoredEvent] = []
        for r in await self._fleet(after_ordinal, limit, sql.EVENT_COLS):
            ev = row_to_event(tuple(r)[1:])
            if ev is not None:
                out.append(StoredEvent(r[0], ev))
        return out

    async def replay_fleet_raw(
        self,
        after_ordinal: int = 0,
        limit: int | None = None,
        *,
        kinds: Collection[str] | None = None,
    ) -> list[RawEvent]:
        tags = sorted(set(kinds)) if kinds is not None else None
        if tags == []:
            return []
        return raw_events(await self._fleet(after_ordinal, limit, sql.RAW_COLS, tags), True)

    async def _fleet(
        self, after_ordinal: int, limit: int | None, cols: str, tags: list[str] | None = None
    ) -> list[Any]:
        if limit is not None and limit < 0:
            limit = None
        query = sql.replay_fleet_sql(cols, kinds=tags is not None)
        args = (after_ordinal, limit) if tags is None else (after_ordinal, limit, tags)

        async def job(conn: Conn) -> list[Any]:
            return list(await conn.fetch(query, *args))

        return await self._run(job, "replay_fleet")

    async def high_water(self, stream_key: str) -> int:
        async def job(conn: Conn) -> int:
            return int(await conn.fetchval(sql.HIGH_WATER, stream_key) or 0)

        return await self._run(job, "high_water")

    async def last_ordinal(self) -> int:
        async def job(conn: Conn) -> int:
            return int(await conn.fetchval(sql.LAST_ORDINAL) or 0)

        return await self._run(job, "last_ordinal")

    async def scan_kinds(
        self,
        streams: Collection[str],
        kinds: Collection[str],
        *,
        after_ordinal: int = 0,
        known: Collection[str] = (),
    ) -> KindScan:
        wanted = set(streams)
        known_set = wanted.intersection(known)
        fresh = sorted(wanted - known_set)
        tags = sorted(set(kinds))
        after = max(0, after_ordinal)

        async def scan(conn: Conn) -> KindScan:
            last = max(after, int(await conn.fetchval(sql.LAST_ORDINAL) or 0))
            rows: list[tuple[str, int, bytes]] = []
            if tags and fresh and after > 0:
                # What the caller has not folded of its new streams, up to after_ordinal.
                rows += [tuple(r) for r in await conn.fetch(sql.SCAN_OLDER, fresh, after, tags)]
            if tags and wanted and last > after:
                # What is new, every asked-for stream; kind_tag tested before any JSON.
                rows += [
                    tuple(r)
                    for r in await conn.fetch(sql.SCAN_NEW, after, last, tags, sorted(wanted))
                ]
            changed = list(fresh)
            if known_set and last > after:
                changed += [
                    r[0] for r in await conn.fetch(sql.SCAN_MOVED, after, last, sorted(known_set))
                ]
            heads: dict[str, int] = {}
            if changed:
                for k, hw in await conn.fetch(sql.HIGH_WATERS, changed):
                    heads[k] = int(hw)
            return KindScan(last_ordinal=last, heads=heads, rows=rows)

        async def job(conn: Conn) -> KindScan:
            # One snapshot for every statement: the counter and the rows agree.
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                return await scan(conn)

        return await self._run(job, "scan_kinds")

    async def usage(self, since_day: str, until_day: str) -> list[UsageDay]:
        async def job(conn: Conn) -> list[UsageDay]:
            return [
                UsageDay(
                    workspace=r[0],
                    day=r[1],
                    input_tokens=r[2],
                    output_tokens=r[3],
                    cost_usd=r[4],
                    turns=r[5],
                    runs=r[6],
                    outcomes=dict(zip(OUTCOMES, tuple(r)[7:12], strict=True)),
                )
                for r in await conn.fetch(sql.USAGE, since_day, until_day)
            ]

        return await self._run(job, "usage")

    async def load_cursor(self, key: str) -> bytes | None:
        async def job(conn: Conn) -> bytes | None:
            data = await conn.fetchval(sql.LOAD_CURSOR, key)
            return None if data is None else bytes(data)

        return await self._run(job, "load_cursor")


# A fenced append the server rolled back to break a lock cycle (see `append_batch`): retried.
_RETRYABLE = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)
_RETRIES = 3


def _fence_args(fences: Collection[Fence]) -> tuple[list[str], list[str], list[int]]:
    """The distinct fences as `FENCE_CHECK`'s three arrays, in key order."""
    triples = sorted({(f.key, f.owner, int(f.epoch)) for f in fences})
    return [t[0] for t in triples], [t[1] for t in triples], [t[2] for t in triples]


async def _check_fences(conn: Conn, guard: tuple[list[str], list[str], list[int]]) -> None:
    """In the append's transaction: share-lock the lease rows of every fence still held, or
    raise `FenceLost` with the keys of those that are not (the transaction then rolls back:
    nothing of the batch is written). No `leases` table (no lease was ever taken on this
    database): every fence is lost."""
    keys, owners, epochs = guard
    try:
        rows = await conn.fetch(sql.FENCE_CHECK, keys, owners, epochs)
    except asyncpg.UndefinedTableError:
        raise FenceLost(sorted(set(keys))) from None
    held = {(r[0], r[1], int(r[2])) for r in rows}
    lost = sorted(
        {k for k, o, e in zip(keys, owners, epochs, strict=True) if (k, o, e) not in held}
    )
    if lost:
        raise FenceLost(lost)
