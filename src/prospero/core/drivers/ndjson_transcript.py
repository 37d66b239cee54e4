"""NdjsonDriver's transcript side: reading `<session_dir>/stdout.ndjson` by position.

`TranscriptReading` is mixed into `NdjsonDriver` (see its module docstring): transcript tail
mode for a live connection (`_read_tail`), the check and positioning before it
(`_open_tail`, with `_rebase` after a slow-reader hole), and recovery when the socket is gone
(`_from_transcript`). The file work itself is `transcript.Transcript`, run in a thread, except
the live tail's reads of a little new data (`_read_new`), done on the loop: a thread round trip
per read would cost more than the read and add a loop turn (or more, behind a busy default
executor) to every frame's latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from prospero.core import metrics as m
from prospero.core.drivers.base import DriverTarget
from prospero.core.drivers.line_cursor import ANCHOR_LINES, SLOW_READER, Gap, LineCursor
from prospero.core.drivers.transcript import Transcript, TranscriptError, transcript_path
from prospero.core.metrics import Metrics
from prospero.core.transport import READ_CHUNK, OversizedLine

log = logging.getLogger("prospero.core.drivers.ndjson")

# Transcript tail mode on a quiet stream (issue 11: idle agents cost ~nothing): after this many
# seconds without a bell or a line, the timed looks at the file back off, up to TAIL_IDLE_POLL.
TAIL_QUIET_AFTER = 5.0
TAIL_IDLE_POLL = 120.0
# A read of at most this many new bytes is done on the event loop (a page-cache read: tens of
# microseconds at most); a larger backlog (catching up) is read in a thread.
INLINE_READ = 256 * 1024


async def _read_new(tail: Transcript) -> list[bytes | OversizedLine]:
    """`tail.read_new()`: on the loop when less than INLINE_READ bytes are new (one pread),
    else in a thread. The same lines either way (the read size only changes how they are
    chunked)."""
    batch = tail.read_available(INLINE_READ)
    if batch is not None:
        return batch  # type: ignore[return-value]
    return await asyncio.to_thread(tail.read_new)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Bell:
    """What the socket drainer tells `_read_tail`: `rung` (new bytes or EOF since the driver
    last cleared it) and, while the driver waits, the future that `ring()` resolves. An
    `asyncio.Event` for its one waiter, without a coroutine per wait."""

    __slots__ = ("rung", "waiter")

    def __init__(self) -> None:
        self.rung = False
        self.waiter: asyncio.Future[None] | None = None

    def ring(self) -> None:
        if not self.rung:  # rung already: the driver has yet to look, nothing to wake
            self.rung = True
            if self.waiter is not None:
                _wake(self.waiter)


class TranscriptReading:
    """The transcript half of NdjsonDriver (a mixin: the driver provides the state and the
    `_take` / `_process` / `_save` pipeline)."""

    target: DriverTarget
    metrics: Metrics
    cursor: LineCursor[bytes | None]
    terminal_eof_timeout: float
    transcript_poll: float
    tail_connections: int
    _closing: bool
    _terminal: bool
    _loaded: bool
    _exact_to_end: bool

    async def _take(
        self,
        batch: list[bytes | OversizedLine],
        *,
        positional: bool = False,
        stop_on_close: bool = True,
    ) -> bool:
        raise NotImplementedError

    async def _process(
        self, gap: Gap | None, payloads: list[bytes | None], *, flush: bool = False
    ) -> None:
        raise NotImplementedError

    async def _save(self) -> None:
        raise NotImplementedError

    async def _read_tail(self, reader: asyncio.StreamReader, tail: Transcript) -> bool:
        """Transcript tail mode: lines come from the file by position; the socket only rings
        the bell (new bytes) and tells of the worker's exit (EOF), after which the file is
        drained to its end."""
        agent = self.target.agent_id
        bell = _Bell()
        eof = False

        async def drain_socket() -> None:
            nonlocal eof
            try:
                while await reader.read(READ_CHUNK):
                    bell.ring()
            except (OSError, ValueError, asyncio.IncompleteReadError) as e:
                log.info("agent %s: attach stream read failed: %s", agent, e)
            finally:
                eof = True
                bell.ring()

        drainer = asyncio.create_task(drain_socket(), name=f"ndjson-bell-{agent}")
        got_new = False
        took = False  # the last look found lines (and nothing was awaited since)
        terminal_at: float | None = None
        busy_at = time.monotonic()  # the last bell or new line (the replay rings at once)
        try:
            while not self._closing:
                bell.rung = False
                at_eof = eof  # read before the file: a line written before EOF is still read
                try:
                    batch = await _read_new(tail)
                except TranscriptError as e:
                    log.warning("agent %s: transcript read failed: %s", agent, e.detail)
                    break
                if batch:
                    if took:
                        # A second read in a row found lines (a backlog): let the other tasks
                        # run between them. After a single read the wait below yields anyway.
                        await asyncio.sleep(0)
                    busy_at = time.monotonic()
                    if await self._take(batch, positional=True):
                        got_new = True
                    took = True
                    continue
                took = False
                if at_eof:
                    self._exact_to_end = True
                    break
                if self._terminal:
                    terminal_at = terminal_at or time.monotonic()
                    if time.monotonic() - terminal_at > self.terminal_eof_timeout:
                        log.info("agent %s: no EOF after the terminal event; done", agent)
                        break
                busy_at = await self._tail_wait(bell, tail, busy_at)
        finally:
            drainer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await drainer
        return got_new

    async def _tail_wait(self, bell: _Bell, tail: Transcript, busy_at: float) -> float:
        """Wait for the socket's bell or the next look at the file; returns the new `busy_at`.

        While the stream is busy (a bell or a line within `TAIL_QUIET_AFTER`) or ending, the
        file is looked at every `transcript_poll` (a line may reach the socket before the
        file). On a quiet stream the timed looks back off (twice the quiet time, up to
        `TAIL_IDLE_POLL`) and one that finds the file no longer than what was read costs an
        fstat, not a thread hop: an idle agent costs (almost) nothing until its socket rings.
        """
        while True:
            quiet = time.monotonic() - busy_at
            fast = self._terminal or quiet < TAIL_QUIET_AFTER
            timeout = (
                self.transcript_poll
                if fast
                else min(TAIL_IDLE_POLL, max(self.transcript_poll, 2 * quiet))
            )
            if not bell.rung:
                # One plain future and one timer handle per wait (this runs once per read of a
                # live agent): what `wait_for(event.wait(), timeout)` costs, less its
                # coroutines and timeout context.
                loop = asyncio.get_running_loop()
                waiter = bell.waiter = loop.create_future()
                timer = loop.call_later(max(0.0, timeout), _wake, waiter)
                try:
                    await waiter
                finally:
                    bell.waiter = None
                    timer.cancel()
            if bell.rung:
                return time.monotonic()
            if fast or self._closing or tail.grew():
                return busy_at

    async def _open_tail(self) -> Transcript | None:
        """The transcript positioned after our last line, when it is readable and agrees with
        what we hold (or can be re-based onto after a slow-reader hole); else None."""
        path = transcript_path(self.target.session_dir)
        if path is None:
            return None
        tail = Transcript(path)
        try:
            await asyncio.to_thread(
                tail.seek_verified, self.cursor.seen, self.cursor.held_digests()
            )
            return tail
        except TranscriptError as e:
            if e.reason == "mismatch" and await self._rebase(tail):
                return tail
            tail.close()
            if e.reason != "unreadable":
                log.info(
                    "agent %s: not reading the transcript by position (%s: %s); matching the "
                    "socket replay instead",
                    self.target.agent_id,
                    e.reason,
                    e.detail,
                )
            return None

    async def _rebase(self, tail: Transcript) -> bool:
        """What we hold disagrees with the transcript at our position: lines we never got (a
        slow-reader hole) shifted it. Find our last lines in the file; if they occur exactly
        once past our position, report the hole and continue from there."""
        try:
            digests = await asyncio.to_thread(tail.all_digests)
        except TranscriptError:
            return False
        held = self.cursor.held_digests()
        seen = self.cursor.seen
        k = min(len(held), ANCHOR_LINES)
        if k == 0:
            return False
        suffix = held[-k:]
        found = [p for p in range(max(seen, k), len(digests) + 1) if digests[p - k : p] == suffix]
        if len(found) != 1:
            return False
        at = found[0]
        try:
            await asyncio.to_thread(tail.seek_line, at)
        except TranscriptError:
            return False
        gap = Gap(
            missing=at - seen,
            detail=(
                f"the transcript has {at - seen} lines before our last one that the socket "
                f"never delivered (the worker drops lines for a slow reader)"
            ),
            reason=SLOW_READER,
        )
        self.cursor.rebase(at, digests[max(0, at - self.cursor.window) : at])
        log.warning("agent %s: re-based on the transcript at line %d", self.target.agent_id, at)
        await self._process(gap, [])
        return True

    async def _from_transcript(self, *, force: bool = False) -> bool:
        """The socket is gone (the worker exited, e.g. a short run that ended before we
        dialled): take the lines after ours from the transcript, by position, to its end,
        when it is readable here. True if it delivered a new line."""
        if self._closing and not force:
            return False
        if not self._loaded:
            return False
        path = transcript_path(self.target.session_dir)
        if path is None:
            return False
        tail = Transcript(path)
        got_new = False
        try:
            try:
                await asyncio.to_thread(
                    tail.seek_verified, self.cursor.seen, self.cursor.held_digests()
                )
            except TranscriptError as e:
                if not (e.reason == "mismatch" and await self._rebase(tail)):
                    if e.reason != "unreadable":
                        log.warning(
                            "agent %s: cannot recover from the transcript (%s: %s)",
                            self.target.agent_id,
                            e.reason,
                            e.detail,
                        )
                    return False
            while True:
                batch = await asyncio.to_thread(tail.read_new)
                if not batch:
                    self._exact_to_end = True
                    break
                if await self._take(batch, positional=True, stop_on_close=not force):
                    got_new = True
                if self._closing and not force:
                    break
        except TranscriptError as e:
            log.info("agent %s: transcript unreadable: %s", self.target.agent_id, e.detail)
        finally:
            tail.close()
        if got_new:
            self.metrics.inc(m.TRANSCRIPT_RECOVERIES)
            log.info("agent %s: recovered lines from %s", self.target.agent_id, path)
        await self._save()
        return got_new
