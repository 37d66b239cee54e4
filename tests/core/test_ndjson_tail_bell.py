"""Transcript tail mode's wake-ups (`TranscriptReading._read_tail` / `_tail_wait`): the socket's
bell wakes the tail at once, a line the socket never announces is found by the fast poll, a
backlog is read batch after batch with a yield between them, EOF drains the file to its end,
and cancellation or close() stop it with nothing left behind. Driven on a real socket pair and
file, with a stub `_take` (the pipeline after it is tested elsewhere)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from prospero.core.drivers import ndjson_transcript as nt
from prospero.core.drivers.transcript import Transcript
from prospero.core.transport import OversizedLine
from tests.support import wait_until

LINE = b'{"type":"AssistantTextDelta","text":"' + b"x" * 200 + b'"}'


async def until(pred: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    await wait_until(pred, timeout, interval=0.002, what=what)


class _Target:
    agent_id = "a1"


class Tail(nt.TranscriptReading):
    """The mixin with the driver's state and a `_take` that records each batch."""

    def __init__(self, poll: float, on_take: Callable[[], None] | None = None) -> None:
        self.target = _Target()  # type: ignore[assignment]
        self.transcript_poll = poll
        self.terminal_eof_timeout = 5.0
        self._closing = False
        self._terminal = False
        self._exact_to_end = False
        self.batches: list[list[bytes | OversizedLine]] = []
        self.on_take = on_take

    @property
    def lines(self) -> list[bytes | OversizedLine]:
        return [x for b in self.batches for x in b]

    async def _take(
        self,
        batch: list[bytes | OversizedLine],
        *,
        positional: bool = False,
        stop_on_close: bool = True,
    ) -> bool:
        assert positional
        self.batches.append(list(batch))
        if self.on_take is not None:
            self.on_take()
        return True


class Rig:
    def __init__(self, path: Path, peer: socket.socket, task: asyncio.Task[bool]) -> None:
        self.path = path
        self.peer = peer
        self.task = task

    def write_file(self, *lines: bytes) -> None:
        with self.path.open("ab") as f:
            f.write(b"".join(x + b"\n" for x in lines))

    def ring(self) -> None:
        self.peer.send(b"x\n")


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Callable[[Tail], Rig]]:
    rigs: list[Rig] = []
    closers: list[Callable[[], None]] = []

    def _start(tail: Tail) -> Rig:
        path = tmp_path / f"t{len(rigs)}.ndjson"
        path.touch()
        ours, peer = socket.socketpair()
        transcript = Transcript(path)
        closers.append(transcript.close)

        async def run() -> bool:
            reader, writer = await asyncio.open_connection(sock=ours)
            try:
                return await tail._read_tail(reader, transcript)
            finally:
                writer.transport.abort()

        rig = Rig(path, peer, asyncio.create_task(run()))
        rigs.append(rig)
        return rig

    yield _start
    for rig in rigs:
        rig.task.cancel()
        with contextlib.suppress(BaseException):  # done, cancelled or failed: all fine here
            await rig.task
        rig.peer.close()
    for close in closers:
        close()


def _bell_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("ndjson-bell-")]


async def test_the_bell_wakes_the_tail_at_once(start: Callable[[Tail], Rig]) -> None:
    tail = Tail(poll=3600.0)  # no timed look within the test: only the bell can wake it
    rig = start(tail)
    for i in range(20):  # each a wait, woken by the socket
        rig.write_file(LINE + b"%d" % i)
        rig.ring()
        await until(lambda i=i: len(tail.lines) == i + 1, f"line {i}")
    rig.peer.close()  # EOF: the file is drained to its end and the tail returns
    assert await asyncio.wait_for(rig.task, 10) is True
    assert tail._exact_to_end
    assert tail.lines == [LINE + b"%d" % i for i in range(20)]
    assert _bell_tasks() == []


async def test_a_line_the_socket_never_announces_is_found_by_the_fast_poll(
    start: Callable[[Tail], Rig],
) -> None:
    tail = Tail(poll=0.01)
    rig = start(tail)
    rig.write_file(b"file-only")  # no socket byte: a timed look finds it
    await until(lambda: tail.lines == [b"file-only"], "the polled line")
    rig.ring()  # the socket ahead of the file: the bell rings, the read finds nothing yet ...
    await asyncio.sleep(0)
    rig.write_file(b"late")  # ... and the next timed look finds the line
    await until(lambda: tail.lines == [b"file-only", b"late"], "the late line")
    rig.peer.close()
    assert await asyncio.wait_for(rig.task, 10) is True


async def test_a_partial_line_waits_for_its_end(start: Callable[[Tail], Rig]) -> None:
    tail = Tail(poll=0.01)
    rig = start(tail)
    with rig.path.open("ab") as f:
        f.write(b"half")
    rig.ring()
    rig.write_file(b"")  # the rest of the line: "half\n"
    rig.ring()
    await until(lambda: tail.lines == [b"half"], "the completed line")
    rig.peer.close()
    await asyncio.wait_for(rig.task, 10)
    assert tail.lines == [b"half"]


async def test_lines_written_before_eof_are_all_read(start: Callable[[Tail], Rig]) -> None:
    tail = Tail(poll=3600.0)
    rig = start(tail)
    rig.write_file(*(b"L%d" % i for i in range(500)))
    rig.ring()
    rig.peer.close()
    assert await asyncio.wait_for(rig.task, 10) is True
    assert tail.lines == [b"L%d" % i for i in range(500)]
    assert tail._exact_to_end


async def test_a_backlog_is_read_batch_after_batch_with_a_yield_between(
    start: Callable[[Tail], Rig],
) -> None:
    """While every read finds new lines (here `_take` appends more, as a busy worker would), the
    tail reads on without waiting for a bell, and other tasks still run between two batches."""
    ticks = 0
    seen_ticks: list[int] = []
    rig: Rig | None = None
    more = 50

    def on_take() -> None:
        nonlocal more
        seen_ticks.append(ticks)
        if more and rig is not None:
            more -= 1
            rig.write_file(b"more%d" % more)

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(ticker())
    try:
        tail = Tail(poll=3600.0, on_take=on_take)
        rig = start(tail)
        rig.write_file(b"first")
        rig.ring()
        await until(lambda: len(tail.batches) == 51, "the backlog")
    finally:
        other.cancel()
    assert [len(b) for b in tail.batches] == [1] * 51
    assert tail.lines[1:] == [b"more%d" % i for i in reversed(range(50))]
    # The ticker ran between every two batches.
    assert all(b > a for a, b in itertools.pairwise(seen_ticks))


async def test_cancelling_the_tail_while_it_waits_leaves_nothing_behind(
    start: Callable[[Tail], Rig],
) -> None:
    tail = Tail(poll=3600.0)
    rig = start(tail)
    rig.write_file(b"one")
    rig.ring()
    await until(lambda: tail.lines == [b"one"], "the first line")
    await until(lambda: len(_bell_tasks()) == 1, "the drainer")
    rig.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await rig.task
    assert _bell_tasks() == []
    loop = asyncio.get_running_loop()
    # The wait's timer is cancelled with it (no hour-long poll left on the loop).
    scheduled = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
    assert all(h.when() - loop.time() < 60 for h in scheduled)


class _Grows:
    """A transcript stand-in for `_tail_wait`: counts the timed looks' fstat."""

    def __init__(self) -> None:
        self.looks = 0
        self.grown = False

    def grew(self) -> bool:
        self.looks += 1
        return self.grown


async def test_a_cancellation_as_the_bell_rings_is_not_lost() -> None:
    tail = Tail(poll=3600.0)
    bell = nt._Bell()
    wait = asyncio.create_task(tail._tail_wait(bell, _Grows(), time.monotonic()))  # type: ignore[arg-type]
    await until(lambda: bell.waiter is not None, "the wait")
    bell.ring()  # the waiter is resolved ...
    wait.cancel()  # ... and the task cancelled in the same loop turn: it must still stop
    with pytest.raises(asyncio.CancelledError):
        await wait
    assert bell.waiter is None


async def test_close_stops_the_tail(start: Callable[[Tail], Rig]) -> None:
    tail = Tail(poll=3600.0)
    rig = start(tail)
    rig.write_file(b"one")
    rig.ring()
    await until(lambda: tail.lines == [b"one"], "the first line")
    tail._closing = True
    rig.ring()  # close() aborts the socket; any wake-up will do for the loop to see it
    assert await asyncio.wait_for(rig.task, 10) is True
    assert not tail._exact_to_end


async def test_timed_looks_busy_quiet_and_bell(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_tail_wait`: while busy a timed look returns (the caller reads the file); on a quiet
    stream a timed look that finds the file unchanged (one fstat) waits on, one that finds it
    grown returns the old `busy_at`; a bell returns the time it was heard."""
    monkeypatch.setattr(nt, "TAIL_IDLE_POLL", 0.001)  # quiet looks back off to this, here
    tail = Tail(poll=0.001)
    bell = nt._Bell()
    file = _Grows()
    busy = time.monotonic()
    assert await asyncio.wait_for(tail._tail_wait(bell, file, busy), 10) == busy  # type: ignore[arg-type]
    assert file.looks == 0  # a busy look is the caller's read, no fstat
    quiet = time.monotonic() - nt.TAIL_QUIET_AFTER - 1
    wait = asyncio.create_task(tail._tail_wait(bell, file, quiet))  # type: ignore[arg-type]
    await until(lambda: file.looks >= 5, "quiet timed looks")
    assert not wait.done()  # the file has not grown: it waits on
    file.grown = True
    assert await asyncio.wait_for(wait, 10) == quiet
    file.grown = False
    wait = asyncio.create_task(tail._tail_wait(bell, file, quiet))  # type: ignore[arg-type]
    await until(lambda: bell.waiter is not None, "the wait")
    before = time.monotonic()
    bell.ring()
    assert await asyncio.wait_for(wait, 10) >= before
    assert bell.rung  # the caller clears it before its next read
