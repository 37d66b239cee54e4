"""The AgentDriver seam: how Prospero reaches one agent's data path.

Both implementations (NdjsonDriver today, AcpDriver next) emit the same EventKinds into an
EventSink and accept the same steering calls; they differ only inside their own modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from prospero.core import metrics as m
from prospero.core.errors import ProsperoError
from prospero.core.metrics import Metrics
from prospero.core.ratecard import RateCard
from prospero.core.transport import Address, NetworkSecurity, open_endpoint
from prospero.types.events import EventKind
from prospero.types.model import AgentMeta, AgentStatus

log = logging.getLogger(__name__)

EventSink = Callable[[EventKind], Awaitable[None]]
"""Receives normalised events in wire order; the FleetManager sequences and stores them."""

EndpointResolver = Callable[[], Awaitable[Address]]
"""Looks up the agent's current address (the FleetProvider's `attach`)."""


class CursorStore(Protocol):
    """Where drivers keep opaque resume state (the EventStore has these methods)."""

    async def save_cursor(self, key: str, data: bytes) -> None: ...

    async def load_cursor(self, key: str) -> bytes | None: ...


def backoff_delay(agent_id: str, attempt: int, base: float, cap: float) -> float:
    """`min(cap, base * 2^attempt) * jitter`, jitter in [0.5, 1.0) from a stable hash."""
    h = hashlib.blake2b(f"{agent_id}\x00{attempt}".encode(), digest_size=8).digest()
    jitter = 0.5 + 0.5 * (int.from_bytes(h, "big") / 2**64)
    return min(cap, base * 2.0 ** min(max(attempt, 0), 62)) * jitter


async def wait_before_retry(
    agent_id: str,
    failures: int,
    options: DriverOptions,
    metrics: Metrics,
    closed: asyncio.Event,
    wake: asyncio.Event | None = None,
) -> None:
    """The reconnect pause shared by every driver: jittered exponential backoff, cut short
    when the driver is closed or `wake` is set (`nudge()`: the agent changed state, so the
    endpoint or transcript is worth another look now). `wake` is cleared on the way out."""
    delay = backoff_delay(agent_id, failures - 1, options.backoff_base, options.backoff_cap)
    metrics.inc(m.ATTACH_RECONNECTS)
    waits = [asyncio.ensure_future(closed.wait())]
    if wake is not None:
        waits.append(asyncio.ensure_future(wake.wait()))
    try:
        await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        if wake is not None:
            wake.clear()


class DriverExit(enum.Enum):
    finished = "finished"  # the agent's run ended (terminal event emitted)
    closed = "closed"  # close() was called
    gave_up = "gave_up"  # reconnect budget spent; the manager may re-run the driver later


@dataclass
class DriverOptions:
    include_thinking: bool = True
    rate_card: RateCard = field(default_factory=RateCard)
    backoff_base: float = 0.2
    backoff_cap: float = 10.0
    max_failures: int = 8


def _unknown_status() -> AgentStatus | None:
    return None


@dataclass
class DriverTarget:
    agent_id: str
    workspace: str
    resolve_endpoint: EndpointResolver
    security: NetworkSecurity | None = None
    # What the agent was spawned with, as far as a driver reads it: whether it waits for input
    # (else it runs its task and ends), its initial prompt (ACP: sent as the first turn when
    # Prospero's metadata has none), its model (ACP: named in agent_init) and its agent
    # definition file (ACP: its directory is the session's cwd when working_dir is unknown).
    interactive: bool = False
    prompt: str | None = None
    model: str | None = None
    frontmatter_path: str | None = None
    working_dir: str = ""
    # The agent's store dir; when it is readable here (a local caliband), its `stdout.ndjson`
    # transcript lets a driver recover lines the socket can no longer serve. The manager may
    # fill it in after construction (a spawn's provisional record has none): read it at use.
    session_dir: str = ""
    # Prospero's own metadata of the agent (posture, requested protocol, spawned here).
    meta: AgentMeta | None = None
    # caliband's last-known status of the agent (the manager's registry); None when unknown.
    status: Callable[[], AgentStatus | None] = _unknown_status


@runtime_checkable
class AgentDriver(Protocol):
    protocol: str

    async def run(self) -> DriverExit:
        """Stream the agent's events into the sink until it finishes, close() is called, or
        the reconnect budget is spent. May be called again after `gave_up`: state (cursor,
        open tool calls) carries over, so nothing is emitted twice."""
        ...

    async def send_input(self, text: str) -> None: ...

    async def end_input(self) -> None: ...

    async def cancel_turn(self) -> None:
        """Raises Unsupported where the protocol cannot cancel a turn (NDJSON)."""
        ...

    async def close(self) -> None: ...

    def nudge(self) -> None:
        """The agent's status changed: a reconnect waiting out its backoff tries now (the
        worker may be listening now, or gone with its transcript complete)."""
        ...

    async def conclude(self, outcome: str, detail: str) -> None:
        """End the agent's history by itself: close its open tool calls
        (`tool_finished{ok: false}`) and emit `agent_finished{outcome, detail}`. Idempotent (a
        no-op once finished). The manager calls it when it closes the driver of a terminal
        agent whose run never ended on the wire."""
        ...

    @property
    def finished(self) -> bool: ...

    @property
    def turn_in_flight(self) -> int | None:
        """The turn a prompt is out for and whose end has not been recorded, if any (ACP); a
        driver without turns of its own (NDJSON: the worker runs them) says None. The manager
        records it lost (`turn_lost`) when the driver dies with it in flight."""
        ...


def concluding_outcome(status: AgentStatus | None) -> str:
    """The `agent_finished.outcome` of a run that ended without its terminal frame."""
    return "killed" if status is AgentStatus.killed else "crashed"


class ReconnectingDriver:
    """The outer reconnect loop every data-path driver shares (NdjsonDriver, AcpDriver).

    Subclasses provide `_load_state()` (once per driver life), `_connection()` (one dial and
    read; True when it made progress, which resets the failure count), `_conclude()` (emit the
    closing events of a run that never ended) and may override `_recover_after_exit()` (read
    what the socket can no longer serve, e.g. the transcript) and `_after_terminal()`.

    One order of checks everywhere: terminal first (a finished run reads `finished` whatever
    else happened), then closing. A connection that ends without the terminal event while the
    agent's status is terminal (the worker is gone) is followed by `_recover_after_exit()` and,
    if the run still has not ended, by `conclude()` with `crashed` (or `killed`): the driver
    returns `finished` promptly instead of waiting out its reconnect budget.
    """

    protocol: str = ""

    def __init__(
        self,
        target: DriverTarget,
        sink: EventSink,
        options: DriverOptions,
        metrics: Metrics,
        cursor_store: CursorStore | None = None,
    ) -> None:
        self.target = target
        self.sink = sink
        self.options = options
        self.metrics = metrics
        self.cursor_store = cursor_store
        # run() bookkeeping: whether a run is in flight, its task, and set while none is
        self._running = False
        self._run_task: asyncio.Task[Any] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._terminal = False
        self._closing = False
        self._close_event = asyncio.Event()
        self._retry_now = asyncio.Event()  # nudge(): end a reconnect backoff
        self._last_error: str | None = None
        self._state_loaded = False
        self.connections = 0

    # ---- hooks ----------------------------------------------------------------------------

    async def _load_state(self) -> None:
        """Load persisted resume state (called once, by the first run)."""

    async def _connection(self) -> bool:
        raise NotImplementedError

    async def _recover_after_exit(self) -> None:
        """The worker is gone: recover what it left (called before concluding)."""

    async def _after_terminal(self) -> None:
        """The connection that carried the terminal event ended."""

    async def _conclude(self, outcome: str, detail: str) -> None:
        raise NotImplementedError

    def _dial_failed(self, exc: BaseException) -> None:
        if isinstance(exc, ProsperoError | OSError | ValueError):
            log.info("agent %s: cannot attach: %s", self.target.agent_id, exc)
        else:
            log.warning("agent %s: cannot attach: %r", self.target.agent_id, exc)

    # ---- shared behaviour -----------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """The terminal `agent_finished` has been emitted."""
        return self._terminal

    @property
    def turn_in_flight(self) -> int | None:
        """None: a driver whose protocol has turns of its own (ACP) says which is in flight."""
        return None

    def nudge(self) -> None:
        """The agent's status changed: end a reconnect backoff now."""
        self._retry_now.set()

    def agent_status(self) -> AgentStatus | None:
        """caliband's last-known status of the agent (None when unknown)."""
        try:
            return self.target.status()
        except Exception:  # a registry lookup must never break the stream
            return None

    async def conclude(self, outcome: str, detail: str) -> None:
        if self._terminal:
            return
        await self._conclude(outcome, detail)

    async def _reconnect_loop(self) -> DriverExit:
        if not self._state_loaded:
            self._state_loaded = True
            await self._load_state()
        failures = 0
        while True:
            if self._terminal:
                return DriverExit.finished
            if self._closing:
                return DriverExit.closed
            progress = await self._connection()
            if self._terminal:
                await self._after_terminal()
                return DriverExit.finished
            if self._closing:
                return DriverExit.closed
            if progress:
                failures = 0
            status = self.agent_status()
            if status is not None and status.terminal:
                await self._recover_after_exit()
                if not self._terminal and not self._closing:
                    log.info(
                        "agent %s: the worker is gone (%s) and its run never ended on the "
                        "wire; concluding it",
                        self.target.agent_id,
                        status.value,
                    )
                    await self.conclude(
                        concluding_outcome(status),
                        f"the worker exited ({status.value}) without ending its run"
                        + (f"; last error: {self._last_error}" if self._last_error else ""),
                    )
                continue
            failures += 1
            if failures >= self.options.max_failures:
                log.warning(
                    "agent %s: giving up after %d consecutive failed connections%s",
                    self.target.agent_id,
                    failures,
                    f" (last error: {self._last_error})" if self._last_error else "",
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

    async def _dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Resolve and dial, abandoned as soon as close() is called. None on failure."""

        async def attempt() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            endpoint = await self.target.resolve_endpoint()
            return await open_endpoint(endpoint, self.target.security)

        task = asyncio.create_task(attempt())
        closer = asyncio.create_task(self._close_event.wait())
        try:
            await asyncio.wait({task, closer}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # run() itself was cancelled: leave nothing behind
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait({task})
            if task.done() and not task.cancelled() and task.exception() is None:
                task.result()[1].transport.abort()
            raise
        finally:
            closer.cancel()
        if not task.done():  # close() won the race
            task.cancel()
            await asyncio.wait({task})
        if task.cancelled():
            return None
        exc = task.exception()
        if exc is not None:
            self._last_error = str(exc) or type(exc).__name__
            self._dial_failed(exc)
            return None
        return task.result()
