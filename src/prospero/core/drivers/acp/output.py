"""Ordered output of the ACP driver: one queue in wire order, one pump into the sink.

The mapping (`mapping.AcpMapper`) runs synchronously in the SDK's raw observer and puts what it
produces here, in wire order:

- an event (`push`);
- a *held* slot (`hold`): a `tool_started` whose input is not known yet; the events behind it
  wait until the mapper fills it (`fill`);
- a state mark (`mark`): a change of the resume state that belongs between two events (a
  turn's prompt sent, the cumulative cost at a turn's end).

`OutputQueue` is plain data (no event loop needed: the mapping's unit tests read it with
`take_ready`). `OutputPump` is the one task that drains it into the sink: events ready together
go out as one batch, and every event and mark is folded into the resume state
(`AcpResumeState.apply`), which is committed *with* its batch
(`sink.emit_batch(kinds, cursor=state)` when the sink takes a cursor, issue 9 contract 1),
else saved through the `CursorStore` right after the events were handed over.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from prospero.core.aio import wait_for
from prospero.core.drivers.acp.resume import AcpResumeState
from prospero.core.drivers.base import CursorStore, EventSink
from prospero.types.events import EventKind, FramesSkipped

log = logging.getLogger(__name__)

StateMark = Callable[[AcpResumeState], None]


class Slot:
    """One position in the queue: an event, a held event (`event is None`) or a state mark."""

    __slots__ = ("event", "mark")

    def __init__(self, event: EventKind | None, mark: StateMark | None = None) -> None:
        self.event = event
        self.mark = mark

    @property
    def ready(self) -> bool:
        return self.event is not None or self.mark is not None


class OutputQueue:
    """The ordered queue (see the module docstring). Synchronous; `on_ready` is called when
    something new may be taken (the pump's wake-up)."""

    def __init__(self) -> None:
        self._q: deque[Slot] = deque()
        self.pushed = 0  # slots queued so far
        self.on_ready: Callable[[], None] | None = None

    def __len__(self) -> int:
        return len(self._q)

    def _wake(self) -> None:
        if self.on_ready is not None:
            self.on_ready()

    def push(self, ev: EventKind) -> None:
        self._q.append(Slot(ev))
        self.pushed += 1
        self._wake()

    def hold(self) -> Slot:
        slot = Slot(None)
        self._q.append(slot)
        self.pushed += 1
        return slot

    def fill(self, slot: Slot, ev: EventKind) -> None:
        slot.event = ev
        self._wake()

    def skip(self, reason: str) -> None:
        """A skipped source message: coalesced into the `frames_skipped` at the queue's tail
        (one event per reason per batch handed to the sink)."""
        tail = self._q[-1].event if self._q else None
        if isinstance(tail, FramesSkipped) and tail.reason == reason:
            self._q[-1].event = FramesSkipped(count=tail.count + 1, reason=reason)
            return
        self.push(FramesSkipped(count=1, reason=reason))

    def mark(self, fn: StateMark) -> None:
        self._q.append(Slot(None, fn))
        self.pushed += 1
        self._wake()

    @property
    def head_ready(self) -> bool:
        return bool(self._q) and self._q[0].ready

    def take_ready(self) -> list[Slot]:
        """Pop the ready prefix (up to the first held slot)."""
        out: list[Slot] = []
        while self._q and self._q[0].ready:
            out.append(self._q.popleft())
        return out

    def events_ready(self) -> list[EventKind]:
        """Pop the ready prefix's events (marks dropped): for tests of the pure mapping."""
        return [s.event for s in self.take_ready() if s.event is not None]


def takes_cursor(batch_sink: Any) -> bool:
    """Whether a sink's `emit_batch` accepts `cursor=` (contract 1)."""
    if batch_sink is None:
        return False
    try:
        params = inspect.signature(batch_sink).parameters
    except (TypeError, ValueError):
        return False
    return "cursor" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class OutputPump:
    """Drains an OutputQueue into the sink in order, committing the resume state with it."""

    def __init__(
        self,
        agent_id: str,
        queue: OutputQueue,
        sink: EventSink,
        state: AcpResumeState,
        cursor_store: CursorStore | None,
    ) -> None:
        self.agent_id = agent_id
        self.queue = queue
        self.sink = sink
        # The state as stored (or about to be): folded from what was handed to the sink.
        self.state = state
        self.cursor_store = cursor_store
        self.persist = True  # False until the stored state was read (never overwrite it)
        self._batch_sink = getattr(sink, "emit_batch", None)
        self._with_cursor = takes_cursor(self._batch_sink)
        self._saved: bytes | None = None
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._progress = asyncio.Event()
        self._delivering = False
        self.handed = 0  # slots handed over so far
        self.error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        queue.on_ready = self._on_ready

    def _on_ready(self) -> None:
        self._drained.clear()
        self._wake.set()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        self.error = None
        self._task = asyncio.create_task(self._run(), name=f"acp-pump-{self.agent_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def mark_saved(self, data: bytes | None) -> None:
        self._saved = data

    async def _run(self) -> None:
        try:
            while True:
                while self.queue.head_ready:
                    await self._deliver(self.queue.take_ready())
                if not len(self.queue):
                    self._drained.set()
                self._wake.clear()
                await self._wake.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            self.error = e
            self._drained.set()
            log.warning("agent %s: event sink failed: %r", self.agent_id, e)

    async def _deliver(self, slots: list[Slot]) -> None:
        events: list[EventKind] = []
        for slot in slots:
            if slot.event is not None:
                events.append(slot.event)
                self.state.apply(slot.event)
            elif slot.mark is not None:
                slot.mark(self.state)
        self._delivering = True
        try:
            await self._hand(events)
        finally:
            self._delivering = False
        self.handed += len(slots)
        self._progress.set()

    async def _hand(self, events: list[EventKind]) -> None:
        data = self.state.dump() if self.persist else None
        changed = data is not None and data != self._saved
        if self._with_cursor and self.cursor_store is not None:
            # Contract 1: the full snapshot rides with every batch (one transaction).
            if events or changed:
                await self._batch_sink(list(events), cursor=data)  # type: ignore[misc]
                if data is not None:
                    self._saved = data
            return
        if events:
            if self._batch_sink is not None and len(events) > 1:
                await self._batch_sink(list(events))
            else:
                for ev in events:
                    await self.sink(ev)
        if changed and data is not None:
            await self._save(data)

    async def _save(self, data: bytes) -> None:
        store = self.cursor_store
        if store is None:
            return
        try:
            await store.save_cursor(self.agent_id, data)
        except Exception as e:
            log.warning("agent %s: cannot save the ACP session state: %s", self.agent_id, e)
            return
        self._saved = data

    async def save_now(self) -> None:
        """Persist the state if it changed (queue drained first by the caller). Never raises."""
        if not self.persist:
            return
        data = self.state.dump()
        if data == self._saved:
            return
        if self._with_cursor and self.cursor_store is not None:
            try:
                await self._batch_sink([], cursor=data)  # type: ignore[misc]
            except Exception as e:
                log.warning("agent %s: cannot save the ACP session state: %s", self.agent_id, e)
                return
            self._saved = data
            return
        await self._save(data)

    async def commit(self) -> None:
        """Make what was handed over durable where the sink can say so (`flush`)."""
        flush = getattr(self.sink, "flush", None)
        if flush is None:
            return
        with contextlib.suppress(Exception):
            await flush()

    async def flush_out(self, limit: float = 2.0) -> None:
        """Wait (bounded) until the slots queued so far were handed to the sink: a permission
        broker calls it before putting its own events on the agent's stream."""
        target = self.queue.pushed
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while self.handed < target:
            left = deadline - loop.time()
            if not self.running or self.error is not None or left <= 0:
                return
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                await wait_for(self._progress.wait(), left)

    async def drain(self) -> None:
        """Wait until every queued slot was handed over (held slots must be filled first by
        the caller). Raises what the sink raised."""
        while self.error is None and (len(self.queue) or self._delivering):
            if not self.running:
                # No pump (the driver is not running: close(), conclude()): deliver inline.
                while self.queue.head_ready:
                    await self._deliver(self.queue.take_ready())
                break
            self._drained.clear()
            self._wake.set()
            await self._drained.wait()
        if self.error is not None:
            raise self.error


async def load_state(store: CursorStore, agent_id: str, pump: OutputPump) -> AcpResumeState | None:
    """Read the stored resume state into `pump` (the committed view); None when there is
    none or it is unreadable (logged: the driver then starts a fresh session)."""
    try:
        data = await store.load_cursor(agent_id)
    except Exception as e:
        log.warning("agent %s: cannot load the ACP session state: %s", agent_id, e)
        return None
    state = AcpResumeState.load(data, agent_id)
    if state is None:
        return None
    pump.state = state
    if data == state.dump():
        pump.mark_saved(data)
    log.info(
        "agent %s: ACP session state loaded (session %s, %d turns%s)",
        agent_id,
        state.session_id,
        state.turns,
        ", finished" if state.terminal else "",
    )
    return state
