"""`PostgresDecisionStore`: the DecisionStore seam (ADR 0006) on PostgreSQL, shared by every
prosperod replica of a cluster.

Component `decisions`, tables (the SQLite layout, JSON kept as text exactly as SQLite keeps it;
every compared or ordered text column is `COLLATE "C"`, byte order like SQLite's):

- `decisions(seq, id PRIMARY KEY, agent_id, workspace, session_id, turn, tool_call JSON,
  options JSON, created_at, deadline, state, posture, decided_by, decided_at, option_id, note,
  rule)` with indexes on `(state, created_at)` and `(agent_id, created_at)`; `seq` (an
  identity) is the insertion order SQLite's rowid gives: it breaks ties of `created_at`;
- `decision_session_rules(agent_id, session_id, tool_kind, title, action, option_kind,
  decision_id, created_at, PRIMARY KEY(agent_id, session_id, tool_kind, title))`;
- `decision_policies(workspace PRIMARY KEY, policy JSON)`.

PostgreSQL text cannot hold NUL, which SQLite's can: the columns an agent fills in (session id,
tool kind and title of a rule, the option id it offered) go through `_enc`/`_dec`, an injective
escape that leaves every other string as it is (JSON inside the JSON columns escapes NUL
already).

`resolve` (and `reattach`) is ONE statement, `UPDATE ... WHERE id = $1 AND state = 'pending'
RETURNING ...`: concurrent updaters of the row queue on its row lock, and each one behind the
first re-checks the WHERE clause against the committed row (READ COMMITTED), finds it no longer
pending and updates nothing. So exactly one caller, on any replica, moves a decision out of
`pending`, and it gets the row as it left it.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
import orjson
from pydantic import ValidationError

from prospero.core.store.decisions import SessionRule
from prospero.core.store.postgres.db import Conn, PgComponentStore, Step
from prospero.types.decisions import Decision, DecisionState, WorkspacePolicy
from prospero.types.events import DecisionOption, DecisionToolCall

log = logging.getLogger(__name__)

STEPS: tuple[Step, ...] = (
    """CREATE TABLE decisions (
        seq        bigint GENERATED ALWAYS AS IDENTITY,
        id         text COLLATE "C" PRIMARY KEY,
        agent_id   text COLLATE "C" NOT NULL,
        workspace  text COLLATE "C" NOT NULL,
        session_id text COLLATE "C" NOT NULL,
        turn       bigint NOT NULL,
        tool_call  text NOT NULL,
        options    text NOT NULL,
        created_at text COLLATE "C" NOT NULL,
        deadline   text,
        state      text COLLATE "C" NOT NULL,
        posture    text,
        decided_by text,
        decided_at text,
        option_id  text,
        note       text,
        rule       text
    );
    CREATE INDEX decisions_state ON decisions (state, created_at);
    CREATE INDEX decisions_agent ON decisions (agent_id, created_at);
    CREATE TABLE decision_session_rules (
        agent_id    text COLLATE "C" NOT NULL,
        session_id  text COLLATE "C" NOT NULL,
        tool_kind   text COLLATE "C" NOT NULL,
        title       text COLLATE "C" NOT NULL,
        action      text NOT NULL,
        option_kind text NOT NULL,
        decision_id text NOT NULL,
        created_at  text COLLATE "C" NOT NULL,
        PRIMARY KEY (agent_id, session_id, tool_kind, title)
    );
    CREATE TABLE decision_policies (
        workspace text COLLATE "C" PRIMARY KEY,
        policy    text NOT NULL
    )""",
)

_FIELDS = (
    "id",
    "agent_id",
    "workspace",
    "session_id",
    "turn",
    "tool_call",
    "options",
    "created_at",
    "deadline",
    "state",
    "posture",
    "decided_by",
    "decided_at",
    "option_id",
    "note",
    "rule",
)
_COLS = ", ".join(_FIELDS)
_RULE_COLS = "agent_id, session_id, tool_kind, title, action, option_kind, decision_id, created_at"


# A stored text starting with this is an escaped string (never the start of a plain one).
_ESCAPED = "\x01"


def _enc(value: str) -> str:
    """`value` as PostgreSQL text can hold it: unchanged unless it contains NUL (or starts
    with the escape mark), then the mark + its JSON string."""
    if "\x00" in value or value.startswith(_ESCAPED):
        return _ESCAPED + orjson.dumps(value).decode()
    return value


def _enc_opt(value: str | None) -> str | None:
    return None if value is None else _enc(value)


def _dec(value: str) -> str:
    return str(orjson.loads(value[1:])) if value.startswith(_ESCAPED) else value


def _dec_opt(value: str | None) -> str | None:
    return None if value is None else _dec(value)


def _options_json(options: list[DecisionOption]) -> str:
    return orjson.dumps([o.model_dump(mode="json") for o in options]).decode()


def _row(d: Decision) -> tuple[Any, ...]:
    return (
        d.id,
        d.agent_id,
        d.workspace,
        _enc(d.session_id),
        d.turn,
        d.tool_call.model_dump_json(),
        _options_json(d.options),
        d.created_at,
        d.deadline,
        d.state,
        d.posture,
        d.decided_by,
        d.decided_at,
        _enc_opt(d.option_id),
        d.note,
        d.rule,
    )


def _decision(row: asyncpg.Record) -> Decision | None:
    try:
        return Decision(
            id=row["id"],
            agent_id=row["agent_id"],
            workspace=row["workspace"],
            session_id=_dec(row["session_id"]),
            turn=row["turn"],
            tool_call=DecisionToolCall.model_validate_json(row["tool_call"]),
            options=[DecisionOption.model_validate(o) for o in orjson.loads(row["options"])],
            created_at=row["created_at"],
            deadline=row["deadline"],
            state=row["state"],
            posture=row["posture"],
            decided_by=row["decided_by"],
            decided_at=row["decided_at"],
            option_id=_dec_opt(row["option_id"]),
            note=row["note"],
            rule=row["rule"],
        )
    except (ValidationError, ValueError, TypeError) as e:
        log.warning("decision %r: unreadable stored row skipped: %s", row["id"], e)
        return None


class PostgresDecisionStore(PgComponentStore):
    """DecisionStore on PostgreSQL (component `decisions`)."""

    component = "decisions"
    steps = STEPS
    label = "postgres decision store"

    # ---- decisions ---------------------------------------------------------------------------

    async def insert(self, decision: Decision) -> None:
        row = _row(decision)
        marks = ", ".join(f"${i}" for i in range(1, len(row) + 1))

        async def job(conn: Conn) -> None:
            await conn.execute(f"INSERT INTO decisions ({_COLS}) VALUES ({marks})", *row)

        await self._run(job, "insert")

    async def get(self, decision_id: str) -> Decision | None:
        async def job(conn: Conn) -> asyncpg.Record | None:
            row: asyncpg.Record | None = await conn.fetchrow(
                f"SELECT {_COLS} FROM decisions WHERE id = $1", decision_id
            )
            return row

        row = await self._run(job, "get")
        return _decision(row) if row is not None else None

    async def query(
        self,
        *,
        state: DecisionState | None = None,
        agent_id: str | None = None,
        workspace: str | None = None,
        limit: int | None = None,
    ) -> list[Decision]:
        where: list[str] = []
        args: list[Any] = []
        for col, value in (("state", state), ("agent_id", agent_id), ("workspace", workspace)):
            if value is not None:
                args.append(value)
                where.append(f"{col} = ${len(args)}")
        sql = f"SELECT seq, {_COLS} FROM decisions"
        if where:
            sql += " WHERE " + " AND ".join(where)
        if limit is not None:
            args.append(max(0, int(limit)))
            sql = (
                f"SELECT * FROM ({sql} ORDER BY created_at DESC, seq DESC LIMIT ${len(args)}) "
                "AS newest ORDER BY created_at, seq"
            )
        else:
            sql += " ORDER BY created_at, seq"

        async def job(conn: Conn) -> list[asyncpg.Record]:
            return list(await conn.fetch(sql, *args))

        rows = await self._run(job, "list")
        return [d for d in (_decision(r) for r in rows) if d is not None]

    async def resolve(
        self,
        decision_id: str,
        *,
        state: DecisionState,
        decided_by: str,
        decided_at: str,
        option_id: str | None = None,
        note: str | None = None,
        rule: str | None = None,
    ) -> Decision | None:
        if state == "pending":
            raise ValueError("resolve() moves a decision out of 'pending'")

        async def job(conn: Conn) -> asyncpg.Record | None:
            row: asyncpg.Record | None = await conn.fetchrow(
                "UPDATE decisions SET state = $1, decided_by = $2, decided_at = $3, "
                "option_id = $4, note = $5, rule = $6 "
                f"WHERE id = $7 AND state = 'pending' RETURNING {_COLS}",
                state,
                decided_by,
                decided_at,
                _enc_opt(option_id),
                note,
                rule,
                decision_id,
            )
            return row

        row = await self._run(job, "resolve")
        return _decision(row) if row is not None else None

    async def reattach(
        self,
        decision_id: str,
        *,
        tool_call: DecisionToolCall,
        options: list[DecisionOption],
        deadline: str | None,
    ) -> Decision | None:
        tc = tool_call.model_dump_json()
        opts = _options_json(options)

        async def job(conn: Conn) -> asyncpg.Record | None:
            row: asyncpg.Record | None = await conn.fetchrow(
                "UPDATE decisions SET tool_call = $1, options = $2, deadline = $3 "
                f"WHERE id = $4 AND state = 'pending' RETURNING {_COLS}",
                tc,
                opts,
                deadline,
                decision_id,
            )
            return row

        row = await self._run(job, "reattach")
        return _decision(row) if row is not None else None

    # ---- session rules -----------------------------------------------------------------------

    async def add_session_rule(self, rule: SessionRule) -> None:
        async def job(conn: Conn) -> None:
            await conn.execute(
                f"INSERT INTO decision_session_rules ({_RULE_COLS}) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8) "
                "ON CONFLICT (agent_id, session_id, tool_kind, title) DO UPDATE SET "
                "action = EXCLUDED.action, option_kind = EXCLUDED.option_kind, "
                "decision_id = EXCLUDED.decision_id, created_at = EXCLUDED.created_at",
                rule.agent_id,
                _enc(rule.session_id),
                _enc(rule.tool_kind),
                _enc(rule.title),
                rule.action,
                rule.option_kind,
                rule.decision_id,
                rule.created_at,
            )

        await self._run(job, "add_session_rule")

    async def session_rules(self, agent_id: str, session_id: str) -> list[SessionRule]:
        async def job(conn: Conn) -> list[asyncpg.Record]:
            return list(
                await conn.fetch(
                    f"SELECT {_RULE_COLS} FROM decision_session_rules "
                    "WHERE agent_id = $1 AND session_id = $2 "
                    "ORDER BY created_at, tool_kind, title",
                    agent_id,
                    _enc(session_id),
                )
            )

        rows = await self._run(job, "session_rules")
        return [
            SessionRule(
                agent_id=r["agent_id"],
                session_id=_dec(r["session_id"]),
                tool_kind=_dec(r["tool_kind"]),
                title=_dec(r["title"]),
                action=r["action"],
                option_kind=r["option_kind"],
                decision_id=r["decision_id"],
                created_at=r["created_at"],
            )
            for r in rows
        ]

    # ---- policies ----------------------------------------------------------------------------

    async def get_policy(self, workspace: str) -> WorkspacePolicy | None:
        async def job(conn: Conn) -> str | None:
            raw = await conn.fetchval(
                "SELECT policy FROM decision_policies WHERE workspace = $1", workspace
            )
            return str(raw) if raw is not None else None

        raw = await self._run(job, "get_policy")
        if raw is None:
            return None
        try:
            return WorkspacePolicy.model_validate_json(raw)
        except ValidationError as e:
            log.warning("workspace %r: unreadable stored policy, using defaults: %s", workspace, e)
            return None

    async def put_policy(self, workspace: str, policy: WorkspacePolicy) -> None:
        raw = policy.model_dump_json()

        async def job(conn: Conn) -> None:
            await conn.execute(
                "INSERT INTO decision_policies (workspace, policy) VALUES ($1, $2) "
                "ON CONFLICT (workspace) DO UPDATE SET policy = EXCLUDED.policy",
                workspace,
                raw,
            )

        await self._run(job, "put_policy")
