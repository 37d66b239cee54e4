"""NdjsonDriver: one caliban agent's TurnEvent stream over its per-agent socket (§4, §6.4).

Per connection: resolve the endpoint (caliband `attach`), dial (Unix, or TCP+TLS+bearer), read
lines. Every line goes through a `LineCursor`, which recognises the worker's replay of lines
already consumed (exactly, also past the 1024-line replay window, see `line_cursor`); only new
lines reach the `Normalizer`, whose events are awaited into the sink in wire order.

The stream is read in large chunks (`LineReader`: same lines, 1 MiB limit and cut-off-tail
rule as `read_line`), and a whole read is handled synchronously: one cursor pass, one
normaliser pass, then one `emit_batch` call when the sink has that batch path (the
FleetManager's does; one timestamp per read), else one await per event with each line consumed
only once the previous line's events were taken, as before. After each read the driver yields
to the loop, so a replay backlog never monopolises it.

Reconnects after EOF without a terminal `agent_finished`, or a connect/read error, with backoff
`min(cap, base * 2^attempt) * jitter[0.5, 1.0)` (jitter a deterministic hash of agent id and
attempt). `max_failures` consecutive failures (a connection that delivers a new line resets
the count) end `run()` with `gave_up`; state is kept, so a later `run()` continues exactly.
EOF (or any connection end) after the terminal event ends with `finished`; `close()` ends with
`closed` between lines.

Resume state (line cursor + normaliser state + terminal flag) is persisted through an optional
`CursorStore` (the EventStore implements it): in the background while lines flow, at the end
of every connection and when `run()` returns, and loaded by the first `run()`, so a restarted
prosperod neither re-emits history nor loses its place. State is only ever saved between lines
whose events have all been handed to the sink; after a crash of the process the events since
the last save (at most ~`save_interval` seconds' worth) may be emitted again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, cast

import orjson

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
from prospero.core.drivers.line_cursor import (
    DEFAULT_WINDOW,
    Gap,
    LineCursor,
    line_digest,
    line_digests,
)
from prospero.core.errors import ProsperoError, Unsupported
from prospero.core.metrics import Metrics
from prospero.core.normalize import Normalizer
from prospero.core.transport import (
    MAX_LINE,
    STREAM_LIMIT,
    LineReader,
    OversizedLine,
    close_writer,
    open_endpoint,
    send_one_line,
)
from prospero.types.events import (
    AgentFinished,
    CompactKind,
    EventKind,
    StreamGap,
    expand_kind,
)

log = logging.getLogger(__name__)

STATE_VERSION = 1


class BatchEventSink(Protocol):
    """An EventSink that may also take several events, in wire order, in one call. The
    driver uses `emit_batch` when the sink has it (the FleetManager's does): one await and
    one timestamp per read of the stream instead of one per event. Outputs come as
    `CompactKind` (stream, chunk) pairs, the form the emitter queues them in."""

    async def __call__(self, kind: EventKind) -> None: ...

    async def emit_batch(self, kinds: list[CompactKind]) -> None: ...


def _drop_lines(data: bytes, n: int) -> bytes:
    """`data` without its first `n` newline-terminated lines."""
    pos = 0
    for _ in range(n):
        nl = data.find(b"\n", pos)
        if nl < 0:
            return b""
        pos = nl + 1
    return data[pos:]


class NdjsonDriver:
    """AgentDriver for caliban's NDJSON attach stream."""

    protocol = "ndjson"

    def __init__(
        self,
        target: DriverTarget,
        sink: EventSink,
        options: DriverOptions,
        metrics: Metrics,
        cursor_store: CursorStore | None = None,
        *,
        cursor_window: int = DEFAULT_WINDOW,
        save_interval: float = 1.0,
        terminal_eof_timeout: float = 5.0,
    ) -> None:
        self.target = target
        self.sink = sink
        # Optional batch path of the sink (see BatchEventSink); else one await per event.
        batch_sink = getattr(sink, "emit_batch", None)
        self._batch_sink: Callable[[list[CompactKind]], Awaitable[None]] | None = (
            batch_sink if callable(batch_sink) else None
        )
        self.options = options
        self.metrics = metrics
        self.cursor_store = cursor_store
        self.save_interval = save_interval
        self.terminal_eof_timeout = terminal_eof_timeout
        self.cursor: LineCursor[bytes | None] = LineCursor(cursor_window)
        self.normalizer = Normalizer(options, metrics)
        self._terminal = False
        self._closing = False
        self._close_event = asyncio.Event()
        self._retry_now = asyncio.Event()  # nudge(): end a reconnect backoff
        self._loaded = cursor_store is None
        self._running = False
        self._run_task: asyncio.Task[Any] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._writer: asyncio.StreamWriter | None = None
        self._transcript_size = -1  # size of stdout.ndjson when last replayed
        # persistence bookkeeping
        self._version = 0  # bumped per processed batch of cursor output
        self._saved_version = 0
        self._in_batch = False
        self._batch_interrupted = False
        self._save_lock = asyncio.Lock()
        # observations (tests, ops)
        self.connections = 0
        self.discarded_lines = 0

    # ---- AgentDriver ----------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """The terminal `agent_finished` has been emitted."""
        return self._terminal

    async def run(self) -> DriverExit:
        if self._running:
            raise RuntimeError(f"driver for {self.target.agent_id} is already running")
        self._running = True
        self._run_task = asyncio.current_task()
        self._idle.clear()
        saver = asyncio.create_task(self._saver(), name=f"ndjson-saver-{self.target.agent_id}")
        try:
            result = await self._run()
            await self._save()
            return result
        except BaseException:
            # Cancelled or the sink failed. Only a state that matches what the sink has seen
            # is saved: never while a batch is half delivered.
            if not self._batch_interrupted:
                with contextlib.suppress(Exception):
                    await self._save()
            raise
        finally:
            saver.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await saver
            self._running = False
            self._run_task = None
            self._idle.set()

    async def send_input(self, text: str) -> None:
        await self._send({"type": "UserMessage", "text": text})

    async def end_input(self) -> None:
        await self._send({"type": "EndInput"})

    async def cancel_turn(self) -> None:
        raise Unsupported("NDJSON agents cannot cancel a turn; kill instead")

    def nudge(self) -> None:
        """The agent's status changed: end a reconnect backoff now."""
        self._retry_now.set()

    async def close(self) -> None:
        """Stop `run()` between lines (it returns `closed`) and persist the state."""
        self._closing = True
        self._close_event.set()
        if self._writer is not None:
            self._writer.transport.abort()
        if self._running:
            if asyncio.current_task() is not self._run_task:
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._idle.wait(), 10.0)
        else:
            await self._save()

    # ---- main loop ------------------------------------------------------------------------

    async def _run(self) -> DriverExit:
        await self._load_once()
        if self._closing:
            return DriverExit.closed
        if self._terminal:
            return DriverExit.finished
        failures = 0
        while True:
            got_new = await self._connection()
            if self._closing:
                return DriverExit.closed
            if self._terminal:
                await self._process(None, [], flush=True)  # a held-back tool_started
                return DriverExit.finished
            if got_new:
                failures = 0
            failures += 1
            if failures >= self.options.max_failures:
                log.warning(
                    "agent %s: giving up after %d consecutive failed connections",
                    self.target.agent_id,
                    failures,
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

    async def _connection(self) -> bool:
        """One connection: dial, read until EOF/error/close. True if it delivered a new line."""
        agent = self.target.agent_id
        conn = await self._dial()
        if conn is None:
            return await self._from_transcript()
        reader, writer = conn
        if self._closing:
            writer.transport.abort()
            return False
        self._writer = writer
        self.connections += 1
        self.cursor.begin_connection()
        lines = LineReader(reader)
        got_new = False
        try:
            while not self._closing:
                try:
                    if self._terminal:
                        batch = await wait_for(
                            lines.read_lines(), self.terminal_eof_timeout
                        )
                    else:
                        batch = await lines.read_lines()
                except TimeoutError:
                    log.info("agent %s: no EOF after the terminal event; done", agent)
                    break
                except (OSError, ValueError, asyncio.IncompleteReadError) as e:
                    log.info("agent %s: attach stream read failed: %s", agent, e)
                    break
                if batch is None:
                    break
                if await self._take(batch):
                    got_new = True
                # A read is processed without a pause; then let the other agents, the emitter
                # and the API have the loop (a replay backlog is read in many reads).
                await asyncio.sleep(0)
        finally:
            self._writer = None
            dropped = self.cursor.end_connection()
            if dropped:
                self.discarded_lines += dropped
                log.info(
                    "agent %s: connection ended before its replay overlap was verified; "
                    "%d undecided lines will be replayed",
                    agent,
                    dropped,
                )
            if self._closing:
                writer.transport.abort()
            else:
                await close_writer(writer)
        await self._save()
        return got_new

    async def _from_transcript(self) -> bool:
        """The socket is gone (the worker exited, e.g. a short run that ended before we
        dialled): replay the agent's `stdout.ndjson` transcript instead, when it is readable
        here. It holds every line from line 1, so the lines we already hold are skipped down to
        the cursor's window and the overlap is verified as for a socket replay. True if it
        delivered a new line."""
        if not self.target.session_dir or self._closing:
            return False
        path = Path(self.target.session_dir) / "stdout.ndjson"
        try:
            size = await asyncio.to_thread(lambda: path.stat().st_size)
        except OSError:
            return False
        if size == self._transcript_size:
            return False  # nothing new since the last read
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except OSError as e:
            log.info("agent %s: transcript unreadable: %s", self.target.agent_id, e)
            return False
        self._transcript_size = size
        skip = max(0, self.cursor.seen - self.cursor.held)
        if skip:
            data = _drop_lines(data, skip)
        reader = asyncio.StreamReader(limit=STREAM_LIMIT)
        reader.feed_data(data)
        reader.feed_eof()
        self.cursor.begin_connection()
        lines = LineReader(reader)
        got_new = False
        try:
            while not self._closing and (batch := await lines.read_lines()) is not None:
                if await self._take(batch):
                    got_new = True
        finally:
            self.discarded_lines += self.cursor.end_connection()
        if got_new:
            self.metrics.inc(m.TRANSCRIPT_RECOVERIES)
            log.info("agent %s: recovered lines from %s", self.target.agent_id, path)
        await self._save()
        return got_new

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
            if isinstance(exc, ProsperoError | OSError | ValueError):
                log.info("agent %s: cannot attach: %s", self.target.agent_id, exc)
            else:
                log.warning("agent %s: cannot attach: %r", self.target.agent_id, exc)
            return None
        return task.result()

    async def _take(self, batch: list[bytes | OversizedLine]) -> bool:
        """Run one read's lines through the cursor and process what is new. True if any was.

        With a batch sink the whole read is one batch (one sink call). A plain sink gets the
        lines one at a time, each consumed only once the previous one's events were taken,
        exactly as if they had been read one by one."""
        if self._batch_sink is None:
            got_new = False
            for x in batch:
                if self._closing:  # close() stops between lines; the rest is replayed later
                    break
                if await self._take_batch([x]):
                    got_new = True
            return got_new
        return await self._take_batch(batch)

    async def _take_batch(self, batch: list[bytes | OversizedLine]) -> bool:
        payloads: list[bytes | None]
        if all(type(x) is bytes for x in batch):
            good = cast(list[bytes], batch)
            gap, new = self.cursor.push_many(line_digests(good), cast(list[bytes | None], good))
        else:
            digests: list[bytes] = []
            payloads = []
            for x in batch:
                if isinstance(x, OversizedLine):
                    log.debug(
                        "agent %s: read a %d-byte line (over the line limit)",
                        self.target.agent_id,
                        x.size,
                    )
                    digests.append(x.digest)
                    payloads.append(None)
                else:
                    digests.append(line_digest(x))
                    payloads.append(x)
            gap, new = self.cursor.push_many(digests, payloads)
        if gap is None and not new:
            return False
        await self._process(gap, new)
        return bool(new)

    async def _process(
        self, gap: Gap | None, payloads: list[bytes | None], *, flush: bool = False
    ) -> None:
        self._in_batch = True
        try:
            await self._deliver(self._normalise(gap, payloads, flush))
        except BaseException:
            # The sink saw only part of this batch: never persist a state that claims it all.
            self._batch_interrupted = True
            raise
        finally:
            self._version += 1
            self._in_batch = False

    def _normalise(
        self, gap: Gap | None, payloads: list[bytes | None], flush: bool
    ) -> list[CompactKind]:
        """The batch's events, in order. For a batch sink, outputs stay compact (the emitter
        queues them so); a plain sink gets models."""
        agent = self.target.agent_id
        feed = (
            self.normalizer.feed_lines_compact
            if self._batch_sink is not None
            else self.normalizer.feed_lines
        )
        out: list[CompactKind] = []
        if gap is not None:
            self.metrics.inc(m.STREAM_GAPS)
            log.warning("agent %s: stream gap: %s", agent, gap.detail)
            out.extend(self.normalizer.flush())
            out.append(StreamGap(missing=gap.missing, detail=gap.detail))
        if None in payloads:
            start = 0
            for i, payload in enumerate(payloads):
                if payload is None:
                    out.extend(feed(cast(list[bytes], payloads[start:i])))
                    start = i + 1
                    self.metrics.inc(m.OVERSIZED_LINES)
                    log.warning("agent %s: skipped a line over the %d-byte limit", agent, MAX_LINE)
            out.extend(feed(cast(list[bytes], payloads[start:])))
        elif payloads:
            out.extend(feed(cast(list[bytes], payloads)))
        if flush:
            out.extend(self.normalizer.flush())
        return out

    async def _deliver(self, events: list[CompactKind]) -> None:
        """Hand events to the sink in order: in one call when it takes batches."""
        if not events:
            return
        batch_sink = self._batch_sink
        if batch_sink is None:
            for ev in events:
                kind = expand_kind(ev)
                if type(kind) is AgentFinished:
                    self._terminal = True
                await self.sink(kind)
            return
        for ev in events:
            if type(ev) is AgentFinished:
                self._terminal = True
                break
        await batch_sink(events)

    # ---- steering -------------------------------------------------------------------------

    async def _send(self, frame: dict[str, Any]) -> None:
        endpoint = await self.target.resolve_endpoint()
        await send_one_line(endpoint, self.target.security, orjson.dumps(frame))

    # ---- persistence ----------------------------------------------------------------------

    def _snapshot(self) -> bytes:
        return orjson.dumps(
            {
                "v": STATE_VERSION,
                "protocol": self.protocol,
                "cursor": self.cursor.state(),
                "normalizer": self.normalizer.state(),
                "terminal": self._terminal,
            }
        )

    async def _save(self) -> None:
        """Persist the state if it changed since the last save. Never raises."""
        store = self.cursor_store
        if store is None or self._in_batch or self._batch_interrupted or not self._loaded:
            return
        async with self._save_lock:
            version = self._version
            if version == self._saved_version:
                return
            data = self._snapshot()  # taken synchronously: consistent with the sink
            try:
                await store.save_cursor(self.target.agent_id, data)
            except Exception as e:
                log.warning("agent %s: cannot save the stream cursor: %s", self.target.agent_id, e)
                return
            self._saved_version = max(self._saved_version, version)

    async def _saver(self) -> None:
        if self.cursor_store is None:
            return
        last = time.monotonic()
        while True:
            await asyncio.sleep(max(0.01, self.save_interval - (time.monotonic() - last)))
            last = time.monotonic()
            await self._save()

    async def _load_once(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        store = self.cursor_store
        assert store is not None
        try:
            data = await store.load_cursor(self.target.agent_id)
        except Exception as e:
            log.warning("agent %s: cannot load the stream cursor: %s", self.target.agent_id, e)
            return
        if not data:
            return
        try:
            state = orjson.loads(data)
            if not isinstance(state, dict) or state.get("v") != STATE_VERSION:
                raise ValueError(f"unsupported cursor state version {state!r:.40}")
            cursor: LineCursor[bytes | None] = LineCursor(self.cursor.window)
            cursor.restore(state.get("cursor"))
        except (ValueError, orjson.JSONDecodeError) as e:
            log.warning(
                "agent %s: ignoring an unreadable stream cursor (history may repeat): %s",
                self.target.agent_id,
                e,
            )
            return
        self.cursor = cursor
        self.normalizer.restore(state.get("normalizer"))
        self._terminal = state.get("terminal") is True
        log.info(
            "agent %s: resuming the stream after %d lines%s",
            self.target.agent_id,
            cursor.seen,
            " (finished)" if self._terminal else "",
        )
