"""`PgLeases`: the `LeaseAuthority` of clustered replicas, a `leases` table on the database clock.

One row per key, kept forever: releasing a lease clears its owner but keeps its epoch, so epochs
per key strictly increase (they are the fencing tokens). Every operation is one statement in
autocommit, on the server's `now()` (the statement's start, one value for the whole statement),
never on a replica's clock:

- acquire: `INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE <free, expired or ours> RETURNING`.
  Concurrent acquires of one key serialise on its row: the first wins, the others see a live
  lease of another owner and get no row back;
- holder / holders / leases: a `SELECT` of the live rows (`holders`: `key = ANY($1)`, one
  statement for any number of keys);
- renew / release: an `UPDATE ... WHERE key AND owner AND epoch [AND live]` (renew_many: one
  `UPDATE ... FROM unnest(...)` for the whole batch).

`expires_at` is reported as seconds since the Unix epoch on the server's clock (`now()` too).

A write fenced by a lease checks, in its own transaction and before it commits,
`SELECT 1 FROM leases WHERE key = $k AND owner = $o AND epoch = $e AND expires_at >
clock_timestamp() FOR SHARE` (see `FENCE_SQL`): the row lock makes a takeover wait for that
transaction, so nothing written under an old epoch commits after a new holder took the key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import asyncpg

from prospero.core.errors import StoreError
from prospero.core.leases import Lease, check_ttl
from prospero.core.store.postgres.db import Conn, PgComponentStore, Step

T = TypeVar("T")

STEPS: list[Step] = [
    """
    CREATE TABLE leases (
        key text PRIMARY KEY,
        owner text,                         -- NULL once released
        epoch bigint NOT NULL CHECK (epoch > 0),
        ttl double precision NOT NULL CHECK (ttl > 0),
        expires_at timestamptz NOT NULL,
        acquired_at timestamptz NOT NULL    -- when this epoch began
    )
    """,
]

COLS = "key, owner, epoch, ttl, extract(epoch FROM expires_at)::float8 AS expires_at"
COLS_L = "l.key, l.owner, l.epoch, l.ttl, extract(epoch FROM l.expires_at)::float8 AS expires_at"

ACQUIRE = f"""
INSERT INTO leases AS l (key, owner, epoch, ttl, expires_at, acquired_at)
VALUES ($1, $2, 1, $3::float8, now() + make_interval(secs => $3::float8), now())
ON CONFLICT (key) DO UPDATE SET
    owner = EXCLUDED.owner,
    epoch = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > now()
                 THEN l.epoch ELSE l.epoch + 1 END,
    acquired_at = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > now()
                       THEN l.acquired_at ELSE now() END,
    ttl = EXCLUDED.ttl,
    expires_at = EXCLUDED.expires_at
WHERE l.owner IS NULL OR l.expires_at <= now() OR l.owner = EXCLUDED.owner
RETURNING {COLS_L}
"""

RENEW = f"""
UPDATE leases SET
    ttl = $4::float8,
    expires_at = now() + make_interval(secs => $4::float8)
WHERE key = $1 AND owner = $2 AND epoch = $3 AND expires_at > now()
RETURNING {COLS}
"""

# The rows are locked in key order first (the order fenced appends take their share locks
# in), so a renewal and an append never wait for each other in a cycle.
RENEW_MANY = f"""
WITH r AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::float8[])
        AS r(key, owner, epoch, ttl)
), locked AS (
    SELECT l.key FROM leases AS l JOIN r ON l.key = r.key
    ORDER BY l.key
    FOR UPDATE OF l
)
UPDATE leases AS l SET
    ttl = r.ttl,
    expires_at = now() + make_interval(secs => r.ttl)
FROM r
WHERE l.key = r.key AND l.key IN (SELECT key FROM locked)
  AND l.owner = r.owner AND l.epoch = r.epoch AND l.expires_at > now()
RETURNING {COLS_L}
"""

RELEASE = """
UPDATE leases SET owner = NULL, expires_at = least(expires_at, now())
WHERE key = $1 AND owner = $2 AND epoch = $3
RETURNING key
"""

HOLDER = f"SELECT {COLS} FROM leases WHERE key = $1 AND owner IS NOT NULL AND expires_at > now()"

HOLDERS = f"""
SELECT {COLS} FROM leases
WHERE key = ANY($1::text[]) AND owner IS NOT NULL AND expires_at > now()
"""

LIVE = f"SELECT {COLS} FROM leases WHERE owner IS NOT NULL AND expires_at > now() ORDER BY key"

NOW = "SELECT extract(epoch FROM now())::float8"

# The guard a fenced write runs in its own transaction (params: key, owner, epoch): a row back
# means the lease is still ours, and the row stays share-locked until that transaction ends.
FENCE_SQL = """
SELECT 1 FROM leases
WHERE key = $1 AND owner = $2 AND epoch = $3 AND expires_at > clock_timestamp()
FOR SHARE
"""


def _lease(row: asyncpg.Record) -> Lease:
    return Lease(
        key=row["key"],
        owner=row["owner"],
        epoch=int(row["epoch"]),
        expires_at=float(row["expires_at"]),
        ttl=float(row["ttl"]),
    )


class PgLeases(PgComponentStore):
    component = "leases"
    steps = STEPS
    label = "leases"

    async def _run(self, what: str, fn: Callable[[Conn], Awaitable[T]]) -> T:  # type: ignore[override]
        # (no lazy open: a lease authority is opened by whoever wires it, `open()`)
        try:
            async with self.db.pool.acquire() as conn:
                return await fn(conn)
        except StoreError:
            raise
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            raise StoreError(f"database {self.db.where}: leases: {what} failed: {e}") from e

    async def _row(self, what: str, sql: str, *args: Any) -> asyncpg.Record | None:
        async def q(conn: Conn) -> asyncpg.Record | None:
            return await conn.fetchrow(sql, *args)

        return await self._run(what, q)

    async def acquire(self, key: str, owner: str, ttl: float) -> Lease | None:
        ttl = check_ttl(ttl)
        row = await self._row(f"acquiring {key}", ACQUIRE, key, owner, ttl)
        return _lease(row) if row is not None else None

    async def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        ttl = check_ttl(lease.ttl if ttl is None else ttl)
        row = await self._row(
            f"renewing {lease.key}", RENEW, lease.key, lease.owner, lease.epoch, ttl
        )
        return _lease(row) if row is not None else None

    async def renew_many(self, leases: Sequence[Lease]) -> list[Lease | None]:
        if not leases:
            return []
        # One row per key (the last given wins), in key order so batches lock alike.
        by_key = {lease.key: lease for lease in leases}
        keys = sorted(by_key)
        ttls = [check_ttl(by_key[k].ttl) for k in keys]

        async def q(conn: Conn) -> list[asyncpg.Record]:
            return await conn.fetch(
                RENEW_MANY,
                keys,
                [by_key[k].owner for k in keys],
                [by_key[k].epoch for k in keys],
                ttls,
            )

        rows = await self._run(f"renewing {len(keys)} leases", q)
        got = {r["key"]: _lease(r) for r in rows}
        out: list[Lease | None] = []
        for lease in leases:
            new = got.get(lease.key)
            ok = new is not None and new.owner == lease.owner and new.epoch == lease.epoch
            out.append(new if ok else None)
        return out

    async def release(self, lease: Lease) -> bool:
        row = await self._row(
            f"releasing {lease.key}", RELEASE, lease.key, lease.owner, lease.epoch
        )
        return row is not None

    async def holder(self, key: str) -> Lease | None:
        row = await self._row(f"reading {key}", HOLDER, key)
        return _lease(row) if row is not None else None

    async def holders(self, keys: Sequence[str]) -> dict[str, Lease]:
        wanted = sorted(set(keys))
        if not wanted:
            return {}

        async def q(conn: Conn) -> list[asyncpg.Record]:
            return await conn.fetch(HOLDERS, wanted)

        rows = await self._run(f"reading {len(wanted)} holders", q)
        return {r["key"]: _lease(r) for r in rows}

    async def leases(self) -> list[Lease]:
        async def q(conn: Conn) -> list[asyncpg.Record]:
            return await conn.fetch(LIVE)

        return [_lease(r) for r in await self._run("listing", q)]

    async def now(self) -> float:
        async def q(conn: Conn) -> float:
            return float(await conn.fetchval(NOW))

        return await self._run("reading the clock", q)
