"""A scripted ACP agent and a per-agent ACP listener (acp.md; ADR 0011).

`FakeAcpAgent(script, load_session=True)` is an ACP agent built on the SDK's agent side
(`acp.agent.connection.AgentSideConnection`) that plays an `AcpScript`
(`prospero.testkit.acp_scripts` documents the script format). Serve it on any asyncio stream
pair with `await agent.serve(reader, writer)`; one agent can serve many connections, one after
the other or at once, and its sessions outlive a connection (so `session/load` works after a
reconnect).

Protocol behaviour:

- `initialize` -> `protocolVersion: 1`, `agentCapabilities.loadSession` per the flag,
  `sessionCapabilities.close: {}` when `close_session` (default on), `agentInfo`, and
  `authMethods` (default `[]`; wire dicts as acp.md §2 shows them, e.g. codex-acp's
  `{"id": "openai-api-key", "name": "Use OPENAI_API_KEY"}` or an unstable
  `{"type": "env_var", "vars": [...]}` entry).
- With `require_auth`, `session/new` and `session/load` answer `-32000` "Authentication
  required" (as codex-acp does without credentials; with `auth_on="prompt"`, `session/prompt`
  does instead, as claude-agent-acp does without a key — the prompt is not recorded) until an `authenticate` with an accepted
  method id (`accept_methods`, default: every advertised id) succeeded; authentication is
  agent (process) state, so it survives a reconnect. `authenticate` with an advertised but
  unaccepted id -> `-32000`; with an unknown id -> `-32602`. Recorded in `authentications`.
- `session/new` -> a fresh `sessionId` (`sess-0001`, ...); the `cwd` is recorded. With a
  `model`, the result carries a `configOptions` select of `category: "model"`.
- `session/load` (only if advertised, else -32601) -> replays the session's history (a
  `user_message_chunk` per prompt and every update the agent sent, in order) as
  `session/update`s, then returns `{}`; the session is bound to the loading connection.
  Unknown session -> -32002. Prompts for a session the connection did not create or load -> -32002.
- `session/prompt` -> plays the next turn; the prompt's text blocks (joined) are recorded in
  `prompts`. A second prompt while one runs on the same session -> -32600.
- `session/cancel` -> recorded in `cancels`; the running turn stops at once (a `sleep` or a
  pending permission request is abandoned) and the prompt returns `stopReason: cancelled`.
- `session/close` (when advertised) -> cancels the running turn, closes the session (recorded
  in `closes`) and, with `exit_on_close` (default), makes the agent exit 0 after answering.
- Anything else -> JSON-RPC method-not-found.

Observations: `prompts`, `permission_outcomes` (dicts: `session_id`, `tool_call_id`,
`outcome` = `selected` | `cancelled` | `abandoned`, `option_id`, `allow`), `cancels`,
`sessions` (id -> `FakeSession`), `loads`, `closes`, `stop_reasons`, `inits`, `authentications`,
`auth_refusals`, `connections_total`, `exit_code`.

`AcpAgentListener` (`prospero.testkit.fake_acp_listener`) serves such an agent, or a bridged
stdio ACP process, on a per-agent endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from acp.agent.connection import AgentSideConnection
from acp.exceptions import RequestError
from acp.schema import (
    PermissionOption,
    RequestPermissionResponse,
    SessionNotification,
    ToolCallUpdate,
)

from prospero.core.aio import wait_for
from prospero.testkit.acp_scripts import (
    DEFAULT_PERMISSION_OPTIONS,
    UNKNOWN_UPDATE_KIND,
    AcpScript,
    Step,
)
from prospero.testkit.fake_acp_wire import option_wire, text_of, tool_fields

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
CLOSE_GRACE = 2.0
AGENT_INFO = {"name": "prospero-fake-acp", "title": "Prospero fake ACP agent", "version": "1"}


class _Hang(Exception):
    """Internal: the turn must produce no response (crash / exit)."""


@dataclass
class FakeSession:
    """One ACP session the fake agent holds (survives its connection)."""

    id: str
    cwd: str
    history: list[dict[str, Any]] = field(default_factory=list)  # wire `update` objects
    prompts: list[str] = field(default_factory=list)
    closed: bool = False
    conn: _Conn | None = field(default=None, repr=False)
    turn_task: asyncio.Task[str] | None = field(default=None, repr=False)
    cancel_requested: bool = False
    # the `prompt_usage` of the turn's `stop` step, sent with its prompt response
    turn_usage: dict[str, Any] | None = None

    @property
    def running(self) -> bool:
        return self.turn_task is not None and not self.turn_task.done()


@dataclass(eq=False)
class _Conn:
    writer: asyncio.StreamWriter
    asc: AgentSideConnection | None = None
    sessions: set[str] = field(default_factory=set)


class FakeAcpAgent:
    """A scripted ACP agent (see the module docstring and `acp_scripts`)."""

    def __init__(
        self,
        script: AcpScript | None = None,
        *,
        load_session: bool = True,
        close_session: bool = True,
        exit_on_close: bool = True,
        model: str | None = None,
        agent_info: dict[str, Any] | None = None,
        auth_methods: Sequence[dict[str, Any]] = (),
        require_auth: bool = False,
        accept_methods: Sequence[str] | None = None,
        auth_on: str = "session",
    ) -> None:
        self.script = script if script is not None else AcpScript()
        self.auth_methods = [dict(m) for m in auth_methods]
        self.require_auth = require_auth
        self.accept_methods = (
            set(accept_methods)
            if accept_methods is not None
            else {str(m["id"]) for m in self.auth_methods}
        )
        self.authenticated = False
        if auth_on not in ("session", "prompt"):
            raise ValueError(f"auth_on must be 'session' or 'prompt', not {auth_on!r}")
        self.auth_on = auth_on
        self.load_session = load_session
        self.close_session = close_session
        self.exit_on_close = exit_on_close
        self.model = model if model is not None else self.script.model
        self.agent_info = dict(agent_info or AGENT_INFO)
        # Set by a listener: called once with the exit code when the agent exits.
        self.on_exit: Callable[[int], None] | None = None
        # observations
        self.prompts: list[str] = []
        self.permission_outcomes: list[dict[str, Any]] = []
        self.cancels: list[str] = []
        self.sessions: dict[str, FakeSession] = {}
        self.loads: list[str] = []
        self.closes: list[str] = []
        self.stop_reasons: list[str] = []
        self.inits: list[dict[str, Any]] = []
        self.authentications: list[str] = []
        self.auth_refusals = 0
        self.bad_steps: list[Any] = []
        self.connections_total = 0
        self.exit_code: int | None = None
        # state
        self._turns = 0
        self._session_seq = itertools.count(1)
        self._conns: set[_Conn] = set()
        self._conn_tasks: set[asyncio.Task[Any]] = set()
        self._bg: set[asyncio.Task[Any]] = set()

    # --- serving ----------------------------------------------------------------------------

    @property
    def active_connections(self) -> int:
        return len(self._conns)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve ACP on one connection until it closes (returns then)."""
        conn = _Conn(writer)
        self._conns.add(conn)
        self.connections_total += 1
        task = asyncio.current_task()
        if task is not None:
            self._conn_tasks.add(task)

        def bind(c: Any) -> _ConnAgent:
            conn.asc = c
            return _ConnAgent(self, conn)

        asc = AgentSideConnection(
            cast(Any, bind), writer, reader, listening=False, use_unstable_protocol=True
        )
        try:
            await asc.listen()
        except (OSError, ssl.SSLError, ConnectionError):
            pass
        except Exception:
            log.debug("fake acp agent: connection ended with an error", exc_info=True)
        finally:
            for sid in list(conn.sessions):
                s = self.sessions.get(sid)
                if s is not None and s.conn is conn:
                    s.conn = None  # closing `asc` cancels its prompt handlers and their turns
            with contextlib.suppress(Exception):
                await wait_for(asc.close(), CLOSE_GRACE)
            with contextlib.suppress(Exception):
                writer.close()
                await wait_for(writer.wait_closed(), 1.0)
            self._conns.discard(conn)
            if task is not None:
                self._conn_tasks.discard(task)

    async def close_connections(self, *, graceful: bool = True) -> None:
        """Close every connection: graceful flushes what is queued, else abort (RST-like)."""
        for c in list(self._conns):
            if not graceful:
                c.writer.transport.abort()
                continue
            if c.asc is not None:
                with contextlib.suppress(Exception):
                    await wait_for(c.asc.close(), CLOSE_GRACE)
            with contextlib.suppress(Exception):
                c.writer.close()
        tasks = [t for t in self._conn_tasks if t is not asyncio.current_task()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=CLOSE_GRACE)
            for c in list(self._conns):
                c.writer.transport.abort()
            if pending:
                await asyncio.wait(pending, timeout=0.5)

    def _request_exit(self, code: int) -> None:
        if self.exit_code is not None:
            return
        self.exit_code = code
        if self.on_exit is not None:
            try:
                self.on_exit(code)
            except Exception:
                log.exception("fake acp agent: on_exit callback failed")
            return
        # Standalone: an exited agent keeps no connection.
        self._spawn_bg(self.close_connections(graceful=True))

    def _spawn_bg(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)

    # --- handlers (called through _ConnAgent) -----------------------------------------------

    def _initialize(self, protocol_version: int, **kw: Any) -> dict[str, Any]:
        self.inits.append({"protocol_version": protocol_version, **kw})
        caps: dict[str, Any] = {"loadSession": self.load_session}
        if self.close_session:
            caps["sessionCapabilities"] = {"close": {}}
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": caps,
            "agentInfo": self.agent_info,
            "authMethods": [dict(m) for m in self.auth_methods],
        }

    def _authenticate(self, method_id: str) -> dict[str, Any]:
        self.authentications.append(method_id)
        if method_id not in {str(m["id"]) for m in self.auth_methods}:
            raise RequestError.invalid_params({"methodId": method_id, "details": "unknown method"})
        if method_id not in self.accept_methods:
            raise RequestError.auth_required({"methodId": method_id})
        self.authenticated = True
        return {}

    def _check_auth(self, where: str = "session") -> None:
        if self.require_auth and not self.authenticated and where == self.auth_on:
            self.auth_refusals += 1
            raise RequestError.auth_required()

    def _session_result(self) -> dict[str, Any]:
        if self.model is None:
            return {}
        return {
            "configOptions": [
                {
                    "type": "select",
                    "id": "model",
                    "name": "Model",
                    "category": "model",
                    "currentValue": self.model,
                    "options": [{"value": self.model, "name": self.model}],
                }
            ]
        }

    def _new_session(self, conn: _Conn, cwd: str) -> dict[str, Any]:
        self._check_auth()
        sid = f"sess-{next(self._session_seq):04d}"
        s = FakeSession(id=sid, cwd=cwd, conn=conn)
        self.sessions[sid] = s
        conn.sessions.add(sid)
        return {"sessionId": sid, **self._session_result()}

    async def _load_session(self, conn: _Conn, cwd: str, session_id: str) -> dict[str, Any]:
        if not self.load_session:
            raise RequestError.method_not_found("session/load")
        self._check_auth()
        s = self.sessions.get(session_id)
        if s is None or s.closed:
            raise RequestError.resource_not_found(session_id)
        self.loads.append(session_id)
        old = s.conn
        if old is not None and old is not conn:
            old.sessions.discard(session_id)
        s.conn = conn
        s.cwd = cwd or s.cwd
        conn.sessions.add(session_id)
        for upd in list(s.history):
            await self._send_update(conn, session_id, upd, record=None)
        return self._session_result()

    def _session_of(self, conn: _Conn, session_id: str) -> FakeSession:
        s = self.sessions.get(session_id)
        if s is None or s.closed or session_id not in conn.sessions:
            raise RequestError.resource_not_found(session_id)
        return s

    async def _prompt(self, conn: _Conn, session_id: str, prompt: Sequence[Any]) -> dict[str, Any]:
        s = self._session_of(conn, session_id)
        self._check_auth("prompt")
        if s.running:
            raise RequestError.invalid_request(
                {"details": f"a prompt is already running on session {session_id}"}
            )
        text = text_of(prompt)
        self.prompts.append(text)
        s.prompts.append(text)
        index = self._turns
        self._turns += 1
        s.history.append(
            {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": text}}
        )
        s.cancel_requested = False
        s.turn_usage = None
        steps = self.script.steps_for(index, text)
        turn = asyncio.create_task(self._play(conn, s, steps), name=f"fake-acp-turn-{index}")
        s.turn_task = turn
        try:
            await asyncio.wait({turn})
        except asyncio.CancelledError:
            turn.cancel()
            raise
        if turn.cancelled():
            stop = "cancelled"
        else:
            exc = turn.exception()
            if isinstance(exc, _Hang):
                await asyncio.Event().wait()  # no response; ends when the connection does
            stop = turn.result()
        self.stop_reasons.append(stop)
        if s.turn_usage is not None and stop != "cancelled":
            return {"stopReason": stop, "usage": s.turn_usage}
        return {"stopReason": stop}

    def _cancel(self, session_id: str) -> None:
        self.cancels.append(session_id)
        s = self.sessions.get(session_id)
        if s is None:
            return
        s.cancel_requested = True
        if s.turn_task is not None and not s.turn_task.done():
            s.turn_task.cancel()

    def _close(self, conn: _Conn, session_id: str) -> dict[str, Any]:
        s = self.sessions.get(session_id)
        if s is None or s.closed:
            raise RequestError.resource_not_found(session_id)
        self.closes.append(session_id)
        if s.turn_task is not None and not s.turn_task.done():
            s.cancel_requested = True
            s.turn_task.cancel()
        s.closed = True
        conn.sessions.discard(session_id)
        if self.exit_on_close:
            # After this handler returns the SDK queues the response synchronously; the exit
            # runs later and closes connections gracefully, which flushes that response.
            asyncio.get_running_loop().call_soon(self._request_exit, 0)
        return {}

    # --- playing ----------------------------------------------------------------------------

    async def _send_update(
        self,
        conn: _Conn,
        session_id: str,
        update: dict[str, Any],
        *,
        record: FakeSession | None,
    ) -> None:
        """Validate through the SDK model and send as `session/update`."""
        assert conn.asc is not None
        notif = SessionNotification.model_validate({"sessionId": session_id, "update": update})
        if record is not None:
            record.history.append(update)
        await conn.asc.session_update(session_id=session_id, update=notif.update)

    async def _send_raw_update(self, conn: _Conn, session_id: str, update: dict[str, Any]) -> None:
        """Write a `session/update` without validation, through the connection's own sender
        queue (the SDK's private `_conn`, pinned SDK version), so wire order is kept."""
        assert conn.asc is not None
        await conn.asc._conn.send_notification(
            "session/update", {"sessionId": session_id, "update": update}
        )

    async def _play(self, conn: _Conn, s: FakeSession, steps: list[Step]) -> str:
        stop = await self._run_steps(conn, s, steps)
        return stop or "end_turn"

    async def _run_steps(self, conn: _Conn, s: FakeSession, steps: list[Step]) -> str | None:
        """Run steps; a stop reason ends the turn (returned), None = continue."""
        for step in steps:
            stop = await self._step(conn, s, step)
            if stop is not None:
                return stop
        return None

    async def _step(self, conn: _Conn, s: FakeSession, step: Step) -> str | None:
        sid = s.id
        if not isinstance(step, dict):
            self._bad_step(step)
            return None
        if "text" in step or "thought" in step:
            kind = "agent_message_chunk" if "text" in step else "agent_thought_chunk"
            body = step.get("text", step.get("thought"))
            upd: dict[str, Any] = {
                "sessionUpdate": kind,
                "content": {"type": "text", "text": str(body)},
            }
            if step.get("message_id") is not None:
                upd["messageId"] = str(step["message_id"])
            await self._send_update(conn, sid, upd, record=s)
        elif "tool_call" in step:
            await self._send_update(
                conn,
                sid,
                {"sessionUpdate": "tool_call", **tool_fields(step["tool_call"])},
                record=s,
            )
        elif "tool_update" in step:
            await self._send_update(
                conn,
                sid,
                {"sessionUpdate": "tool_call_update", **tool_fields(step["tool_update"])},
                record=s,
            )
        elif "permission" in step:
            return await self._permission(conn, s, step)
        elif "plan" in step:
            entries = [
                {
                    "content": str(e["content"]),
                    "priority": e.get("priority", "medium"),
                    "status": e.get("status", "pending"),
                }
                for e in step["plan"]
            ]
            await self._send_update(
                conn, sid, {"sessionUpdate": "plan", "entries": entries}, record=s
            )
        elif "usage" in step:
            u = step["usage"]
            upd = {"sessionUpdate": "usage_update", "used": int(u["used"]), "size": int(u["size"])}
            if u.get("cost") is not None:
                upd["cost"] = {
                    "amount": float(u["cost"]["amount"]),
                    "currency": str(u["cost"].get("currency", "USD")),
                }
            await self._send_update(conn, sid, upd, record=s)
        elif "unknown_update" in step:
            raw = dict(step["unknown_update"] or {})
            raw.setdefault("sessionUpdate", UNKNOWN_UPDATE_KIND)
            await self._send_raw_update(conn, sid, raw)
        elif "sleep" in step:
            await asyncio.sleep(float(step["sleep"]))
        elif "crash" in step:
            log.info("fake acp agent: crashing the connection mid-turn (script)")
            conn.writer.transport.abort()
            raise _Hang()
        elif "exit" in step:
            log.info("fake acp agent: exiting with %s mid-turn (script)", step["exit"])
            self._request_exit(int(step["exit"]))
            raise _Hang()
        elif "stop" in step:
            usage = step.get("prompt_usage")
            s.turn_usage = dict(usage) if isinstance(usage, dict) else None
            return str(step["stop"])
        else:
            self._bad_step(step)
        return None

    def _bad_step(self, step: Any) -> None:
        self.bad_steps.append(step)
        log.warning("fake acp agent: skipping unknown script step %r", step)

    async def _permission(self, conn: _Conn, s: FakeSession, step: Step) -> str | None:
        assert conn.asc is not None
        req = dict(step["permission"])
        tool_call_id = str(req["tool_call_id"])
        tc = {"toolCallId": tool_call_id}
        for src, dst in (
            ("title", "title"),
            ("kind", "kind"),
            ("status", "status"),
            ("raw_input", "rawInput"),
        ):
            if req.get(src) is not None:
                tc[dst] = req[src]
        options = [option_wire(o) for o in req.get("options") or DEFAULT_PERMISSION_OPTIONS]
        record: dict[str, Any] = {
            "session_id": s.id,
            "tool_call_id": tool_call_id,
            "outcome": None,
            "option_id": None,
            "allow": None,
        }
        try:
            resp: RequestPermissionResponse = await conn.asc.request_permission(
                session_id=s.id,
                tool_call=ToolCallUpdate.model_validate(tc),
                options=[PermissionOption.model_validate(o) for o in options],
            )
        except asyncio.CancelledError:
            record["outcome"] = "abandoned"
            self.permission_outcomes.append(record)
            raise
        outcome = resp.outcome
        if getattr(outcome, "outcome", None) != "selected":
            record["outcome"] = "cancelled"
            self.permission_outcomes.append(record)
            return "cancelled"
        option_id = str(getattr(outcome, "option_id", ""))
        kind = next((o["kind"] for o in options if o["optionId"] == option_id), None)
        allow = kind is not None and kind.startswith("allow")
        record.update(outcome="selected", option_id=option_id, allow=allow)
        self.permission_outcomes.append(record)
        branch = step.get("on_allow" if allow else "on_reject") or []
        return await self._run_steps(conn, s, list(branch))


class _ConnAgent:
    """The SDK-facing agent object of one connection (methods looked up by name)."""

    def __init__(self, agent: FakeAcpAgent, conn: _Conn) -> None:
        self._agent = agent
        self._conn = conn

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: Any = None,
        client_info: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        info = client_info.model_dump(mode="json") if client_info is not None else None
        return self._agent._initialize(protocol_version, client_info=info)

    async def authenticate(self, method_id: str, **kwargs: Any) -> dict[str, Any]:
        return self._agent._authenticate(method_id)

    async def new_session(
        self,
        cwd: str,
        additional_directories: list[str] | None = None,
        mcp_servers: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        return self._agent._new_session(self._conn, cwd)

    async def load_session(
        self,
        cwd: str,
        session_id: str,
        mcp_servers: Any = None,
        additional_directories: list[str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        return await self._agent._load_session(self._conn, cwd, session_id)

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> dict[str, Any]:
        return await self._agent._prompt(self._conn, session_id, prompt)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        self._agent._cancel(session_id)

    async def close_session(self, session_id: str, **kwargs: Any) -> dict[str, Any]:
        if not self._agent.close_session:
            raise RequestError.method_not_found("session/close")
        return self._agent._close(self._conn, session_id)
