"""NdjsonDriver: one caliban agent's TurnEvent stream over its per-agent socket (§4, §6.4).

Per connection: resolve the endpoint (caliband `attach`), dial (Unix, or TCP+TLS+bearer), read
lines. Where the agent's transcript (`<session_dir>/stdout.ndjson`) is readable here and its
lines up to our position have the digests we hold, the connection runs in *transcript tail
mode*: lines are taken by position from the file (exact: no replay matching, no slow-reader
holes), and the socket is kept open only to learn of new lines and of the worker's exit (an
open connection also keeps the worker's idle timer reset). Otherwise every socket line goes
through a `LineCursor`, which recognises the worker's replay of lines already consumed (past
the 1024-line replay window too) and reports every loss it cannot rule out as a `stream_gap`
with a reason (`no_overlap`, `ambiguous_overlap`, `slow_reader`). Only new lines reach the
`Normalizer`, whose events are awaited into the sink in wire order; skipped lines (malformed,
oversized, unknown frame types) become coalesced `frames_skipped` events.

The stream is read in large chunks and a whole read is handled synchronously: one cursor pass,
one normaliser pass, then one `emit_batch` call when the sink has that batch path (the
FleetManager's does), else one await per event with each line consumed only once the previous
line's events were taken. After each read the driver yields to the loop.

The outer loop (backoff, failure budget, closing/terminal checks) is `ReconnectingDriver`'s.
When the agent is gone (its status terminal, the endpoint refused or at EOF) and the run never
ended on the wire, the transcript is read to its end at once; if it holds no `RunEnd` either,
the driver concludes the run itself (`agent_finished{outcome: crashed | killed}`, open tool calls
closed) and returns `finished`.

Resume state (line cursor + normaliser state + terminal flag) is persisted, with every batch
when the sink takes a cursor (one transaction with the events it covers), else through the
`CursorStore`: the snapshot forms and their saving and loading are `ndjson_state.ResumeState`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
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
    ReconnectingDriver,
)
from prospero.core.drivers.line_cursor import (
    DEFAULT_WINDOW,
    WORKER_RING,
    Gap,
    LineCursor,
    line_digest,
    line_digests,
)
from prospero.core.drivers.ndjson_state import ResumeState
from prospero.core.drivers.ndjson_transcript import TranscriptReading
from prospero.core.drivers.transcript import Transcript, digests_of
from prospero.core.errors import Unsupported
from prospero.core.metrics import Metrics
from prospero.core.normalize import Normalizer
from prospero.core.transport import (
    MAX_LINE,
    LineReader,
    OversizedLine,
    close_writer,
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

TAIL_RETRY = 1.0  # seconds between looks for a transcript while reading the socket


class BatchEventSink(Protocol):
    """An EventSink that may also take several events, in wire order, in one call. The
    driver uses `emit_batch` when the sink has it (the FleetManager's does): one await and
    one timestamp per read of the stream instead of one per event. Outputs come as
    `CompactKind` (stream, chunk) pairs, the form the emitter queues them in. A sink whose
    `emit_batch` takes `cursor=` commits that resume snapshot with the batch's events."""

    async def __call__(self, kind: EventKind) -> None: ...

    async def emit_batch(self, kinds: list[CompactKind], cursor: bytes | None = None) -> None:
        """`cursor`: the resume snapshot to commit with these events. A sink may also take
        `cursor_base: bytes | None` (the agent's base row, key agent id + BASE_SUFFIX, to
        commit in the same transaction): it then gets base + delta snapshots."""


BatchFn = Callable[..., Awaitable[None]]


def _takes(fn: BatchFn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class NdjsonDriver(ResumeState, TranscriptReading, ReconnectingDriver):
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
        worker_ring: int = WORKER_RING,
        save_interval: float = 1.0,
        terminal_eof_timeout: float = 5.0,
        transcript_poll: float = 0.05,
        settle_after: float = 0.5,
    ) -> None:
        super().__init__(target, sink, options, metrics, cursor_store)
        # Optional batch path of the sink (see BatchEventSink); else one await per event.
        batch_sink = getattr(sink, "emit_batch", None)
        self._batch_sink: BatchFn | None = batch_sink if callable(batch_sink) else None
        batch = self._batch_sink
        self._sink_takes_cursor = batch is not None and _takes(batch, "cursor")
        # ... and a base row beside it (`ResumeState._snapshot_marks`: base + delta).
        self._sink_takes_base = batch is not None and _takes(batch, "cursor_base")
        self.save_interval = save_interval
        self.terminal_eof_timeout = terminal_eof_timeout
        self.transcript_poll = transcript_poll
        self.settle_after = settle_after
        self.cursor: LineCursor[bytes | None] = LineCursor(cursor_window, worker_ring)
        self.normalizer = Normalizer(options, metrics)
        self._loaded = cursor_store is None
        self._writer: asyncio.StreamWriter | None = None
        self._exact_to_end = False  # the transcript was last read, by position, to its end
        # persistence bookkeeping
        self._version = 0  # bumped per processed batch of cursor output
        self._saved_version = 0
        self._in_batch = False
        self._batch_interrupted = False
        self._save_lock = asyncio.Lock()
        # observations (tests, ops)
        self.discarded_lines = 0
        self.transcript_lines = 0  # lines taken from the transcript by position
        self.tail_connections = 0  # connections run in transcript tail mode

    # ---- AgentDriver ----------------------------------------------------------------------

    async def run(self) -> DriverExit:
        if self._running:
            raise RuntimeError(f"driver for {self.target.agent_id} is already running")
        self._running = True
        self._run_task = asyncio.current_task()
        self._idle.clear()
        saver = None
        if self.cursor_store is not None and not self._sink_takes_cursor:
            saver = asyncio.create_task(self._saver(), name=f"ndjson-saver-{self.target.agent_id}")
        try:
            result = await self._reconnect_loop()
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
            if saver is not None:
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

    # ---- ReconnectingDriver hooks ---------------------------------------------------------

    async def _after_terminal(self) -> None:
        await self._process(None, [], flush=True)  # a held-back tool_started

    async def _recover_after_exit(self) -> None:
        await self._from_transcript(force=True)

    async def _conclude(self, outcome: str, detail: str) -> None:
        """The run never ended on the wire: recover what the transcript holds, then end it."""
        if self._running and asyncio.current_task() is not self._run_task:
            await self.close()  # never emit beside a running read loop
        if not self._state_loaded:  # concluded without ever running (e.g. after a restart)
            self._state_loaded = True
            await self._load_state()
        if not self._exact_to_end and not self._terminal:
            await self._from_transcript(force=True)
        if self._terminal:
            return  # finished after all (the transcript had the RunEnd)
        events: list[CompactKind] = []
        if not self._exact_to_end:
            events.append(
                StreamGap(
                    missing=None,
                    reason="worker_exited",
                    detail=(
                        "the worker is gone and its transcript is not readable here: lines "
                        "after the last one received may be lost"
                    ),
                )
            )
        events.extend(self.normalizer.conclude(outcome, detail))
        self._in_batch = True
        try:
            self._version += 1
            await self._deliver(events)
        finally:
            self._in_batch = False
        await self._save()

    # ---- one connection -------------------------------------------------------------------

    async def _connection(self) -> bool:
        """One connection: dial, read until EOF/error/close. True if it delivered a new line."""
        conn = await self._dial()
        if conn is None:
            return await self._from_transcript()
        reader, writer = conn
        if self._closing:
            writer.transport.abort()
            return False
        self._writer = writer
        self.connections += 1
        tail = await self._open_tail()
        got_new = False
        try:
            if tail is None:
                # The transcript may become usable mid-connection (`session_dir` filled in
                # late, or the file not there yet): the socket reader then hands over.
                got_new, tail = await self._read_socket(reader)
            if tail is not None:
                self.tail_connections += 1
                if await self._read_tail(reader, tail):
                    got_new = True
        finally:
            self._writer = None
            if tail is not None:
                tail.close()
            if self._closing:
                writer.transport.abort()
            else:
                await close_writer(writer)
        await self._save()
        return got_new

    async def _read_socket(self, reader: asyncio.StreamReader) -> tuple[bool, Transcript | None]:
        """Read the socket through the cursor. Returns whether a new line was delivered and,
        when the transcript became usable meanwhile, the tail to continue with."""
        agent = self.target.agent_id
        self._exact_to_end = False
        self.cursor.begin_connection()
        lines = LineReader(reader)
        got_new = False
        tried = (self.target.session_dir, time.monotonic())
        try:
            while not self._closing:
                session_dir = self.target.session_dir
                if (
                    session_dir
                    and not self.cursor.matching
                    and (session_dir != tried[0] or time.monotonic() - tried[1] >= TAIL_RETRY)
                ):
                    tried = (session_dir, time.monotonic())
                    tail = await self._open_tail()
                    if tail is not None:
                        return got_new, tail
                try:
                    if self._terminal:
                        batch = await wait_for(lines.read_lines(), self.terminal_eof_timeout)
                    elif self.cursor.anchoring:
                        settled, batch = await self._read_or_settle(lines)
                        if settled:
                            continue  # decided on the replay in hand
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
            dropped = self.cursor.end_connection()
            if dropped:
                self.discarded_lines += dropped
                log.info(
                    "agent %s: connection ended before its replay overlap was verified; "
                    "%d undecided lines will be replayed",
                    agent,
                    dropped,
                )
        return got_new, None

    async def _read_or_settle(
        self, lines: LineReader
    ) -> tuple[bool, list[bytes | OversizedLine] | None]:
        """While the cursor looks for its anchor in the replay: (False, the next read), or,
        once the socket has been quiet for `settle_after` (a worker writes its replay at
        once, so it is all in), (True, None) after letting the cursor decide on what it has.
        (`read_lines` is cancel-safe: an interrupted read keeps its partial line.)"""
        read = asyncio.ensure_future(lines.read_lines())
        try:
            done, _ = await asyncio.wait({read}, timeout=self.settle_after)
        except BaseException:
            read.cancel()
            raise
        if read in done:
            return False, read.result()
        read.cancel()
        await asyncio.wait({read})
        if not read.cancelled():
            return False, read.result()  # it completed meanwhile: keep what it read
        gap, new = self.cursor.settle()
        if gap is not None or new:
            await self._process(gap, new)
        return True, None

    # ---- lines -> events ------------------------------------------------------------------

    async def _take(
        self,
        batch: list[bytes | OversizedLine],
        *,
        positional: bool = False,
        stop_on_close: bool = True,
    ) -> bool:
        """Run one read's lines through the cursor and process what is new. True if any was.

        With a batch sink the whole read is one batch (one sink call). A plain sink gets the
        lines one at a time, each consumed only once the previous one's events were taken,
        exactly as if they had been read one by one."""
        if self._batch_sink is None:
            got_new = False
            for x in batch:
                if self._closing and stop_on_close:
                    break  # close() stops between lines; the rest is read again later
                if await self._take_batch([x], positional):
                    got_new = True
            return got_new
        return await self._take_batch(batch, positional)

    async def _take_batch(self, batch: list[bytes | OversizedLine], positional: bool) -> bool:
        if all(type(x) is bytes for x in batch):
            # The usual read: no oversized line. One pass to know it, then bulk work only.
            digests = line_digests(cast(list[bytes], batch))
            lines: list[bytes | None] = list(batch)  # type: ignore[arg-type]
            if positional:
                self.cursor.commit_many(digests)
                self.transcript_lines += len(lines)
                if not lines:
                    return False
                await self._process(None, lines)
                return True
            gap, new = self.cursor.push_many(digests, lines)
            if gap is None and not new:
                return False
            await self._process(gap, new)
            return bool(new)
        payloads: list[bytes | None] = [None if isinstance(x, OversizedLine) else x for x in batch]
        for x in batch:
            if isinstance(x, OversizedLine):
                log.debug(
                    "agent %s: read a %d-byte line (over the line limit)",
                    self.target.agent_id,
                    x.size,
                )
        if positional:
            self.cursor.commit_many(digests_of(batch))
            self.transcript_lines += len(batch)
            if not payloads:
                return False
            await self._process(None, payloads)
            return True
        digests = [x.digest if isinstance(x, OversizedLine) else line_digest(x) for x in batch]
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
            events = self._normalise(gap, payloads, flush)
            self._version += 1
            await self._deliver(events)
        except BaseException:
            # The sink saw only part of this batch: never persist a state that claims it all.
            self._batch_interrupted = True
            raise
        finally:
            self._in_batch = False

    def _normalise(
        self, gap: Gap | None, payloads: list[bytes | None], flush: bool
    ) -> list[CompactKind]:
        """The batch's events, in order. For a batch sink, outputs stay compact (the emitter
        queues them so); a plain sink gets models."""
        agent = self.target.agent_id
        norm = self.normalizer
        feed = norm.feed_lines_compact if self._batch_sink is not None else norm.feed_lines
        out: list[CompactKind] = []
        if gap is not None:
            self.metrics.inc(m.STREAM_GAPS)
            log.warning("agent %s: stream gap (%s): %s", agent, gap.reason, gap.detail)
            out.extend(norm.flush())
            out.append(StreamGap(missing=gap.missing, detail=gap.detail, reason=gap.reason))
        if None in payloads:
            start = 0
            for i, payload in enumerate(payloads):
                if payload is None:
                    out.extend(feed(cast(list[bytes], payloads[start:i])))
                    start = i + 1
                    self.metrics.inc(m.OVERSIZED_LINES)
                    norm.skipped("oversized")
                    log.warning("agent %s: skipped a line over the %d-byte limit", agent, MAX_LINE)
            out.extend(feed(cast(list[bytes], payloads[start:])))
        elif payloads:
            out.extend(feed(cast(list[bytes], payloads)))
        skipped = norm.take_skipped()
        if skipped:
            # Coalesced per read, placed before the run's terminal event if this read has it.
            at = next((i for i, e in enumerate(out) if type(e) is AgentFinished), len(out))
            out[at:at] = skipped
        if flush:
            out.extend(norm.flush())
        return out

    async def _deliver(self, events: list[CompactKind]) -> None:
        """Hand events to the sink in order: in one call when it takes batches (with the
        resume snapshot when it takes cursors)."""
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
        if self._sink_takes_cursor and self._loaded:
            version = self._version
            await self._sink_cursor(events)
            self._saved_version = max(self._saved_version, version)
        else:
            await batch_sink(events)

    # ---- steering -------------------------------------------------------------------------

    async def _send(self, frame: dict[str, Any]) -> None:
        endpoint = await self.target.resolve_endpoint()
        await send_one_line(endpoint, self.target.security, orjson.dumps(frame))
