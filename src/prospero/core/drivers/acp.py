"""AcpDriver: one agent driven over the Agent Client Protocol (ADR 0011, docs/adr/0005).

Prospero is the ACP *client*; the agent serves `session/*`. Per connection the driver resolves
the agent's endpoint (caliband `attach`), dials it like caliband's own transport (Unix, or TCP +
TLS + the `{"bearer": ...}` preamble; `transport.open_endpoint`) and speaks ACP's JSON-RPC with
the `agent-client-protocol` SDK (`acp.connect_to_agent` over the asyncio streams):
`initialize` → `session/new` (or `session/load` to rejoin) → one `session/prompt` per turn, the
spawn prompt first, then queued `send_input` texts. The mapping onto Prospero's EventKinds is
normative and lives in docs/acp-mapping.md.

Ordering (acp.md pitfall 1): the SDK dispatches every incoming message in its own task, so
handlers can run out of order. The driver therefore records everything from a raw stream
observer, which the SDK calls synchronously, in wire order, before dispatching: updates are
mapped there (pure state changes) into an ordered output queue that one pump task drains into
the sink. A `tool_started` whose input is not known yet (ACP may send `rawInput` in a later
update) is a placeholder in that queue: it is filled when the input arrives or the call
progresses (status, permission request, turn end) or after `tool_input_hold` seconds, and the
events behind it wait for it — so `tool_started` carries the real input *and* stays in wire
order. The prompt response is observed the same way, so `turn_finished` follows exactly the
updates that preceded it on the wire. Unknown update kinds and stop reasons fail the SDK's
validation; the observer sees them anyway and records them (metric, log, `unrecognized`),
never fatally.

Agent → client requests other than `session/request_permission` (fs/*, terminal/*, extension
methods) are answered with JSON-RPC method-not-found: the client is duck-typed and implements
those methods only to raise (pitfall 5). Permission requests go to a `PermissionBroker`
(default: `PolicyBroker`, deny); a cancelled turn or an ended session answers pending ones with
`cancelled` as ACP requires.

Lifecycle: a non-interactive agent's session ends after its spawn prompt returns (and any
input queued meanwhile), an interactive one's on `end_input`; then `session/close` if the agent
advertises it, the connection closes and `agent_finished` is emitted (run() returns
`finished`). A connection lost mid-turn records `turn_lost` (open tool calls are closed first);
the driver then reconnects with backoff and rejoins with `session/load` (replayed history is
suppressed: it is in the store already) or, if the agent cannot load sessions, records a
`stream_gap` and finishes as not resumable. `max_failures` consecutive failed connections end
run() with `gave_up` (state kept; a later run() continues). `close()` (prosperod stopping)
sends `session/cancel` for a turn in flight, records it as lost and leaves the session for the
next prosperod to rejoin.

Single driver (ADR 0011 decision 8): at most one AcpDriver per agent id exists in a process;
constructing a second raises `DriverConflict` until the first is closed, finishes or is
garbage-collected. With an `ownership` hook the driver also takes the agent's lease before it
opens a session (the FleetManager takes it for every driver).

Resume state (session id, turn count, a turn in flight, last stop reason, cumulative cost and
usage, terminal flag) is persisted through the optional `CursorStore` under the agent id.

SDK coupling: besides the public API the driver reads one private attribute of the pinned
SDK (`ClientSideConnection._conn._recv_task`) to notice a connection that ends while no
request is in flight; without it, it polls `reader.at_eof()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import logging
import os
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _pkg_version
from typing import Any, Literal, TypeVar, cast

import acp
import orjson
from acp import schema as s
from acp.connection import StreamDirection, StreamEvent
from pydantic import ValidationError

from prospero.core import metrics as m
from prospero.core.aio import wait_for
from prospero.core.drivers.base import (
    CursorStore,
    DriverExit,
    DriverOptions,
    DriverTarget,
    EventSink,
    wait_before_retry,
)
from prospero.core.errors import Conflict, InvalidState, ProsperoError
from prospero.core.metrics import Metrics
from prospero.core.normalize import RESULT_TEXT_CAP
from prospero.core.ownership import Ownership
from prospero.core.permissions import (
    PermissionBroker,
    PermissionOption,
    PermissionOutcome,
    PermissionRequest,
    PermissionToolCall,
    PolicyBroker,
)
from prospero.core.transport import close_writer, open_endpoint
from prospero.types.events import (
    AgentFinished,
    AgentInit,
    EventKind,
    Output,
    StreamGap,
    ToolFinished,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnLost,
    Usage,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

PROTOCOL_VERSION = 1
STATE_VERSION = 1
CLIENT_NAME = "prospero"
MAX_UNRECOGNIZED = 64
MAX_CLOSED_TOOLS = 256

# Metric names (counters) this driver adds.
ACP_UNKNOWN_UPDATES = "acp_unknown_updates"
ACP_UNKNOWN_STOP_REASONS = "acp_unknown_stop_reasons"
ACP_IGNORED_UPDATES = "acp_ignored_updates"
ACP_TURNS_LOST = "acp_turns_lost"
ACP_PERMISSION_REQUESTS = "acp_permission_requests"
ACP_UNSERVED_REQUESTS = "acp_unserved_requests"
ACP_LATE_TOOL_INPUT = "acp_late_tool_input"
ACP_PROMPT_ERRORS = "acp_prompt_errors"

KNOWN_STOP_REASONS = frozenset(
    {"end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"}
)
# ACP stop reason (plus Prospero's "error" / "lost") -> NDJSON RunEnd vocabulary.
STOP_OUTCOMES: dict[str, str] = {
    "end_turn": "EndOfTurn",
    "max_tokens": "MaxTokensExhausted",
    "max_turn_requests": "MaxTurnsReached",
    "refusal": "Refusal",
    "cancelled": "Cancelled",
    "error": "Error",
    "lost": "Error",
}
NOT_RESUMABLE = "NotResumable"
NOT_RESUMED = "history stays readable, session not resumed"
NOT_RESUMABLE_DETAIL = f"agent does not support session/load; {NOT_RESUMED}"
_TOOL_DONE = frozenset({"completed", "failed"})
_TOOL_PROGRESS = frozenset({"in_progress", "completed", "failed"})


def _client_version() -> str:
    try:
        return _pkg_version("prospero")
    except PackageNotFoundError:
        return "0"


CLIENT_VERSION = _client_version()


class DriverConflict(Conflict):
    """A second ACP driver for an agent that already has one in this process."""

    def __init__(
        self, agent_id: str, why: str = "already has an ACP driver in this process"
    ) -> None:
        super().__init__(f"agent '{agent_id}' {why}")
        self.agent_id = agent_id


# ---- single-driver registry -----------------------------------------------------------------

_REGISTRY: weakref.WeakValueDictionary[str, AcpDriver] = weakref.WeakValueDictionary()


def active_driver(agent_id: str) -> AcpDriver | None:
    """The live (not closed, not finished) ACP driver of an agent in this process, if any."""
    return _REGISTRY.get(agent_id)


def _register(driver: AcpDriver) -> None:
    existing = _REGISTRY.get(driver.target.agent_id)
    if existing is not None and existing is not driver:
        raise DriverConflict(driver.target.agent_id)
    _REGISTRY[driver.target.agent_id] = driver


def _release(driver: AcpDriver) -> None:
    if _REGISTRY.get(driver.target.agent_id) is driver:
        del _REGISTRY[driver.target.agent_id]


# ---- helpers --------------------------------------------------------------------------------


def outcome_for(stop: str | None) -> tuple[str, str | None]:
    """agent_finished `outcome` (and a detail for unknown reasons) for the last stop reason."""
    if stop is None:
        return "EndOfTurn", None
    label = STOP_OUTCOMES.get(stop)
    if label is not None:
        return label, None
    return "Unknown", f"agent stop reason {stop!r}"


def _cap(text: str, truncated: bool = False) -> ToolResult:
    if len(text) > RESULT_TEXT_CAP:
        return ToolResult(text=text[:RESULT_TEXT_CAP], truncated=True)
    return ToolResult(text=text, truncated=truncated)


def _json_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _block_text(block: Any) -> str | None:
    """Text of a ContentBlock (text, embedded text resource, resource link); None otherwise."""
    if isinstance(block, s.TextContentBlock):
        return block.text
    if isinstance(block, s.EmbeddedResourceContentBlock):
        res = block.resource
        if isinstance(res, s.TextResourceContents):
            return res.text
        return f"[resource {res.uri}]"
    if isinstance(block, s.ResourceContentBlock):
        return f"[{block.name}]({block.uri})"
    if isinstance(block, s.ImageContentBlock):
        return f"[image {block.mime_type}]"
    if isinstance(block, s.AudioContentBlock):
        return f"[audio {block.mime_type}]"
    return None


def render_content(content: Sequence[Any]) -> str:
    """Flatten ToolCallContent into text: text blocks, diffs (unified), terminal references."""
    parts: list[str] = []
    for item in content:
        if isinstance(item, s.ContentToolCallContent):
            text = _block_text(item.content)
            if text:
                parts.append(text)
        elif isinstance(item, s.FileEditToolCallContent):
            old = (item.old_text or "").splitlines(keepends=True)
            new = item.new_text.splitlines(keepends=True)
            diff = "".join(
                difflib.unified_diff(
                    old,
                    new,
                    fromfile=item.path if item.old_text is not None else "/dev/null",
                    tofile=item.path,
                )
            )
            parts.append(diff or f"{item.path}: unchanged")
        elif isinstance(item, s.TerminalToolCallContent):
            parts.append(f"[terminal {item.terminal_id}]")
    return "\n".join(parts)


def _usage_from(value: Any) -> Usage | None:
    """ACP (unstable) PromptResponse.usage → Usage; null when absent or malformed."""
    if value is None:
        return None
    if not isinstance(value, s.Usage):
        try:
            value = s.Usage.model_validate(value)
        except ValidationError:
            return None
    return Usage(
        input_tokens=value.input_tokens,
        output_tokens=value.output_tokens,
        cache_creation_input_tokens=value.cached_write_tokens,
        cache_read_input_tokens=value.cached_read_tokens,
    )


def _model_from(options: Sequence[Any] | None) -> str | None:
    for opt in options or ():
        if isinstance(opt, s.SessionConfigOptionSelect) and opt.category == "model":
            return opt.current_value or None
    return None


def _name_hint(raw: Any) -> str | None:
    """A programmatic tool name: unstable `name`, else `_meta.claudeCode.toolName`."""
    if not isinstance(raw, dict):
        return None
    name = raw.get("name")
    if isinstance(name, str) and name:
        return name
    meta = raw.get("_meta")
    if isinstance(meta, dict):
        cc = meta.get("claudeCode")
        if isinstance(cc, dict):
            tn = cc.get("toolName")
            if isinstance(tn, str) and tn:
                return tn
    return None


class _Slot:
    """One position in the ordered output queue; `event` is None while a tool_started waits."""

    __slots__ = ("event",)

    def __init__(self, event: EventKind | None) -> None:
        self.event = event


@dataclass
class _Tool:
    id: str
    title: str = ""
    kind: str | None = None
    hint: str | None = None
    raw_input: Any = None
    raw_output: Any = None
    content: list[Any] | None = None
    status: str | None = None
    name: str = ""
    slot: _Slot | None = None  # the held tool_started, until resolved
    timer: asyncio.TimerHandle | None = None

    def display_name(self) -> str:
        return self.hint or self.title or self.kind or "tool"

    def input_known(self) -> bool:
        return self.raw_input is not None and self.raw_input != {}


class _End:
    """end_input marker in the input queue."""


_END = _End()

Outcome = Literal["failed", "lost", "finished", "closed"]


# ---- the ACP client object (duck-typed; acp.md pitfall 5) -----------------------------------


class _Client:
    """What the SDK calls for agent → client messages. Updates are recorded by the driver's
    raw observer, so `session_update` does nothing; unsupported methods raise -32601."""

    def __init__(self, driver: AcpDriver) -> None:
        self._driver = driver

    async def session_update(self, session_id: str, update: Any, **meta: Any) -> None:
        return None

    async def request_permission(
        self,
        session_id: str,
        tool_call: s.ToolCallUpdate,
        options: list[s.PermissionOption],
        **meta: Any,
    ) -> s.RequestPermissionResponse:
        return await self._driver._answer_permission(session_id, tool_call, options)

    def _unserved(self, method: str) -> acp.RequestError:
        return acp.RequestError.method_not_found(method)

    async def read_text_file(self, **params: Any) -> Any:
        raise self._unserved("fs/read_text_file")

    async def write_text_file(self, **params: Any) -> Any:
        raise self._unserved("fs/write_text_file")

    async def create_terminal(self, **params: Any) -> Any:
        raise self._unserved("terminal/create")

    async def terminal_output(self, **params: Any) -> Any:
        raise self._unserved("terminal/output")

    async def release_terminal(self, **params: Any) -> Any:
        raise self._unserved("terminal/release")

    async def wait_for_terminal_exit(self, **params: Any) -> Any:
        raise self._unserved("terminal/wait_for_exit")

    async def kill_terminal(self, **params: Any) -> Any:
        raise self._unserved("terminal/kill")

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise self._unserved(f"_{method}")

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None


StreamObserver = Callable[[StreamEvent], Awaitable[None] | None]


class AcpDriver:
    """AgentDriver for an agent that speaks ACP on its per-agent endpoint."""

    protocol = "acp"

    def __init__(
        self,
        target: DriverTarget,
        sink: EventSink,
        options: DriverOptions,
        metrics: Metrics,
        cursor_store: CursorStore | None = None,
        *,
        broker: PermissionBroker | None = None,
        observers: Sequence[StreamObserver] = (),
        ownership: Ownership | None = None,
        handshake_timeout: float = 30.0,
        tool_input_hold: float = 1.0,
        close_timeout: float = 5.0,
    ) -> None:
        self.target = target
        self.sink = sink
        self.options = options
        self.metrics = metrics
        self.cursor_store = cursor_store
        self.broker: PermissionBroker = broker if broker is not None else PolicyBroker()
        self.extra_observers = list(observers)
        self.ownership = ownership
        self.handshake_timeout = handshake_timeout
        self.tool_input_hold = tool_input_hold
        self.close_timeout = close_timeout
        _register(self)  # raises DriverConflict: one driver per agent per process
        # lifecycle
        self._closing = False
        self._close_event = asyncio.Event()
        self._retry_now = asyncio.Event()  # nudge(): end a reconnect backoff
        self._terminal = False
        self._loaded = cursor_store is None
        self._running = False
        self._run_task: asyncio.Task[Any] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        # session
        self._session_id: str | None = None
        self._turns = 0
        # The turn started and not yet ended or lost (persisted: a hard stop leaves it set).
        self._in_flight: int | None = None
        # Its session/prompt is queued on the wire: a session/cancel now follows it.
        self._prompt_queued = False
        self._last_stop: str | None = None
        self._last_detail: str | None = None
        self._model: str | None = target.spec.model if target.spec is not None else None
        self._cost_total: float | None = None
        self._turn_cost_base: float | None = None
        self._turn_cost_seen = False
        self._usage_total: Usage | None = None
        self._caps: s.AgentCapabilities | None = None
        self._conn: acp.ClientSideConnection | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._loading = False
        self._cancel_sent = False
        self._turn_cancel = asyncio.Event()
        # steering
        self._inputs: deque[str | _End] = deque()
        self._input_event = asyncio.Event()
        self._ending = False
        # tool calls of the current turn
        self._tools: dict[str, _Tool] = {}
        self._closed_tools: deque[str] = deque(maxlen=MAX_CLOSED_TOOLS)
        # ordered output
        self._out: deque[_Slot] = deque()
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._delivering = False
        # Slots queued / events handed to the sink so far (a broker's flush waits on these).
        self._pushed = 0
        self._handed = 0
        self._progress = asyncio.Event()
        # Permission requests being decided (close() lets their answers out first).
        self._permissions_waiting = 0
        self._permissions_idle = asyncio.Event()
        self._permissions_idle.set()
        self._pump_task: asyncio.Task[None] | None = None
        self._pump_error: BaseException | None = None
        self._saved: bytes | None = None
        self._last_error = ""
        self._warned_currency = False
        # observations (tests, ops)
        self.connections = 0
        self.resumed = 0
        self.replayed_updates = 0
        self.unrecognized: deque[dict[str, Any]] = deque(maxlen=MAX_UNRECOGNIZED)

    # ---- AgentDriver -------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """The terminal `agent_finished` has been emitted."""
        return self._terminal

    @property
    def session_id(self) -> str | None:
        return self._session_id

    @property
    def turns(self) -> int:
        """Prompts sent on the session so far (the next turn's 0-based index)."""
        return self._turns

    @property
    def turn_in_flight(self) -> int | None:
        return self._in_flight

    async def run(self) -> DriverExit:
        if self._running:
            raise DriverConflict(self.target.agent_id, "is already being driven by this driver")
        if self._closing:
            return DriverExit.closed
        if self._terminal:
            return DriverExit.finished
        self._running = True
        self._run_task = asyncio.current_task()
        self._idle.clear()
        self._pump_error = None
        self._pump_task = asyncio.create_task(self._pump(), name=f"acp-pump-{self.target.agent_id}")
        try:
            if self.ownership is not None:
                lease = await self.ownership.try_acquire(self.target.agent_id)
                if lease is None:
                    log.info(
                        "agent %s: another replica owns it; not opening an ACP session",
                        self.target.agent_id,
                    )
                    return DriverExit.closed
            result = await self._run()
            await self._drain_out()
            await self._save()
            return result
        except BaseException:
            with contextlib.suppress(Exception):
                await self._save()
            raise
        finally:
            pump = self._pump_task
            self._pump_task = None
            if pump is not None:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pump
            self._cancel_timers()
            self._running = False
            self._run_task = None
            self._idle.set()
            if self._terminal or self._closing:
                _release(self)

    async def send_input(self, text: str) -> None:
        """Queue `text` as the next `session/prompt` (sent when the current turn ends)."""
        self._check_steerable("send input to")
        self._inputs.append(text)
        self._input_event.set()

    async def end_input(self) -> None:
        """End the session once the queued prompts have run; the agent then finishes."""
        if self._terminal or self._ending:
            return
        self._check_steerable("end input of")
        self._ending = True
        self._inputs.append(_END)
        self._input_event.set()

    async def cancel_turn(self) -> None:
        """`session/cancel` for the turn in flight (it then ends `cancelled`); pending
        permission requests are answered `cancelled`. A no-op when no turn is in flight."""
        conn, sid, turn = self._conn, self._session_id, self._in_flight
        if conn is None or sid is None or turn is None:
            log.info("agent %s: cancel requested with no turn in flight", self.target.agent_id)
            return
        self._cancel_sent = True
        self._turn_cancel.set()
        if self._prompt_queued:  # else the turn sends it right after its prompt
            await self._send_cancel(conn, sid, self.close_timeout)

    async def _send_cancel(self, conn: acp.ClientSideConnection, sid: str, limit: float) -> None:
        try:
            await wait_for(conn.cancel(session_id=sid), limit)
        except (ConnectionError, OSError, TimeoutError) as e:
            log.info("agent %s: could not send session/cancel: %s", self.target.agent_id, e)
        else:
            log.info(
                "agent %s: session/cancel sent for turn %s", self.target.agent_id, self._in_flight
            )

    def nudge(self) -> None:
        """The agent's status changed: end a reconnect backoff now."""
        self._retry_now.set()

    async def close(self) -> None:
        """Stop driving: a turn in flight is cancelled and recorded as lost; the session is
        left open for a later driver to rejoin. run() returns `closed`."""
        if self._closing:
            if self._running and asyncio.current_task() is not self._run_task:
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._idle.wait(), 2 * self.close_timeout)
            return
        self._closing = True
        self._close_event.set()
        conn, sid = self._conn, self._session_id
        if conn is not None and sid is not None and self._in_flight is not None:
            self._cancel_sent = True
            self._turn_cancel.set()
            if self._permissions_waiting:
                # Pending permission requests now answer `cancelled`: let those answers reach
                # the SDK's (FIFO) sender before session/cancel, so they are written before
                # the connection is cut (writing after the abort fails noisily in the SDK).
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._permissions_idle.wait(), 1.0)
                for _ in range(3):
                    await asyncio.sleep(0)
            if self._prompt_queued:
                await self._send_cancel(conn, sid, 1.0)
        if self._writer is not None:
            self._writer.transport.abort()
        if self._running:
            if asyncio.current_task() is not self._run_task:
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._idle.wait(), 2 * self.close_timeout)
        else:
            self._cancel_timers()
            await self._save()
            _release(self)

    # ---- main loop ---------------------------------------------------------------------------

    async def _run(self) -> DriverExit:
        await self._load_once()
        if self._closing:
            return DriverExit.closed
        if self._terminal:
            return DriverExit.finished
        failures = 0
        while True:
            outcome = await self._connection()
            if self._terminal:
                return DriverExit.finished
            if self._closing:
                return DriverExit.closed
            if outcome == "lost":
                failures = 0
            failures += 1
            if failures >= self.options.max_failures:
                log.warning(
                    "agent %s: giving up on its ACP endpoint after %d consecutive failed "
                    "connections (last error: %s)",
                    self.target.agent_id,
                    failures,
                    self._last_error or "unknown",
                )
                return DriverExit.gave_up
            await wait_before_retry(
                self.target.agent_id,
                failures,
                self.options,
                self.metrics,
                self._close_event,
                self._retry_now,
            )
            if self._closing:
                return DriverExit.closed

    async def _connection(self) -> Outcome:
        conn_pair = await self._dial()
        if conn_pair is None:
            return "failed"
        reader, writer = conn_pair
        if self._closing:
            writer.transport.abort()
            return "closed"
        self._reader, self._writer = reader, writer
        self.connections += 1
        observers: list[StreamObserver] = [self._observe, *self.extra_observers]
        # Duck-typed on purpose (pitfall 5): subclassing acp.Client would answer `null`
        # instead of method-not-found for anything not implemented here.
        client = cast(acp.Client, _Client(self))
        conn = acp.connect_to_agent(client, writer, reader, observers=observers)
        self._conn = conn
        try:
            return await self._session(conn)
        finally:
            self._conn = None
            self._loading = False
            if self._closing:
                writer.transport.abort()
            with contextlib.suppress(Exception):
                await wait_for(conn.close(), self.close_timeout)
            await close_writer(writer)
            self._reader = self._writer = None

    async def _dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Resolve and dial, abandoned as soon as close() is called. None on failure."""

        async def attempt() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            endpoint = await self.target.resolve_endpoint()
            return await open_endpoint(endpoint, self.target.security)

        task = asyncio.create_task(attempt())
        closer = asyncio.create_task(self._close_event.wait())
        try:
            await asyncio.wait({task, closer}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait({task})
            if task.done() and not task.cancelled() and task.exception() is None:
                task.result()[1].transport.abort()
            raise
        finally:
            closer.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
        if task.cancelled():
            return None
        exc = task.exception()
        if exc is not None:
            self._last_error = str(exc) or type(exc).__name__
            if isinstance(exc, ProsperoError | OSError | ValueError):
                log.info("agent %s: cannot reach the ACP endpoint: %s", self.target.agent_id, exc)
            else:
                log.warning(
                    "agent %s: cannot reach the ACP endpoint: %r", self.target.agent_id, exc
                )
            return None
        return task.result()

    async def _bounded(self, coro: Coroutine[Any, Any, T], what: str, limit: float) -> T | None:
        """Await an SDK request; None (logged, `_last_error` set) on failure."""
        agent = self.target.agent_id
        try:
            return await wait_for(coro, limit)
        except TimeoutError:
            self._last_error = f"{what}: no answer within {limit:g}s"
        except ConnectionError as e:
            hint = " (wrong token?)" if what == "initialize" else ""
            self._last_error = f"{what}: the connection closed{hint}: {e}"
        except OSError as e:
            self._last_error = f"{what}: {e}"
        except acp.RequestError as e:
            self._last_error = f"{what} refused: {e} (code {e.code})"
        except ValidationError as e:
            self._last_error = f"{what}: malformed answer: {e.error_count()} validation errors"
        if not self._closing:
            log.warning("agent %s: ACP %s", agent, self._last_error)
        return None

    async def _session(self, conn: acp.ClientSideConnection) -> Outcome:
        agent = self.target.agent_id
        init = await self._bounded(
            conn.initialize(
                protocol_version=PROTOCOL_VERSION,
                client_capabilities=s.ClientCapabilities(
                    fs=s.FileSystemCapabilities(read_text_file=False, write_text_file=False),
                    terminal=False,
                ),
                client_info=s.Implementation(
                    name=CLIENT_NAME, title="Prospero", version=CLIENT_VERSION
                ),
            ),
            "initialize",
            self.handshake_timeout,
        )
        if init is None:
            return "closed" if self._closing else "failed"
        if init.protocol_version != PROTOCOL_VERSION:
            self._last_error = (
                f"the agent speaks ACP protocol version {init.protocol_version}, "
                f"Prospero speaks {PROTOCOL_VERSION}"
            )
            log.warning("agent %s: %s", agent, self._last_error)
            return "failed"
        self._caps = init.agent_capabilities or s.AgentCapabilities()
        if self._session_id is None:
            new = await self._bounded(
                conn.new_session(cwd=self._cwd(), mcp_servers=[]),
                "session/new",
                self.handshake_timeout,
            )
            if new is None:
                return "closed" if self._closing else "failed"
            self._session_id = new.session_id
            self._model = _model_from(new.config_options) or self._model
            log.info("agent %s: ACP session %s started", agent, new.session_id)
            self._push(AgentInit(model=self._model or "", tools=[], session_id=new.session_id))
            await self._save()
        else:
            if not self._caps.load_session:
                log.warning("agent %s: %s", agent, NOT_RESUMABLE_DETAIL)
                self._finish_not_resumable(NOT_RESUMABLE_DETAIL)
                return "finished"
            sid = self._session_id
            self._loading = True
            try:
                loaded = await wait_for(
                    conn.load_session(cwd=self._cwd(), session_id=sid, mcp_servers=[]),
                    self.handshake_timeout,
                )
            except acp.RequestError as e:
                detail = f"the agent refused session/load ({e}, code {e.code}); {NOT_RESUMED}"
                log.warning("agent %s: %s", agent, detail)
                self._finish_not_resumable(detail)
                return "finished"
            except (ConnectionError, OSError, TimeoutError, ValidationError) as e:
                self._last_error = f"session/load: {e or type(e).__name__}"
                if not self._closing:
                    log.warning("agent %s: ACP %s", agent, self._last_error)
                return "closed" if self._closing else "failed"
            finally:
                self._loading = False
            self.resumed += 1
            if loaded is not None:
                self._model = _model_from(loaded.config_options) or self._model
            log.info(
                "agent %s: rejoined ACP session %s after %d turns (%d replayed updates skipped)",
                agent,
                sid,
                self._turns,
                self.replayed_updates,
            )
        return await self._drive(conn)

    async def _drive(self, conn: acp.ClientSideConnection) -> Outcome:
        while True:
            if self._closing:
                return "closed"
            prompt = self._next_prompt()
            if prompt is None:
                if self._should_end():
                    await self._end_session(conn)
                    return "finished"
                alive = await self._wait_input(conn)
                if self._closing:
                    return "closed"
                if not alive:
                    self._last_error = "the agent closed the connection"
                    log.info("agent %s: the ACP connection ended while idle", self.target.agent_id)
                    return "lost"
                continue
            if not self._alive(conn):
                # Not sent: keep a queued text for the next connection (the spawn prompt is
                # picked again by itself while no turn has run).
                if self._turns > 0:
                    self._inputs.appendleft(prompt)
                self._last_error = "the agent closed the connection"
                return "lost"
            lost = await self._turn(conn, prompt)
            if lost:
                return "closed" if self._closing else "lost"

    def _next_prompt(self) -> str | None:
        if self._turns == 0:
            spec = self.target.spec
            if spec is not None and spec.initial_prompt:
                return spec.initial_prompt
        if self._inputs and isinstance(self._inputs[0], str):
            text = self._inputs.popleft()
            assert isinstance(text, str)
            return text
        return None

    def _should_end(self) -> bool:
        if self._inputs and isinstance(self._inputs[0], _End):
            self._inputs.popleft()
            return True
        return not self.target.interactive and not self._inputs

    async def _wait_input(self, conn: acp.ClientSideConnection) -> bool:
        """Wait for queued input or close(). False if the connection ended meanwhile."""
        recv = _receive_task(conn)
        while not self._inputs and not self._closing:
            self._input_event.clear()
            waiters: set[asyncio.Future[Any]] = {
                asyncio.ensure_future(self._input_event.wait()),
                asyncio.ensure_future(self._close_event.wait()),
            }
            try:
                await asyncio.wait(
                    waiters | ({recv} if recv is not None else set()),
                    return_when=asyncio.FIRST_COMPLETED,
                    timeout=None if recv is not None else 0.5,
                )
            finally:
                for w in waiters:
                    w.cancel()
            if not self._alive(conn):
                return False
        return True

    def _alive(self, conn: acp.ClientSideConnection) -> bool:
        recv = _receive_task(conn)
        if recv is not None:
            return not recv.done()
        reader = self._reader
        return reader is not None and not reader.at_eof()

    async def _turn(self, conn: acp.ClientSideConnection, text: str) -> bool:
        """One prompt turn. True if the turn (or the connection) was lost."""
        sid = self._session_id
        assert sid is not None
        turn = self._turns
        self._turns += 1
        self._in_flight = turn
        self._prompt_queued = False
        self._cancel_sent = False
        self._turn_cancel = asyncio.Event()
        self._turn_cost_base = self._cost_total
        self._turn_cost_seen = False
        await self._save()
        agent = self.target.agent_id
        prompt = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[acp.text_block(text)]))
        try:
            # One loop turn: the SDK has queued the request in its (FIFO) sender, so a
            # session/cancel sent from now on reaches the agent after the prompt.
            await asyncio.sleep(0)
            if self._in_flight == turn:
                self._prompt_queued = True
                if self._cancel_sent and not prompt.done():
                    await self._send_cancel(conn, sid, self.close_timeout)
            resp = await prompt
        except asyncio.CancelledError:
            prompt.cancel()
            raise
        except acp.RequestError as e:
            self.metrics.inc(ACP_PROMPT_ERRORS)
            log.warning("agent %s: turn %d failed: %s (code %s)", agent, turn, e, e.code)
            if self._in_flight == turn:
                self._end_turn(turn, "error", None, detail=f"{e} (code {e.code})")
        except ValidationError:
            # Unknown stop reason (pitfall 4): the observer has ended the turn from the raw
            # response; this only covers a response the observer could not attribute.
            if self._in_flight == turn:
                self._end_turn(turn, "unknown", None)
        except (ConnectionError, OSError) as e:
            if self._in_flight == turn:
                reason = (
                    "the driver was closed (prosperod stopping) while the turn was in flight"
                    if self._closing
                    else f"the connection to the agent was lost mid-turn: {e or type(e).__name__}"
                )
                self._lose_turn(turn, reason)
            self._last_error = f"connection lost: {e or type(e).__name__}"
            await self._drain_out()
            await self._save()
            return True
        else:
            if self._in_flight == turn:
                self._end_turn(turn, resp.stop_reason, _usage_from(resp.usage))
        await self._drain_out()
        await self._save()
        return False

    async def _end_session(self, conn: acp.ClientSideConnection) -> None:
        caps = self._caps
        sid = self._session_id
        if (
            sid is not None
            and caps is not None
            and caps.session_capabilities is not None
            and caps.session_capabilities.close is not None
        ):
            await self._bounded(
                conn.close_session(session_id=sid), "session/close", self.close_timeout
            )
        outcome, detail = outcome_for(self._last_stop)
        self._finish(outcome, detail or self._last_detail)

    # ---- mapping (synchronous: called in wire order) -----------------------------------------

    def _observe(self, event: StreamEvent) -> None:
        if event.direction is not StreamDirection.INCOMING:
            return
        msg = event.message
        try:
            method = msg.get("method")
            if method == "session/update":
                self._on_update(msg.get("params"))
            elif isinstance(method, str):
                if "id" in msg:
                    if method == "session/request_permission":
                        self._on_permission_request(msg.get("params"))
                    else:
                        self.metrics.inc(ACP_UNSERVED_REQUESTS)
                        log.info(
                            "agent %s: answered %s with method-not-found",
                            self.target.agent_id,
                            method,
                        )
            elif "id" in msg:
                self._on_response(msg)
        except Exception:  # a mapping bug must not kill the session
            self.metrics.inc(m.MALFORMED_LINES)
            log.exception("agent %s: failed to map an ACP message; skipped", self.target.agent_id)

    def _on_response(self, msg: dict[str, Any]) -> None:
        if self._loading:
            # The only request outstanding while loading is session/load: its answer ends
            # the replay, whatever follows is live.
            self._loading = False
            return
        result = msg.get("result")
        turn = self._in_flight
        if turn is None or not isinstance(result, dict) or "stopReason" not in result:
            return
        stop = result.get("stopReason")
        usage = _usage_from(result.get("usage"))
        if not isinstance(stop, str) or stop not in KNOWN_STOP_REASONS:
            self.metrics.inc(ACP_UNKNOWN_STOP_REASONS)
            self._remember_unrecognized("stop_reason", {"stopReason": stop})
            log.warning(
                "agent %s: unknown stop reason %r ending turn %d; recorded as is",
                self.target.agent_id,
                stop,
                turn,
            )
            stop = stop if isinstance(stop, str) and stop else "unknown"
        self._end_turn(turn, stop, usage)

    def _on_update(self, params: Any) -> None:
        if self._loading:
            self.replayed_updates += 1
            return
        raw = params.get("update") if isinstance(params, dict) else None
        try:
            note = s.SessionNotification.model_validate(params)
        except ValidationError:
            kind = raw.get("sessionUpdate") if isinstance(raw, dict) else None
            self.metrics.inc(ACP_UNKNOWN_UPDATES)
            self._remember_unrecognized("update", raw if isinstance(raw, dict) else {"raw": raw})
            log.warning(
                "agent %s: unknown or malformed ACP session update %r recorded and skipped",
                self.target.agent_id,
                kind,
            )
            return
        u = note.update
        if isinstance(u, s.AgentMessageChunk):
            text = _block_text(u.content)
            if text:
                self._push(Output(stream="stdout", chunk=text))
        elif isinstance(u, s.AgentThoughtChunk):
            text = _block_text(u.content)
            if text and self.options.include_thinking:
                self._push(Output(stream="thinking", chunk=text))
        elif isinstance(u, s.ToolCallStart):
            self._on_tool(u, raw, start=True)
        elif isinstance(u, s.ToolCallProgress):
            self._on_tool(u, raw, start=False)
        elif isinstance(u, s.UsageUpdate):
            self._on_usage(u)
        elif isinstance(u, s.ConfigOptionUpdate):
            self._model = _model_from(u.config_options) or self._model
            self.metrics.inc(ACP_IGNORED_UPDATES)
        else:
            # user_message_chunk (an echo outside session/load), plan, modes, commands,
            # session info: no event kind carries them (docs/adr/0005).
            self.metrics.inc(ACP_IGNORED_UPDATES)
            log.debug("agent %s: ACP %s not mapped", self.target.agent_id, u.session_update)

    def _on_usage(self, u: s.UsageUpdate) -> None:
        cost = u.cost
        if cost is None:
            return
        if cost.currency.upper() != "USD":
            if not self._warned_currency:
                self._warned_currency = True
                log.warning(
                    "agent %s reports cost in %s; cost_usd stays null",
                    self.target.agent_id,
                    cost.currency,
                )
            return
        self._cost_total = float(cost.amount)
        self._turn_cost_seen = True

    def _on_tool(self, u: s.ToolCallStart | s.ToolCallProgress, raw: Any, *, start: bool) -> None:
        tid = u.tool_call_id
        st = self._tools.get(tid)
        if st is None:
            if tid in self._closed_tools:
                log.debug(
                    "agent %s: update for closed tool call %s ignored", self.target.agent_id, tid
                )
                return
            st = _Tool(id=tid, title=u.title or "", kind=u.kind, hint=_name_hint(raw))
            self._merge_tool(st, u)
            self._tools[tid] = st
            if not start:
                log.debug(
                    "agent %s: tool call %s updated before announced", self.target.agent_id, tid
                )
            self._start_tool(st)
        else:
            self._merge_tool(st, u)
            st.hint = st.hint or _name_hint(raw)
        self._after_tool_change(st)

    def _merge_tool(
        self, st: _Tool, u: s.ToolCallStart | s.ToolCallProgress | s.ToolCallUpdate
    ) -> None:
        """Apply the fields present in `u` (ACP update semantics: absent = unchanged)."""
        fields = u.model_fields_set
        if u.title:
            st.title = u.title
        if u.kind is not None:
            st.kind = u.kind
        if u.status is not None:
            st.status = u.status
        if "raw_input" in fields and u.raw_input is not None:
            if st.slot is None and st.name and u.raw_input != st.raw_input:
                # tool_started already went out (hold expired): the new input is not re-sent.
                self.metrics.inc(ACP_LATE_TOOL_INPUT)
                log.info(
                    "agent %s: input of tool call %s arrived after its tool_started",
                    self.target.agent_id,
                    st.id,
                )
            st.raw_input = u.raw_input
        if "raw_output" in fields:
            st.raw_output = u.raw_output
        if u.content is not None:
            st.content = list(u.content)

    def _start_tool(self, st: _Tool) -> None:
        slot = _Slot(None)
        st.slot = slot
        self._out.append(slot)
        self._pushed += 1
        self._drained.clear()
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            st.timer = loop.call_later(self.tool_input_hold, self._hold_expired, st.id, slot)

    def _hold_expired(self, tid: str, slot: _Slot) -> None:
        st = self._tools.get(tid)
        if st is not None and st.slot is slot:
            log.debug(
                "agent %s: tool call %s input still unknown; started without it",
                self.target.agent_id,
                tid,
            )
            self._resolve_start(st)

    def _resolve_start(self, st: _Tool) -> None:
        slot = st.slot
        if slot is None:
            return
        if st.timer is not None:
            st.timer.cancel()
            st.timer = None
        st.slot = None
        st.name = st.display_name()
        slot.event = ToolStarted(id=st.id, name=st.name, input=st.raw_input)
        self._wake.set()

    def _after_tool_change(self, st: _Tool) -> None:
        if st.slot is not None and (st.input_known() or st.status in _TOOL_PROGRESS):
            self._resolve_start(st)
        if st.status in _TOOL_DONE:
            self._finish_tool(st, ok=st.status == "completed", result=self._result_of(st))

    def _result_of(self, st: _Tool) -> ToolResult:
        if st.raw_output is not None:
            return _cap(_json_text(st.raw_output))
        if st.content:
            return _cap(render_content(st.content))
        return ToolResult()

    def _finish_tool(self, st: _Tool, *, ok: bool, result: ToolResult) -> None:
        self._resolve_start(st)
        self._tools.pop(st.id, None)
        self._closed_tools.append(st.id)
        self._push(ToolFinished(id=st.id, name=st.name, ok=ok, result=result))

    def _close_open_tools(self, text: str) -> None:
        for st in list(self._tools.values()):
            self._finish_tool(st, ok=False, result=_cap(text))

    def _on_permission_request(self, params: Any) -> None:
        if self._loading:
            return
        try:
            req = s.RequestPermissionRequest.model_validate(params)
        except ValidationError:
            return  # the SDK answers invalid params
        tc = req.tool_call
        raw = params.get("toolCall") if isinstance(params, dict) else None
        st = self._tools.get(tc.tool_call_id)
        if st is None:
            if tc.tool_call_id in self._closed_tools:
                return
            st = _Tool(id=tc.tool_call_id, title=tc.title or "", kind=tc.kind, hint=_name_hint(raw))
            self._merge_tool(st, tc)
            self._tools[st.id] = st
            self._start_tool(st)
        else:
            self._merge_tool(st, tc)
        # The request is about this input: tool_started goes out now, with what we know.
        self._resolve_start(st)
        if st.status in _TOOL_DONE:
            self._finish_tool(st, ok=st.status == "completed", result=self._result_of(st))

    def _end_turn(
        self, turn: int, stop: str, usage: Usage | None, detail: str | None = None
    ) -> None:
        if self._cancel_sent and stop != "cancelled":
            log.info(
                "agent %s: turn %d answered %r after session/cancel; recorded as cancelled",
                self.target.agent_id,
                turn,
                stop,
            )
            stop = "cancelled"
        self._close_open_tools(
            "cancelled: the turn was cancelled before the tool call completed"
            if stop == "cancelled"
            else f"abandoned: the turn ended ({stop}) before the tool call completed"
        )
        cost: float | None = None
        if self._turn_cost_seen and self._cost_total is not None:
            delta = self._cost_total - (self._turn_cost_base or 0.0)
            cost = round(delta, 12) if delta >= 0 else None
        self._push(
            TurnFinished(turn=turn, stop_reason=stop, model=self._model, usage=usage, cost_usd=cost)
        )
        if usage is not None:
            self._usage_total = (
                usage if self._usage_total is None else self._usage_total.plus(usage)
            )
        self._last_stop = stop
        self._last_detail = detail
        self._in_flight = None
        self._prompt_queued = False

    def _lose_turn(self, turn: int, reason: str) -> None:
        self.metrics.inc(ACP_TURNS_LOST)
        log.warning("agent %s: turn %d lost: %s", self.target.agent_id, turn, reason)
        self._close_open_tools(f"abandoned: {reason}")
        self._push(TurnLost(turn=turn, reason=reason))
        self._last_stop = "lost"
        self._last_detail = f"turn {turn} was lost: {reason}"
        self._in_flight = None
        self._prompt_queued = False

    def _finish(self, outcome: str, detail: str | None) -> None:
        for st in list(self._tools.values()):
            self._finish_tool(st, ok=False, result=_cap("abandoned: the session ended"))
        self._push(
            AgentFinished(
                outcome=outcome,
                cost_usd=self._cost_total,
                turns=self._turns,
                usage=self._usage_total,
                model=self._model,
                detail=detail,
            )
        )
        self._terminal = True
        log.info(
            "agent %s: ACP session finished (%s, %d turns)",
            self.target.agent_id,
            outcome,
            self._turns,
        )

    def _finish_not_resumable(self, detail: str) -> None:
        self.metrics.inc(m.STREAM_GAPS)
        self._push(StreamGap(missing=None, detail=detail))
        self._finish(NOT_RESUMABLE, detail)

    def _remember_unrecognized(self, what: str, raw: dict[str, Any]) -> None:
        self.unrecognized.append({"what": what, "raw": raw})

    # ---- permissions -------------------------------------------------------------------------

    async def _answer_permission(
        self, session_id: str, tool_call: s.ToolCallUpdate, options: list[s.PermissionOption]
    ) -> s.RequestPermissionResponse:
        self._permissions_waiting += 1
        self._permissions_idle.clear()
        try:
            return await self._decide_permission(session_id, tool_call, options)
        finally:
            self._permissions_waiting -= 1
            if not self._permissions_waiting:
                self._permissions_idle.set()

    async def _decide_permission(
        self, session_id: str, tool_call: s.ToolCallUpdate, options: list[s.PermissionOption]
    ) -> s.RequestPermissionResponse:
        self.metrics.inc(ACP_PERMISSION_REQUESTS)
        agent = self.target.agent_id
        st = self._tools.get(tool_call.tool_call_id)
        spec = self.target.spec
        request = PermissionRequest(
            agent_id=agent,
            session_id=session_id,
            tool_call=PermissionToolCall(
                id=tool_call.tool_call_id,
                title=(st.title if st is not None else tool_call.title) or "",
                kind=st.kind if st is not None else tool_call.kind,
                input=st.raw_input if st is not None else tool_call.raw_input,
            ),
            options=tuple(PermissionOption(o.option_id, o.name, o.kind) for o in options),
            posture=spec.permission_posture if spec is not None else None,
            turn=self._in_flight if self._in_flight is not None else max(0, self._turns - 1),
            workspace=self.target.workspace,
            flush=self._flush_out,
        )
        cancelled = self._turn_cancel
        outcome = PermissionOutcome.cancelled("cancel")
        if not cancelled.is_set() and not self._closing:
            decide = asyncio.ensure_future(self.broker.decide(request))
            waiter = asyncio.ensure_future(cancelled.wait())
            closer = asyncio.ensure_future(self._close_event.wait())
            try:
                await asyncio.wait({decide, waiter, closer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for f in (decide, waiter, closer):
                    if not f.done():
                        f.cancel()
            if decide.done() and not decide.cancelled():
                exc = decide.exception()
                if exc is not None:
                    log.warning(
                        "agent %s: permission broker failed: %r; answering cancelled", agent, exc
                    )
                else:
                    outcome = decide.result()
        offered = {o.option_id for o in options}
        if outcome.decision == "selected" and outcome.option_id not in offered:
            log.warning(
                "agent %s: broker chose option %r the agent did not offer; answering cancelled",
                agent,
                outcome.option_id,
            )
            outcome = PermissionOutcome.cancelled(outcome.by)
        log.info(
            "agent %s: permission for tool call %s (%s): %s%s by %s",
            agent,
            request.tool_call.id,
            request.tool_call.title,
            outcome.decision,
            f" {outcome.option_id}" if outcome.option_id else "",
            outcome.by,
        )
        if outcome.decision == "selected" and outcome.option_id is not None:
            return s.RequestPermissionResponse(
                outcome=s.AllowedOutcome(outcome="selected", option_id=outcome.option_id)
            )
        return s.RequestPermissionResponse(outcome=s.DeniedOutcome(outcome="cancelled"))

    # ---- ordered output ----------------------------------------------------------------------

    def _push(self, ev: EventKind) -> None:
        self._out.append(_Slot(ev))
        self._pushed += 1
        self._drained.clear()
        self._wake.set()

    async def _pump(self) -> None:
        """The one task that hands events to the sink, in queue order. Events ready together
        go out as one batch when the sink has `emit_batch` (the FleetManager's does)."""
        batch_sink = getattr(self.sink, "emit_batch", None)
        try:
            while True:
                while self._out and self._out[0].event is not None:
                    batch: list[EventKind] = []
                    while self._out and (ev := self._out[0].event) is not None:
                        self._out.popleft()
                        batch.append(ev)
                    self._delivering = True
                    try:
                        if batch_sink is not None and len(batch) > 1:
                            await batch_sink(batch)
                        else:
                            for ev in batch:
                                await self.sink(ev)
                    finally:
                        self._delivering = False
                    self._handed += len(batch)
                    self._progress.set()
                if not self._out:
                    self._drained.set()
                self._wake.clear()
                await self._wake.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            self._pump_error = e
            self._drained.set()
            log.warning("agent %s: event sink failed: %r", self.target.agent_id, e)

    async def _flush_out(self, limit: float = 2.0) -> None:
        """Wait until the events queued so far have been handed to the sink: a permission
        broker calls it (`PermissionRequest.flush`) before putting its own events on the
        agent's stream. Bounded; returns early when no pump runs."""
        target = self._pushed
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while self._handed < target:
            pump = self._pump_task
            left = deadline - loop.time()
            if pump is None or pump.done() or self._pump_error is not None or left <= 0:
                return
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                await wait_for(self._progress.wait(), left)

    async def _drain_out(self) -> None:
        """Wait until every queued event has been handed to the sink (held tool starts are
        resolved first). Raises what the sink raised."""
        for st in list(self._tools.values()):
            self._resolve_start(st)
        while self._pump_error is None and (self._out or self._delivering):
            pump = self._pump_task
            if pump is None or pump.done():
                break
            self._drained.clear()
            self._wake.set()
            await self._drained.wait()
        if self._pump_error is not None:
            raise self._pump_error

    def _cancel_timers(self) -> None:
        for st in self._tools.values():
            if st.timer is not None:
                st.timer.cancel()
                st.timer = None

    # ---- steering checks ---------------------------------------------------------------------

    def _check_steerable(self, op: str) -> None:
        if self._terminal:
            raise InvalidState(op, self.target.agent_id, "finished", "the ACP session has ended")
        if self._closing:
            raise InvalidState(op, self.target.agent_id, "closed", "the driver is closed")
        if self._ending:
            raise InvalidState(op, self.target.agent_id, "ending", "input has already ended")

    def _cwd(self) -> str:
        if self.target.working_dir:
            return self.target.working_dir
        spec = self.target.spec
        if spec is not None and spec.frontmatter_path and os.path.isabs(spec.frontmatter_path):
            return os.path.dirname(spec.frontmatter_path)
        return os.getcwd()

    # ---- persistence -------------------------------------------------------------------------

    def _snapshot(self) -> bytes:
        return orjson.dumps(
            {
                "v": STATE_VERSION,
                "protocol": self.protocol,
                "session_id": self._session_id,
                "turns": self._turns,
                "in_flight": self._in_flight,
                "terminal": self._terminal,
                "last_stop": self._last_stop,
                "last_detail": self._last_detail,
                "model": self._model,
                "cost_total": self._cost_total,
                "usage_total": None
                if self._usage_total is None
                else self._usage_total.model_dump(mode="json"),
            }
        )

    async def _save(self) -> None:
        """Persist the resume state if it changed. Never raises."""
        store = self.cursor_store
        if store is None or not self._loaded:
            return
        data = self._snapshot()
        if data == self._saved:
            return
        try:
            await store.save_cursor(self.target.agent_id, data)
        except Exception as e:
            log.warning("agent %s: cannot save the ACP session state: %s", self.target.agent_id, e)
            return
        self._saved = data

    async def _load_once(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        store = self.cursor_store
        assert store is not None
        agent = self.target.agent_id
        try:
            data = await store.load_cursor(agent)
        except Exception as e:
            log.warning("agent %s: cannot load the ACP session state: %s", agent, e)
            return
        if not data:
            return
        try:
            state = orjson.loads(data)
            if not isinstance(state, dict) or state.get("v") != STATE_VERSION:
                raise ValueError("unsupported state version")
            if state.get("protocol") != self.protocol:
                raise ValueError(f"state of a {state.get('protocol')!r} driver")
        except (ValueError, orjson.JSONDecodeError) as e:
            log.warning("agent %s: ignoring unreadable ACP session state: %s", agent, e)
            return
        self._saved = data
        sid = state.get("session_id")
        self._session_id = sid if isinstance(sid, str) and sid else None
        turns = state.get("turns")
        self._turns = turns if isinstance(turns, int) and turns >= 0 else 0
        self._terminal = state.get("terminal") is True
        last = state.get("last_stop")
        self._last_stop = last if isinstance(last, str) else None
        detail = state.get("last_detail")
        self._last_detail = detail if isinstance(detail, str) else None
        model = state.get("model")
        if isinstance(model, str) and model:
            self._model = model
        cost = state.get("cost_total")
        self._cost_total = (
            float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None
        )
        usage = state.get("usage_total")
        try:
            self._usage_total = Usage.model_validate(usage) if isinstance(usage, dict) else None
        except ValidationError:
            self._usage_total = None
        in_flight = state.get("in_flight")
        log.info(
            "agent %s: ACP session state loaded (session %s, %d turns%s)",
            agent,
            self._session_id,
            self._turns,
            ", finished" if self._terminal else "",
        )
        if isinstance(in_flight, int) and not self._terminal:
            self._lose_turn(in_flight, "prosperod stopped while the turn was in flight")
            await self._drain_out()
            await self._save()


def _receive_task(conn: acp.ClientSideConnection) -> asyncio.Task[Any] | None:
    inner = getattr(conn, "_conn", None)
    task = getattr(inner, "_recv_task", None)
    return task if isinstance(task, asyncio.Task) else None


def acp_driver_factory(
    *,
    broker: PermissionBroker | None = None,
    observers: Sequence[StreamObserver] = (),
    ownership: Ownership | None = None,
    **kwargs: Any,
) -> Callable[..., AcpDriver]:
    """A FleetManager driver factory with a permission broker (the next issue's pending
    decisions), raw observers or an ownership hook plugged in."""

    def factory(
        target: DriverTarget,
        sink: EventSink,
        options: DriverOptions,
        metrics: Metrics,
        cursor_store: CursorStore | None = None,
    ) -> AcpDriver:
        return AcpDriver(
            target,
            sink,
            options,
            metrics,
            cursor_store,
            broker=broker,
            observers=observers,
            ownership=ownership,
            **kwargs,
        )

    return factory
