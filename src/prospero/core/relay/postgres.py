"""`PgRelay`: calls between replicas sharing one PostgreSQL database (`relay_calls` + NOTIFY).

A call is a row. The caller inserts it and, in the same statement, sends
`NOTIFY prospero_relay '["<target>", "<id>"]'` (delivered at commit); the target, listening on
its own connection, *claims* the row with a conditional update (`claimed_at IS NULL` and before
the caller's deadline, so a call runs at most once and never after its caller gave up), runs the
handler, stores the outcome and sends `NOTIFY prospero_relay_done '<id>'` in the statement that
stores it. The caller wakes on that doorbell, reads the outcome and deletes the row.

Nothing depends on a NOTIFY arriving: the target also claims its unclaimed calls every
`heal_interval` (a doorbell lost, or sent while its LISTEN connection was down), and a waiting
caller reads its row that often. At its deadline the caller withdraws an unclaimed call
(`DELETE ... WHERE claimed_at IS NULL`): then nothing was done and it says so; a claimed one
without an outcome is reported as possibly applied. Rows whose caller died are deleted once
they are `GC_AFTER` past their deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import asyncpg
import orjson

from prospero.core.aio import wait_for
from prospero.core.errors import StoreError
from prospero.core.relay.base import (
    DEFAULT_TIMEOUT,
    RELAY_OPS,
    Handler,
    RelayedCall,
    RelayOp,
    RelayOutcome,
    RelayUnanswered,
)
from prospero.core.store.postgres.db import Conn, PgComponentStore, PgDb, Step, redact

log = logging.getLogger(__name__)

CALLS_CHANNEL = "prospero_relay"
DONE_CHANNEL = "prospero_relay_done"
HEAL_INTERVAL = 0.5
GC_AFTER = 600.0  # seconds past a call's deadline
RECONNECT_MAX = 5.0

STEPS: list[Step] = [
    """
    CREATE TABLE relay_calls (
        id text PRIMARY KEY,
        target text NOT NULL,
        agent_id text NOT NULL,
        op text NOT NULL,
        args jsonb NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        expires_at timestamptz NOT NULL,
        claimed_at timestamptz,
        done_at timestamptz,
        result jsonb
    );
    CREATE INDEX relay_calls_unclaimed ON relay_calls (target) WHERE claimed_at IS NULL;
    """,
]

SEND = f"""
WITH ins AS (
    INSERT INTO relay_calls (id, target, agent_id, op, args, expires_at)
    VALUES ($1, $2, $3, $4, $5::jsonb, now() + make_interval(secs => $6::float8))
    RETURNING id
)
SELECT pg_notify('{CALLS_CHANNEL}', $7) FROM ins
"""

CLAIM_COLS = "id, target, agent_id, op, args::text AS args"
CLAIM_ONE = f"""
UPDATE relay_calls SET claimed_at = now()
WHERE id = $1 AND target = $2 AND claimed_at IS NULL AND expires_at > now()
RETURNING {CLAIM_COLS}
"""
CLAIM_ALL = f"""
UPDATE relay_calls SET claimed_at = now()
WHERE target = $1 AND claimed_at IS NULL AND expires_at > now()
RETURNING {CLAIM_COLS}
"""
FINISH = f"""
WITH u AS (
    UPDATE relay_calls SET done_at = now(), result = $2::jsonb WHERE id = $1 RETURNING id
)
SELECT pg_notify('{DONE_CHANNEL}', id) FROM u
"""
WITHDRAW = "DELETE FROM relay_calls WHERE id = $1 AND claimed_at IS NULL RETURNING id"
# The outcome, read and deleted in one statement (None: not answered yet).
COLLECT = "DELETE FROM relay_calls WHERE id = $1 AND done_at IS NOT NULL RETURNING result::text"
GC = "DELETE FROM relay_calls WHERE expires_at < now() - make_interval(secs => $1::float8)"


class PgRelay(PgComponentStore):
    component = "relay"
    steps = STEPS
    label = "relay"

    def __init__(
        self,
        db: PgDb | str,
        replica_id: str,
        *,
        heal_interval: float = HEAL_INTERVAL,
    ) -> None:
        super().__init__(db)
        self.replica_id = replica_id
        self.heal_interval = heal_interval
        self._handler: Handler | None = None
        self._conn: asyncpg.Connection | None = None
        self._waiting: dict[str, asyncio.Event] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._keeper: asyncio.Task[None] | None = None
        self._closed = False
        self._since_gc = 0.0

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self, handler: Handler) -> None:
        await self.open()
        self._handler = handler
        await self._listen()
        self._keeper = asyncio.create_task(self._keep(), name=f"relay-{self.replica_id}")

    async def close(self) -> None:
        self._closed = True
        tasks = [t for t in (self._keeper, *self._running) if t is not None]
        self._keeper = None
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=2)
            except Exception:
                conn.terminate()
        await super().close()

    async def _listen(self) -> None:
        try:
            conn = await asyncpg.connect(self.db.dsn)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as e:
            raise StoreError(f"relay: cannot connect to {redact(self.db.dsn)}: {e}") from e
        try:
            await conn.add_listener(CALLS_CHANNEL, self._on_call)
            await conn.add_listener(DONE_CHANNEL, self._on_done)
        except BaseException:
            await conn.close()
            raise
        self._conn = conn

    async def _keep(self) -> None:
        """Reconnect a dropped LISTEN connection (backoff), claim what a lost doorbell left,
        and delete the rows of callers that died."""
        delay = self.heal_interval
        while not self._closed:
            await asyncio.sleep(self.heal_interval)  # the heal cadence, not a wait for a state
            conn = self._conn
            if conn is None or conn.is_closed():
                try:
                    await self._listen()
                    delay = self.heal_interval
                    log.info("relay: LISTEN connection to %s restored", redact(self.db.dsn))
                except StoreError as e:
                    log.warning("relay: LISTEN connection lost (retrying): %s", e)
                    await asyncio.sleep(delay)
                    delay = min(RECONNECT_MAX, delay * 2)
                    continue
                for ev in self._waiting.values():
                    ev.set()  # outcomes may have been announced while we were away
            try:
                await self._claim_all()
                self._since_gc += self.heal_interval
                if self._since_gc >= 60.0:
                    self._since_gc = 0.0
                    await self._exec("collecting old calls", GC, GC_AFTER)
            except StoreError as e:
                log.warning("relay: %s", e)

    # ---- the caller ------------------------------------------------------------------------

    async def call(
        self,
        target: str,
        agent_id: str,
        op: RelayOp,
        args: dict[str, Any] | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Any:
        call = RelayedCall.new(target, agent_id, op, args)
        woken = self._waiting[call.id] = asyncio.Event()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            await self._exec(
                f"sending {op} to replica {target}",
                SEND,
                call.id,
                target,
                agent_id,
                op,
                orjson.dumps(call.args).decode(),
                timeout,
                orjson.dumps([target, call.id]).decode(),
            )
            while True:
                left = deadline - loop.time()
                with contextlib.suppress(TimeoutError):
                    await wait_for(woken.wait(), max(0.0, min(self.heal_interval, left)))
                woken.clear()
                row = await self._fetchrow("collecting a call's outcome", COLLECT, call.id)
                if row is not None:
                    return RelayOutcome.model_validate_json(row["result"]).unwrap(target)
                if loop.time() >= deadline:
                    withdrawn = await self._fetchrow("withdrawing a call", WITHDRAW, call.id)
                    if withdrawn is None:
                        # Taken meanwhile: one last look for its outcome.
                        row = await self._fetchrow("collecting a call's outcome", COLLECT, call.id)
                        if row is not None:
                            return RelayOutcome.model_validate_json(row["result"]).unwrap(target)
                    raise RelayUnanswered(call, timeout, taken=withdrawn is None)
        finally:
            self._waiting.pop(call.id, None)

    def _on_done(self, conn: Any, pid: int, channel: str, payload: object) -> None:
        ev = self._waiting.get(str(payload))
        if ev is not None:
            ev.set()

    # ---- the target ------------------------------------------------------------------------

    def _on_call(self, conn: Any, pid: int, channel: str, payload: object) -> None:
        try:
            target, call_id = orjson.loads(str(payload))
        except (orjson.JSONDecodeError, ValueError, TypeError):
            return
        if target != self.replica_id or self._closed:
            return
        self._spawn(self._claim_one(str(call_id)))

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _claim_one(self, call_id: str) -> None:
        try:
            row = await self._fetchrow("claiming a call", CLAIM_ONE, call_id, self.replica_id)
        except StoreError as e:
            log.warning("relay: %s (the heal pass retries)", e)
            return
        if row is not None:
            await self._execute(row)

    async def _claim_all(self) -> None:
        async def q(conn: Conn) -> list[asyncpg.Record]:
            return list(await conn.fetch(CLAIM_ALL, self.replica_id))

        for row in await self._run(q, "claiming calls"):
            self._spawn(self._execute(row))

    async def _execute(self, row: asyncpg.Record) -> None:
        op = str(row["op"])
        try:
            if op not in RELAY_OPS:
                raise ValueError(f"unknown relayed operation {op!r}")
            call = RelayedCall(
                id=row["id"],
                target=row["target"],
                agent_id=row["agent_id"],
                op=op,  # checked above
                args=orjson.loads(row["args"]),
            )
            assert self._handler is not None
            outcome = RelayOutcome(ok=True, value=await self._handler(call))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            outcome = RelayOutcome.of_error(e)
        try:
            await self._exec(
                "storing a call's outcome", FINISH, row["id"], outcome.model_dump_json()
            )
        except StoreError as e:
            log.warning("relay: %s", e)

    # ---- SQL -------------------------------------------------------------------------------

    async def _exec(self, what: str, sql: str, *args: Any) -> None:
        async def q(conn: Conn) -> None:
            await conn.execute(sql, *args)

        await self._run(q, what)

    async def _fetchrow(self, what: str, sql: str, *args: Any) -> asyncpg.Record | None:
        async def q(conn: Conn) -> asyncpg.Record | None:
            return await conn.fetchrow(sql, *args)

        result: asyncpg.Record | None = await self._run(q, what)
        return result
