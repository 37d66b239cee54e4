"""The AgentDriver seam: how Prospero reaches one agent's data path.

Both implementations (NdjsonDriver today, AcpDriver next) emit the same EventKinds into an
EventSink and accept the same steering calls; they differ only inside their own modules.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from prospero.core import metrics as m
from prospero.core.metrics import Metrics
from prospero.core.ratecard import RateCard
from prospero.core.transport import NetworkSecurity
from prospero.core.wire.control import Endpoint, SpawnSpec
from prospero.types.events import EventKind

EventSink = Callable[[EventKind], Awaitable[None]]
"""Receives normalised events in wire order; the FleetManager sequences and stores them."""

EndpointResolver = Callable[[], Awaitable[Endpoint]]
"""Looks up the agent's current per-agent endpoint (caliband `attach`)."""


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


@dataclass
class DriverTarget:
    agent_id: str
    workspace: str
    resolve_endpoint: EndpointResolver
    security: NetworkSecurity | None = None
    interactive: bool = False
    spec: SpawnSpec | None = None
    working_dir: str = ""
    # The agent's store dir; when it is readable here (a local caliband), its `stdout.ndjson`
    # transcript lets a driver recover lines the socket can no longer serve.
    session_dir: str = ""


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

    @property
    def finished(self) -> bool: ...
