"""The PostgreSQL schema of the event store (`migrate("events", STEPS)`) and its statements.

Schema (component `events`, version 1), the SQLite schema's tables (`sqlite/schema.py`) with
one addition:

- `events(ordinal bigint PRIMARY KEY, stream_key, seq, ts, repo, agent_id, kind_tag, kind,
  UNIQUE (stream_key, seq))` plus an index on `ts` for retention. The kind's JSON is stored as
  `text` exactly as `rows.encode_batch` wrote it (never `jsonb`, which would reorder and
  re-space it, and refuses `\\u0000`), so raw reads splice it back byte for byte. Every text
  column is `COLLATE "C"`: comparisons and ordering are by code point, like SQLite's (retention
  compares `ts` as a string; usage is ordered by workspace, then day), whatever the database's
  locale.
- `fleet_head(last)`: one row, the last ordinal handed out. An append takes its ordinals with
  `UPDATE fleet_head SET last = last + n RETURNING last` in its own transaction: the row lock
  serialises appenders until commit, so ordinal order is commit order (a reader that sees
  ordinal k also sees every ordinal below it, so a fleet follower never skips one), a rolled
  back append leaves no hole, and an ordinal is never reused, even once retention has deleted
  the newest rows (the counter only ever grows). `last_ordinal` reads it.
- `stream_heads(stream_key PRIMARY KEY, high_water)`: per stream, at least the highest seq
  retention has deleted (folded in by the same statement that deletes), so `high_water`, the
  max of it and the highest seq still stored, never goes backwards.
- `usage_daily(workspace, day, ..., PRIMARY KEY (workspace, day))`: folded in the append
  transaction (`rows.account`); null sums stay null until an event reports a value.
- `cursors(key PRIMARY KEY, data bytea)`: driver resume states.

A fenced append (`fences=`) first share-locks the lease rows it is written under in the
`leases` table (component `leases`, not created here: `FENCE_CHECK`), then writes as below.

Batches go in as one `INSERT ... SELECT ... FROM unnest($1::text[], $2::bigint[], ...)` (the
rows' columns as arrays), never row by row.
"""

from __future__ import annotations

from prospero.core.store.postgres.db import Step

# The unique constraint on (stream_key, seq): its violation is a SeqConflict.
SEQ_CONSTRAINT = "events_stream_seq"

STEPS: list[Step] = [
    """
    CREATE TABLE events (
        ordinal    bigint PRIMARY KEY,
        stream_key text COLLATE "C" NOT NULL,
        seq        bigint NOT NULL,
        ts         text COLLATE "C" NOT NULL,
        repo       text COLLATE "C" NOT NULL,
        agent_id   text COLLATE "C" NOT NULL,
        kind_tag   text COLLATE "C" NOT NULL,
        kind       text NOT NULL,
        CONSTRAINT events_stream_seq UNIQUE (stream_key, seq)
    );
    CREATE INDEX events_ts ON events (ts);
    CREATE TABLE fleet_head (
        one  boolean PRIMARY KEY DEFAULT true CHECK (one),
        last bigint NOT NULL
    );
    INSERT INTO fleet_head (one, last) VALUES (true, 0);
    CREATE TABLE stream_heads (
        stream_key text COLLATE "C" PRIMARY KEY,
        high_water bigint NOT NULL
    );
    CREATE TABLE usage_daily (
        workspace     text COLLATE "C" NOT NULL,
        day           text COLLATE "C" NOT NULL,
        input_tokens  bigint,
        output_tokens bigint,
        cost_usd      double precision,
        turns         bigint NOT NULL DEFAULT 0,
        runs          bigint NOT NULL DEFAULT 0,
        done          bigint NOT NULL DEFAULT 0,
        failed        bigint NOT NULL DEFAULT 0,
        killed        bigint NOT NULL DEFAULT 0,
        crashed       bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (workspace, day)
    );
    CREATE TABLE cursors (
        key  text COLLATE "C" PRIMARY KEY,
        data bytea NOT NULL
    );
    """,
    # Runs stopped at their budget, counted on their own.
    "ALTER TABLE usage_daily ADD COLUMN IF NOT EXISTS budget_exceeded bigint NOT NULL DEFAULT 0",
]

# The doorbell of every append (`core/bus/postgres.py`): NOTIFY on this channel with the
# batch's last ordinal as the payload, sent by the appending statement itself, so PostgreSQL
# delivers it at commit and never for a rolled-back append.
EVENTS_CHANNEL = "prospero_events"

# The batch's events, their ordinals taken from the counter in the same statement: `$8` rows,
# ordinals `last - $8 + 1 .. last` in row order, and the doorbell. Returns `last`.
INSERT_EVENTS = """
WITH head AS (
    UPDATE fleet_head SET last = last + $8::bigint RETURNING last
), ins AS (
    INSERT INTO events (ordinal, stream_key, seq, ts, repo, agent_id, kind_tag, kind)
    SELECT head.last - $8::bigint + r.i, r.stream_key, r.seq, r.ts, r.repo, r.agent_id,
           r.kind_tag, r.kind
    FROM head,
         unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[],
                $7::text[])
         WITH ORDINALITY AS r(stream_key, seq, ts, repo, agent_id, kind_tag, kind, i)
)
SELECT last, pg_notify('prospero_events', last::text) FROM head
"""


# The fences of a fenced append (`append_batch(fences=...)`), checked first in its transaction:
# the `(key, owner, epoch)` triples (`$1`, `$2`, `$3`) still held and live on the database's
# clock now (`clock_timestamp()`, not the transaction's start) come back, share-locked until
# the append commits or rolls back, so a takeover of one of them (an UPDATE of its row by
# `PgLeases.acquire`) waits for the append and a fenced write never commits under an epoch
# already replaced. In key order: concurrent appenders lock the rows alike. The table is the
# `leases` component's (`core/store/postgres/leases.py`, same guard as its `FENCE_SQL`); an
# epoch of 0 is never stored (CHECK epoch > 0), so it never matches.
FENCE_CHECK = """
SELECT l.key, l.owner, l.epoch FROM leases AS l
WHERE (l.key, l.owner, l.epoch) IN (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
)
  AND l.expires_at > clock_timestamp()
ORDER BY l.key
FOR SHARE OF l
"""


def _null_add(col: str) -> str:
    # "Not reported" (null) stays null until some event reports a value.
    return (
        f"{col} = CASE WHEN excluded.{col} IS NULL THEN usage_daily.{col} "
        f"ELSE coalesce(usage_daily.{col}, 0) + excluded.{col} END"
    )


UPSERT_USAGE = (
    "INSERT INTO usage_daily (workspace, day, input_tokens, output_tokens, cost_usd, turns, runs,"
    " done, failed, killed, crashed, budget_exceeded) "
    "SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], "
    "$5::double precision[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], "
    "$10::bigint[], $11::bigint[], $12::bigint[]) "
    "ON CONFLICT (workspace, day) DO UPDATE SET "
    + ", ".join(
        [
            _null_add("input_tokens"),
            _null_add("output_tokens"),
            _null_add("cost_usd"),
            "turns = usage_daily.turns + excluded.turns",
            "runs = usage_daily.runs + excluded.runs",
            "done = usage_daily.done + excluded.done",
            "failed = usage_daily.failed + excluded.failed",
            "killed = usage_daily.killed + excluded.killed",
            "crashed = usage_daily.crashed + excluded.crashed",
            "budget_exceeded = usage_daily.budget_exceeded + excluded.budget_exceeded",
        ]
    )
)

UPSERT_CURSOR = (
    "INSERT INTO cursors (key, data) VALUES ($1, $2) "
    "ON CONFLICT (key) DO UPDATE SET data = excluded.data"
)

# Distinct keys (ON CONFLICT DO UPDATE cannot touch one row twice in a statement).
UPSERT_CURSORS = (
    "INSERT INTO cursors (key, data) SELECT * FROM unnest($1::text[], $2::bytea[]) "
    "ON CONFLICT (key) DO UPDATE SET data = excluded.data"
)

# The probe of `writable`, run in a transaction that is rolled back.
WRITABLE_PROBE = (
    "INSERT INTO cursors (key, data) VALUES ('__prospero_writable_probe__', '\\x'::bytea) "
    "ON CONFLICT (key) DO UPDATE SET data = excluded.data"
)

LAST_ORDINAL = "SELECT last FROM fleet_head"

# Highest seq of a stream: what retention folded into stream_heads, or what is still stored.
HIGH_WATER = (
    "SELECT greatest("
    "coalesce((SELECT high_water FROM stream_heads WHERE stream_key = $1), 0), "
    "coalesce((SELECT max(seq) FROM events WHERE stream_key = $1), 0))"
)

# `HIGH_WATER` of many streams in one statement.
HIGH_WATERS = (
    "SELECT k.key, greatest("
    "coalesce((SELECT high_water FROM stream_heads h WHERE h.stream_key = k.key), 0), "
    "coalesce((SELECT max(seq) FROM events e WHERE e.stream_key = k.key), 0)) "
    "FROM unnest($1::text[]) AS k(key)"
)

# One retention chunk: delete up to $2 rows with ts < $1 and fold their streams' max seq into
# stream_heads in the same statement (so `high_water` never goes backwards). Returns the count.
PRUNE_CHUNK_SQL = """
WITH gone AS (
    DELETE FROM events
    WHERE ordinal IN (SELECT ordinal FROM events WHERE ts < $1 LIMIT $2)
    RETURNING stream_key, seq
), heads AS (
    INSERT INTO stream_heads (stream_key, high_water)
    SELECT stream_key, max(seq) FROM gone GROUP BY stream_key
    ON CONFLICT (stream_key) DO UPDATE
        SET high_water = greatest(stream_heads.high_water, excluded.high_water)
)
SELECT count(*) FROM gone
"""

EVENT_COLS = "seq, ts, repo, agent_id, kind"

# The raw reads: the kind's JSON as stored, as UTF-8 bytes, spliced as it is.
RAW_COLS = "seq, ts, repo, agent_id, kind_tag, convert_to(kind, 'UTF8')"


def replay_sql(cols: str, by_kind: bool) -> str:
    """One stream's events from a seq, ascending; `$3` the limit (null: none), `$4` the tags."""
    where = " AND kind_tag = ANY($4::text[])" if by_kind else ""
    return (
        f"SELECT {cols} FROM events WHERE stream_key = $1 AND seq >= $2{where} "
        "ORDER BY seq LIMIT $3"
    )


def replay_fleet_sql(cols: str, *, kinds: bool = False) -> str:
    """Every stream's events after an ordinal, in ordinal order; `$2` the limit (null: none);
    with `kinds`, only those whose kind is in `$3` (a text array)."""
    where = " AND kind_tag = ANY($3::text[])" if kinds else ""
    return f"SELECT ordinal, {cols} FROM events WHERE ordinal > $1{where} ORDER BY ordinal LIMIT $2"


# scan_kinds: the caller's new streams' events of the kinds up to its mark ($2)...
SCAN_OLDER = (
    "SELECT stream_key, seq, convert_to(kind, 'UTF8') FROM events "
    "WHERE stream_key = ANY($1::text[]) AND ordinal <= $2 AND kind_tag = ANY($3::text[]) "
    "ORDER BY ordinal"
)
# ... every stream's events of the kinds in (mark, last] ...
SCAN_NEW = (
    "SELECT stream_key, seq, convert_to(kind, 'UTF8') FROM events "
    "WHERE ordinal > $1 AND ordinal <= $2 AND kind_tag = ANY($3::text[]) "
    "AND stream_key = ANY($4::text[]) ORDER BY ordinal"
)
# ... and which known streams moved in (mark, last].
SCAN_MOVED = (
    "SELECT DISTINCT stream_key FROM events "
    "WHERE ordinal > $1 AND ordinal <= $2 AND stream_key = ANY($3::text[])"
)

USAGE = (
    "SELECT workspace, day, input_tokens, output_tokens, cost_usd, turns, runs, "
    "done, failed, killed, crashed, budget_exceeded FROM usage_daily "
    "WHERE day >= $1 AND day <= $2 ORDER BY workspace, day"
)

LOAD_CURSOR = "SELECT data FROM cursors WHERE key = $1"
