"""SQLite implementation of the DecisionStore seam (ADR 0006).

The tables live in the same file as the events (`events.db`); the store keeps its own
connection on its own single-thread executor (decisions are rare: one connection serves reads
and writes). Tables (created if missing, never touching the event store's schema version):

- `decisions(id PRIMARY KEY, agent_id, workspace, session_id, turn, tool_call JSON,
  options JSON, created_at, deadline, state, posture, decided_by, decided_at, option_id, note,
  rule)` with indexes on `(state, created_at)` and `(agent_id, created_at)`;
- `decision_session_rules(agent_id, session_id, tool_kind, title, action, option_kind,
  decision_id, created_at, PRIMARY KEY(agent_id, session_id, tool_kind, title))`;
- `decision_policies(workspace PRIMARY KEY, policy JSON)`.

`resolve` is one `UPDATE ... WHERE id = ? AND state = 'pending'` inside `BEGIN IMMEDIATE`:
exactly one caller moves a decision out of `pending`, also across processes sharing the file.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from prospero.core.store.decisions import SessionRule
from prospero.core.store.sqlite.db import LazySqliteStore
from prospero.types.decisions import Decision, DecisionState, WorkspacePolicy
from prospero.types.events import DecisionOption, DecisionToolCall

log = logging.getLogger(__name__)


_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS decisions (
        id         TEXT PRIMARY KEY,
        agent_id   TEXT NOT NULL,
        workspace  TEXT NOT NULL,
        session_id TEXT NOT NULL,
        turn       INTEGER NOT NULL,
        tool_call  TEXT NOT NULL,
        options    TEXT NOT NULL,
        created_at TEXT NOT NULL,
        deadline   TEXT,
        state      TEXT NOT NULL,
        posture    TEXT,
        decided_by TEXT,
        decided_at TEXT,
        option_id  TEXT,
        note       TEXT,
        rule       TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS decisions_state ON decisions (state, created_at)",
    "CREATE INDEX IF NOT EXISTS decisions_agent ON decisions (agent_id, created_at)",
    """CREATE TABLE IF NOT EXISTS decision_session_rules (
        agent_id    TEXT NOT NULL,
        session_id  TEXT NOT NULL,
        tool_kind   TEXT NOT NULL,
        title       TEXT NOT NULL,
        action      TEXT NOT NULL,
        option_kind TEXT NOT NULL,
        decision_id TEXT NOT NULL,
        created_at  TEXT NOT NULL,
        PRIMARY KEY (agent_id, session_id, tool_kind, title)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS decision_policies (
        workspace TEXT PRIMARY KEY,
        policy    TEXT NOT NULL
    )""",
)

_COLS = (
    "id, agent_id, workspace, session_id, turn, tool_call, options, created_at, deadline, "
    "state, posture, decided_by, decided_at, option_id, note, rule"
)


def _row(d: Decision) -> tuple[Any, ...]:
    return (
        d.id,
        d.agent_id,
        d.workspace,
        d.session_id,
        d.turn,
        d.tool_call.model_dump_json(),
        orjson.dumps([o.model_dump(mode="json") for o in d.options]).decode(),
        d.created_at,
        d.deadline,
        d.state,
        d.posture,
        d.decided_by,
        d.decided_at,
        d.option_id,
        d.note,
        d.rule,
    )


def _decision(row: tuple[Any, ...]) -> Decision | None:
    (
        id_,
        agent_id,
        workspace,
        session_id,
        turn,
        tool_call,
        options,
        created_at,
        deadline,
        state,
        posture,
        decided_by,
        decided_at,
        option_id,
        note,
        rule,
    ) = row
    try:
        return Decision(
            id=id_,
            agent_id=agent_id,
            workspace=workspace,
            session_id=session_id,
            turn=turn,
            tool_call=DecisionToolCall.model_validate_json(tool_call),
            options=[DecisionOption.model_validate(o) for o in orjson.loads(options)],
            created_at=created_at,
            deadline=deadline,
            state=state,
            posture=posture,
            decided_by=decided_by,
            decided_at=decided_at,
            option_id=option_id,
            note=note,
            rule=rule,
        )
    except (ValidationError, ValueError) as e:
        log.warning("decision %r: unreadable stored row skipped: %s", id_, e)
        return None


def _init(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        for stmt in _SCHEMA:
            conn.execute(stmt)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


class SqliteDecisionStore(LazySqliteStore):
    """DecisionStore on a SQLite file (conventionally prosperod's `events.db`)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, thread="decisions", label="decision store", init=_init)

    # ---- decisions ---------------------------------------------------------------------------

    async def insert(self, decision: Decision) -> None:
        row = _row(decision)

        def job(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"INSERT INTO decisions ({_COLS}) VALUES ({', '.join('?' * len(row))})", row
            )

        await self._run(job, "insert")

    async def get(self, decision_id: str) -> Decision | None:
        def job(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
            row: tuple[Any, ...] | None = conn.execute(
                f"SELECT {_COLS} FROM decisions WHERE id = ?", (decision_id,)
            ).fetchone()
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
                where.append(f"{col} = ?")
                args.append(value)
        sql = f"SELECT {_COLS} FROM decisions"
        if where:
            sql += " WHERE " + " AND ".join(where)
        if limit is not None:
            sql = f"SELECT * FROM ({sql} ORDER BY created_at DESC, rowid DESC LIMIT ?) "
            args.append(max(0, int(limit)))
            sql += "ORDER BY created_at, id"
        else:
            sql += " ORDER BY created_at, rowid"

        def job(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return list(conn.execute(sql, args).fetchall())

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

        def job(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                cur = conn.execute(
                    "UPDATE decisions SET state = ?, decided_by = ?, decided_at = ?, "
                    "option_id = ?, note = ?, rule = ? WHERE id = ? AND state = 'pending'",
                    (state, decided_by, decided_at, option_id, note, rule, decision_id),
                )
                row: tuple[Any, ...] | None = None
                if cur.rowcount == 1:
                    row = conn.execute(
                        f"SELECT {_COLS} FROM decisions WHERE id = ?", (decision_id,)
                    ).fetchone()
                conn.execute("COMMIT")
                return row
            except BaseException:
                conn.execute("ROLLBACK")
                raise

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
        opts = orjson.dumps([o.model_dump(mode="json") for o in options]).decode()

        def job(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                cur = conn.execute(
                    "UPDATE decisions SET tool_call = ?, options = ?, deadline = ? "
                    "WHERE id = ? AND state = 'pending'",
                    (tc, opts, deadline, decision_id),
                )
                row: tuple[Any, ...] | None = None
                if cur.rowcount == 1:
                    row = conn.execute(
                        f"SELECT {_COLS} FROM decisions WHERE id = ?", (decision_id,)
                    ).fetchone()
                conn.execute("COMMIT")
                return row
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        row = await self._run(job, "reattach")
        return _decision(row) if row is not None else None

    # ---- session rules -----------------------------------------------------------------------

    async def add_session_rule(self, rule: SessionRule) -> None:
        def job(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO decision_session_rules (agent_id, session_id, tool_kind, "
                "title, action, option_kind, decision_id, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    rule.agent_id,
                    rule.session_id,
                    rule.tool_kind,
                    rule.title,
                    rule.action,
                    rule.option_kind,
                    rule.decision_id,
                    rule.created_at,
                ),
            )

        await self._run(job, "add_session_rule")

    async def session_rules(self, agent_id: str, session_id: str) -> list[SessionRule]:
        def job(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return list(
                conn.execute(
                    "SELECT agent_id, session_id, tool_kind, title, action, option_kind, "
                    "decision_id, created_at FROM decision_session_rules "
                    "WHERE agent_id = ? AND session_id = ? ORDER BY created_at",
                    (agent_id, session_id),
                ).fetchall()
            )

        rows = await self._run(job, "session_rules")
        return [SessionRule(*r) for r in rows]

    # ---- policies ----------------------------------------------------------------------------

    async def get_policy(self, workspace: str) -> WorkspacePolicy | None:
        def job(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT policy FROM decision_policies WHERE workspace = ?", (workspace,)
            ).fetchone()
            return str(row[0]) if row is not None else None

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

        def job(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO decision_policies (workspace, policy) VALUES (?, ?) "
                "ON CONFLICT (workspace) DO UPDATE SET policy = excluded.policy",
                (workspace, raw),
            )

        await self._run(job, "put_policy")
