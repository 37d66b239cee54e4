"""AcpDriver: one agent driven over the Agent Client Protocol (ADR 0011, docs/adr/0005).

Prospero is the ACP *client*; the agent serves `session/*`. The outer reconnect loop is the
shared `ReconnectingDriver` (base.py). Per connection the driver dials the agent's endpoint,
speaks ACP's JSON-RPC with the `agent-client-protocol` SDK and runs `initialize` →
`session/new` (or `session/load` to rejoin; `authenticate` when the agent requires it) → one
`session/prompt` per turn. The mapping onto events is `mapping.AcpMapper` (pure; fed from the
SDK's raw observer in wire order), the ordered output and the committed resume state are
`output`, the permission bridge `permissions`, the resume state `resume`.

A turn is driven at most once (issue 9): the begin of a turn (its prompt sent) is committed
before the prompt goes out; on restart the session is rejoined with `session/load`, a turn in
flight at the crash is recorded `turn_lost` once (its open tool calls closed) — or, without
`loadSession`, the agent finishes `NotResumable`. The spawn prompt is sent only when the
stored state says it never was, and only to an agent this control plane spawned
(`target.meta.spawned_here`; a `meta` of None — standalone use — counts as spawned here). An
agent that is neither spawned here nor adopted is never driven.

Single driver (ADR 0011 decision 8): at most one AcpDriver per agent id per process.

SDK coupling: the driver reads one private attribute of the pinned SDK
(`ClientSideConnection._conn._recv_task`) to notice a connection that ends while no request is
in flight; without it, it polls `reader.at_eof()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import acp
from acp import schema as s
from acp.connection import StreamDirection, StreamEvent

from prospero.core import metrics as m
from prospero.core.aio import wait_for
from prospero.core.drivers.acp.mapping import AcpMapper
from prospero.core.drivers.acp.output import OutputPump, OutputQueue, Slot, load_state
from prospero.core.drivers.acp.permissions import (
    AcpClient,
    PermissionBridge,
    PermissionContext,
)
from prospero.core.drivers.acp.registry import DriverConflict, register, release
from prospero.core.drivers.acp.resume import AcpResumeState
from prospero.core.drivers.acp.session import END, AcpSession, Credentials, End, SessionOver
from prospero.core.drivers.base import (
    CursorStore,
    DriverExit,
    DriverOptions,
    DriverTarget,
    EventSink,
    ReconnectingDriver,
)
from prospero.core.errors import InvalidState, ProsperoError
from prospero.core.metrics import Metrics
from prospero.core.ownership import Ownership
from prospero.core.permissions import PermissionBroker, PolicyBroker, StoredDecisions
from prospero.core.transport import close_writer

log = logging.getLogger(__name__)

ACP_UNSERVED_REQUESTS = "acp_unserved_requests"
STOPPED_MID_TURN = "prosperod stopped while the turn was in flight"
# The reason given to the broker for decisions asked through a connection that is gone.
OWNER_STOPPED = "the replica driving the agent stopped while the decision was pending"
OWNER_STOPPED_MID_TURN = "the replica driving the agent stopped mid-turn; turn {turn} was lost"

StreamObserver = Callable[[StreamEvent], Awaitable[None] | None]


class AcpDriver(ReconnectingDriver, AcpSession):
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
        credentials: Credentials | None = None,
        auth_method: str | None = None,
        handshake_timeout: float = 30.0,
        tool_input_hold: float = 1.0,
        close_timeout: float = 5.0,
    ) -> None:
        super().__init__(target, sink, options, metrics, cursor_store)
        self.broker: PermissionBroker = broker if broker is not None else PolicyBroker()
        self.extra_observers = list(observers)
        self.ownership = ownership
        self.credentials = credentials
        self.auth_method = auth_method
        self.handshake_timeout = handshake_timeout
        self.tool_input_hold = tool_input_hold
        self.close_timeout = close_timeout
        register(self)  # raises DriverConflict: one driver per agent per process
        self._conclude_request: tuple[str, str] | None = None
        self._stopping_as: tuple[str, str] | None = None  # settle_turn's `ending`
        self._pending_loss: str | None = None  # a turn lost with its connection, cause unknown
        self._auth_refused_prompt: str | None = None
        self._auth_prompt_tried = False
        self._refused_logged = False
        # session (live view; the committed view is `self.pump.state`)
        self._session_id: str | None = None
        self._turns = 0
        self._initial_sent = False
        self._prompt_queued = False
        self._caps: s.AgentCapabilities | None = None
        self._auth_methods: list[Any] = []
        self._conn: acp.ClientSideConnection | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._turn_cancel = asyncio.Event()
        self._inputs: deque[str | End] = deque()
        self._input_event = asyncio.Event()
        self._ending = False
        # output, mapping, permissions
        self.queue = OutputQueue()
        self.pump = OutputPump(target.agent_id, self.queue, sink, AcpResumeState(), cursor_store)
        self.pump.persist = cursor_store is None
        self._timers: dict[int, asyncio.TimerHandle] = {}
        meta = target.meta
        self.mapper = AcpMapper(
            self.queue,
            agent_id=target.agent_id,
            include_thinking=options.include_thinking,
            model=target.model,
            metrics=metrics,
            on_hold=self._schedule_hold,
            # The agent's dollar cap, checked at each cumulative usage_update mid-turn.
            on_turn_cost=getattr(sink, "in_turn_spend", None),
        )
        self.bridge = PermissionBridge(target.agent_id, self.broker, metrics)
        self._spawned_here = meta is None or meta.spawned_here
        self.unrecognized = self.mapper.unrecognized
        self.resumed = 0

    # ---- AgentDriver -------------------------------------------------------------------------

    @property
    def session_id(self) -> str | None:
        return self._session_id

    @property
    def turns(self) -> int:
        """Prompts sent on the session so far (the next turn's 0-based index)."""
        return self._turns

    @property
    def turn_in_flight(self) -> int | None:
        return self.mapper.turn

    @property
    def outcome(self) -> str | None:
        """The recorded `agent_finished.outcome` once finished (an ACP session that ended
        reads as finished although caliband may still list its worker)."""
        return self.pump.state.outcome if self._terminal else None

    @property
    def replayed_updates(self) -> int:
        return self.mapper.replayed_updates

    @property
    def drivable(self) -> bool:
        """Spawned here or adopted (contract 3); no metadata = standalone use = spawned here."""
        meta = self.target.meta
        return meta is None or meta.spawned_here or meta.adopted

    async def run(self) -> DriverExit:
        if self._running:
            raise DriverConflict(self.target.agent_id, "is already being driven by this driver")
        if self._closing:
            return DriverExit.closed
        if self._terminal:
            return DriverExit.finished
        if not self.drivable:
            if not self._refused_logged:
                self._refused_logged = True
                log.info(
                    "agent %s: not spawned or adopted by this control plane; not driven",
                    self.target.agent_id,
                )
            return DriverExit.closed
        self._running = True
        self._run_task = asyncio.current_task()
        self._idle.clear()
        self.pump.start()
        try:
            if self.ownership is not None:
                lease = await self.ownership.try_acquire(self.target.agent_id)
                if lease is None:
                    log.info(
                        "agent %s: another replica owns it; not opening an ACP session",
                        self.target.agent_id,
                    )
                    return DriverExit.closed
            result = await self._reconnect_loop()
            self._settle_loss()
            await self._drain()
            await self.pump.save_now()
            return result
        except BaseException:
            with contextlib.suppress(Exception):
                await self.pump.save_now()
            raise
        finally:
            await self.pump.stop()
            self._cancel_timers()
            self._running = False
            self._run_task = None
            self._idle.set()
            if self._terminal or self._closing:
                release(self)

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
        self._inputs.append(END)
        self._input_event.set()

    async def cancel_turn(self) -> None:
        """`session/cancel` for the turn in flight (it then ends `cancelled`); pending
        permission requests are answered `cancelled`. A no-op when no turn is in flight."""
        conn, sid, turn = self._conn, self._session_id, self.mapper.turn
        if conn is None or sid is None or turn is None:
            log.info("agent %s: cancel requested with no turn in flight", self.target.agent_id)
            return
        self.mapper.cancel_sent = True
        self._turn_cancel.set()
        if self._prompt_queued:  # else the turn sends it right after its prompt
            await self._send_cancel(conn, sid, self.close_timeout)

    async def settle_turn(self, timeout: float, ending: tuple[str, str] | None = None) -> bool:
        """Cancel the turn in flight and wait (up to `timeout` s) for the agent to end it
        (`stopReason: cancelled`, with its usage), so that a stop records the turn as finished,
        its cost counted, rather than lost. `ending`: the outcome and detail the run ends
        with if it ends meanwhile (a one-turn run ends with its turn). True when no turn is
        in flight any more."""
        if ending is not None:
            self._stopping_as = ending
        if self.mapper.turn is None:
            return True
        await self.cancel_turn()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.mapper.turn is not None and self._running and loop.time() < deadline:
            await asyncio.sleep(0.02)
        return self.mapper.turn is None

    async def _send_cancel(self, conn: acp.ClientSideConnection, sid: str, limit: float) -> None:
        try:
            await wait_for(conn.cancel(session_id=sid), limit)
        except (ConnectionError, OSError, TimeoutError) as e:
            log.info("agent %s: could not send session/cancel: %s", self.target.agent_id, e)
        else:
            log.info(
                "agent %s: session/cancel sent for turn %s", self.target.agent_id, self.mapper.turn
            )

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
        if conn is not None and sid is not None and self.mapper.turn is not None:
            self.mapper.cancel_sent = True
            self._turn_cancel.set()
            if self.bridge.waiting:
                # Pending permission requests now answer `cancelled`: let those answers reach
                # the SDK's (FIFO) sender before session/cancel, so they are written before
                # the connection is cut (writing after the abort fails noisily in the SDK).
                with contextlib.suppress(TimeoutError):
                    await wait_for(self.bridge.idle.wait(), 1.0)
                for _ in range(3):
                    await asyncio.sleep(0)
            if self._prompt_queued:
                await self._send_cancel(conn, sid, 1.0)
        self.bridge.end()
        await self._stop_running()
        if not self._running:
            self._cancel_timers()
            with contextlib.suppress(Exception):
                await self._drain()
            await self.pump.save_now()
            release(self)

    async def _stop_running(self) -> None:
        if self._writer is not None:
            self._writer.transport.abort()
        if self._running and asyncio.current_task() is not self._run_task:
            with contextlib.suppress(TimeoutError):
                await wait_for(self._idle.wait(), 2 * self.close_timeout)

    async def _conclude(self, outcome: str, detail: str) -> None:
        """End the history without the agent: open tool calls closed, the turn in flight
        lost, pending decisions cancelled, `agent_finished{outcome, detail}` (contract 4)."""
        if self._running and asyncio.current_task() is not self._run_task:
            self._conclude_request = (outcome, detail)
            self.bridge.end()  # pending permission requests answer `cancelled`
            conn, sid = self._conn, self._session_id
            if conn is not None and sid is not None and self.mapper.turn is not None:
                if self.bridge.waiting:
                    with contextlib.suppress(TimeoutError):
                        await wait_for(self.bridge.idle.wait(), 1.0)
                if self._prompt_queued:
                    await self._send_cancel(conn, sid, 1.0)
            self._retry_now.set()
            await self._stop_running()
            if self._terminal or self._running:
                return
        await self._load_once()
        if self._terminal:
            return
        self._pending_loss = None
        turn = self.mapper.turn
        stored = self.pump.state.open_tools
        text = f"lost mid-turn: {detail}" if detail else f"lost mid-turn ({outcome})"
        if turn is not None:
            self.mapper.lose_turn(turn, text, stored)
            stored = []
        await self._finish(outcome, detail, tool_text=f"abandoned: {text}", stored_open=stored)
        await self._drain()
        await self.pump.save_now()
        if not self._running:
            release(self)

    # ---- ReconnectingDriver hooks ------------------------------------------------------------

    def _dial_failed(self, exc: BaseException) -> None:
        if isinstance(exc, ProsperoError | OSError | ValueError):
            log.info("agent %s: cannot reach the ACP endpoint: %s", self.target.agent_id, exc)
        else:
            log.warning("agent %s: cannot reach the ACP endpoint: %r", self.target.agent_id, exc)

    async def _load_state(self) -> None:
        await self._load_once()

    async def _connection(self) -> bool:
        progress = False
        if self._conclude_request is None:
            progress = await self._one_connection()
        req = self._conclude_request
        if req is not None and not self._terminal:
            self._conclude_request = None
            await self._conclude(*req)
        return progress

    # ---- one connection ----------------------------------------------------------------------

    async def _one_connection(self) -> bool:
        pair = await self._dial()
        if pair is None:
            return False
        reader, writer = pair
        if self._closing:
            writer.transport.abort()
            return False
        self._reader, self._writer = reader, writer
        self.connections += 1
        observers: list[StreamObserver] = [self._observe, *self.extra_observers]
        # Duck-typed on purpose (pitfall 5): subclassing acp.Client would answer `null`
        # instead of method-not-found for anything not implemented here.
        client = cast(acp.Client, AcpClient(self._answer_permission))
        conn = acp.connect_to_agent(client, writer, reader, observers=observers)
        self._conn = conn
        try:
            if not await self._open_session(conn):
                return False
            self._settle_loss()
            await self._drive(conn)
            return True
        except SessionOver:
            return True
        finally:
            self._conn = None
            self.mapper.loading = False
            if self._closing or self._conclude_request is not None:
                writer.transport.abort()
            with contextlib.suppress(Exception):
                await wait_for(conn.close(), self.close_timeout)
            await close_writer(writer)
            self._reader = self._writer = None

    # ---- the end -----------------------------------------------------------------------------

    async def _finish(
        self,
        outcome: str,
        detail: str | None,
        *,
        tool_text: str = "abandoned: the session ended",
        stored_open: Sequence[Any] = (),
        gap: str | None = None,
    ) -> None:
        """agent_finished, after the agent's pending decisions ended with its session (with
        the outcome of a stop under way, when the run ends while it settles its turn)."""
        if self._stopping_as is not None and gap is None:
            outcome, detail = self._stopping_as
        self._settle_loss()
        self.bridge.end()
        await self._drain()
        await self._cancel_decisions(f"the session ended ({outcome})")
        if gap is not None:
            self.mapper.finish_not_resumable(gap, self._turns)
        else:
            self.mapper.finish(
                outcome, detail, self._turns, tool_text=tool_text, stored_open=stored_open
            )
        self._terminal = True
        await self._drain()
        log.info(
            "agent %s: ACP session finished (%s, %d turns)",
            self.target.agent_id,
            outcome,
            self._turns,
        )

    async def _finish_not_resumable(self, detail: str) -> None:
        await self._finish("NotResumable", detail, gap=detail)

    def _settle_loss(self) -> None:
        """Record the turn lost with its connection, now that the run goes on (or ends)
        without it."""
        reason, self._pending_loss = self._pending_loss, None
        turn = self.mapper.turn
        if reason is not None and turn is not None:
            self.mapper.lose_turn(turn, reason)

    async def _cancel_decisions(self, reason: str) -> None:
        cancel = getattr(self.broker, "cancel_agent", None)
        if cancel is None:
            return
        try:
            await cancel(self.target.agent_id, reason)
        except Exception as e:
            log.warning(
                "agent %s: cannot cancel its pending decisions: %s", self.target.agent_id, e
            )

    # ---- mapping glue (synchronous: called in wire order) ------------------------------------

    def _observe(self, event: StreamEvent) -> None:
        if event.direction is not StreamDirection.INCOMING:
            return
        msg = event.message
        try:
            method = msg.get("method")
            if method == "session/update":
                self.mapper.update(msg.get("params"))
            elif isinstance(method, str):
                if "id" in msg:
                    if method == "session/request_permission":
                        self.mapper.permission_request(msg.get("params"))
                    else:
                        self.metrics.inc(ACP_UNSERVED_REQUESTS)
                        log.info(
                            "agent %s: answered %s with method-not-found",
                            self.target.agent_id,
                            method,
                        )
            elif "id" in msg:
                self.mapper.response(msg.get("result"))
        except Exception:  # a mapping bug must not kill the session
            self.metrics.inc(m.MALFORMED_LINES)
            log.exception("agent %s: failed to map an ACP message; skipped", self.target.agent_id)

    def _schedule_hold(self, tool_id: str, slot: Slot) -> None:
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            key = id(slot)

            def expire() -> None:
                self._timers.pop(key, None)
                self.mapper.expire_hold(tool_id, slot)

            self._timers[key] = loop.call_later(self.tool_input_hold, expire)

    def _cancel_timers(self) -> None:
        for h in self._timers.values():
            h.cancel()
        self._timers.clear()

    async def _drain(self) -> None:
        self.mapper.resolve_all()
        self._cancel_timers()
        await self.pump.drain()

    async def _answer_permission(
        self, session_id: str, tool_call: s.ToolCallUpdate, options: list[s.PermissionOption]
    ) -> s.RequestPermissionResponse:
        st = self.mapper.tool(tool_call.tool_call_id)
        meta = self.target.meta
        turn = self.mapper.turn
        ctx = PermissionContext(
            title=(st.title if st is not None else tool_call.title) or "",
            kind=st.kind if st is not None else tool_call.kind,
            input=st.raw_input if st is not None else tool_call.raw_input,
            posture=meta.posture if meta is not None else None,
            turn=turn if turn is not None else max(0, self._turns - 1),
            workspace=self.target.workspace,
            cancelled=self._turn_cancel,
            flush=self.pump.flush_out,
        )
        return await self.bridge.answer(session_id, tool_call, options, ctx)

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
        definition = self.target.frontmatter_path
        if definition and os.path.isabs(definition):
            return os.path.dirname(definition)
        return os.getcwd()

    # ---- persistence -------------------------------------------------------------------------

    async def _load_once(self) -> None:
        if self.pump.persist:
            return
        self.pump.persist = True
        assert self.cursor_store is not None
        state = await load_state(self.cursor_store, self.target.agent_id, self.pump)
        if state is None:
            return
        self._session_id = state.session_id
        self._turns = state.turns
        self._initial_sent = state.initial_prompt_sent
        self._terminal = state.terminal
        self.mapper.restore(state)
        lost = state.in_flight if not state.terminal else None
        await self._cancel_stored_decisions(
            OWNER_STOPPED if lost is None else OWNER_STOPPED_MID_TURN.format(turn=lost)
        )
        if state.in_flight is not None and not state.terminal:
            # Recorded once: the turn_lost is committed with the state that clears it.
            self.mapper.lose_turn(state.in_flight, STOPPED_MID_TURN, state.open_tools)
            await self._drain()
            await self.pump.save_now()

    async def _cancel_stored_decisions(self, reason: str) -> None:
        """Starting from stored state: decisions asked through the connection that is gone
        (the previous prosperod's or, clustered, the previous owner's) are the broker's to
        settle (`StoredDecisions`; DecisionService cancels them when clustered and keeps its
        rejoin grace when standalone). Before the lost turn is recorded, so its decisions end
        inside it, as they do when a live connection drops."""
        broker = self.broker
        if not isinstance(broker, StoredDecisions):
            return
        try:
            await broker.cancel_stored(self.target.agent_id, reason)
        except Exception as e:
            log.warning(
                "agent %s: cannot settle the decisions left pending: %s", self.target.agent_id, e
            )


def acp_driver_factory(
    *,
    broker: PermissionBroker | None = None,
    observers: Sequence[StreamObserver] = (),
    ownership: Ownership | None = None,
    **kwargs: Any,
) -> Callable[..., AcpDriver]:
    """A FleetManager driver factory with a permission broker, raw observers, an ownership
    hook or a credentials lookup (`credentials=`, `auth_method=`) plugged in."""

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
