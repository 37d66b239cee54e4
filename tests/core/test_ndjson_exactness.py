"""NdjsonDriver exactness (issue 9): repeating lines across cuts, the transcript as the source of
truth, a worker that exits before the re-dial or crashes without RunEnd, the cursor committed
with its events, slow-reader holes and visible skips. Real sockets against the fake worker."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from prospero.core.drivers.base import DriverExit, DriverOptions
from prospero.core.drivers.ndjson import NdjsonDriver
from prospero.core.metrics import Metrics
from prospero.core.normalize import normalize_lines
from prospero.core.transport import MAX_LINE
from prospero.testkit import scripts
from prospero.testkit.fake_agent import FakeAgentWorker
from prospero.types.events import (
    AgentFinished,
    CompactKind,
    EventKind,
    FramesSkipped,
    Output,
    StreamGap,
    ToolFinished,
    expand_kind,
)
from prospero.types.model import AgentStatus
from tests.conformance.agent_driver import Recorder
from tests.core.test_ndjson_driver import OPTS, MemoryCursorStore, Rig, advance, running
from tests.support import short_tmpdir, wait_until

SLOW = DriverOptions(include_thinking=False, backoff_base=30, backoff_cap=60, max_failures=8)


@pytest.fixture
async def tmp() -> AsyncIterator[str]:
    d = short_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Agent:
    """A Rig plus the agent's transcript and caliband's view of its status."""

    def __init__(self, tmp: str) -> None:
        self.rig = Rig(tmp)
        self.tmp = tmp
        self.status = AgentStatus.running
        self.driver: NdjsonDriver | None = None

    async def start(
        self, script: scripts.Script, *, transcript: bool = True, **kw: Any
    ) -> FakeAgentWorker:
        def on_exit(code: int) -> None:
            self.status = AgentStatus.done if code == 0 else AgentStatus.failed
            if code == 143:
                self.status = AgentStatus.killed
            if self.driver is not None:
                self.driver.nudge()  # what the FleetManager does on a status change

        path = f"{self.tmp}/stdout.ndjson" if transcript else None
        return await self.rig.start(script, transcript_path=path, on_exit=on_exit, **kw)

    def driver_for(
        self, sink: Any, opts: DriverOptions = OPTS, *, session_dir: bool = True, **kw: Any
    ) -> NdjsonDriver:
        target = self.rig.target()
        target.status = lambda: self.status
        if session_dir:
            target.session_dir = self.tmp
        self.driver = NdjsonDriver(target, sink, opts, Metrics(), **kw)
        return self.driver

    async def stop(self) -> None:
        self.rig.gate.set()
        for t in self.rig._tasks:
            t.cancel()
        if self.rig.worker is not None:
            await self.rig.worker.stop()


@pytest.fixture
async def agent(tmp: str) -> AsyncIterator[Agent]:
    a = Agent(tmp)
    yield a
    await a.stop()


class BatchRecorder(Recorder):
    """A batch sink that takes the resume snapshot with its events (as the FleetManager's
    `_AgentSink` does): `commits` holds (events stored so far, cursor) per call."""

    def __init__(self) -> None:
        super().__init__()
        self.commits: list[tuple[int, bytes]] = []

    async def emit_batch(self, kinds: list[CompactKind], cursor: bytes | None = None) -> None:
        self.events.extend(expand_kind(k) for k in kinds)
        if cursor is not None:
            self.commits.append((len(self.events), cursor))


def periodic_script(n: int, period: int) -> scripts.Script:
    """`n` text deltas repeating with `period` (1 = all identical), then the end of the run."""
    body = [scripts.text_delta(f"p{k % period}") for k in range(n)]
    return [scripts.turn_start(0), *body, scripts.turn_end(0), scripts.run_end(turn_count=1)]


def expected(history: list[bytes]) -> list[EventKind]:
    return normalize_lines(list(history), OPTS)


def settled(driver: NdjsonDriver) -> Any:
    """A wait condition: the driver's position has not moved for 0.2 s and no replay is being
    matched (it took everything the paused worker wrote, possibly losing some: no transcript)."""
    last = [-1, time.monotonic()]

    def cond() -> bool:
        now = time.monotonic()
        if driver.cursor.seen != last[0] or driver.cursor.matching:
            last[0], last[1] = driver.cursor.seen, now
            return False
        return now - last[1] >= 0.2

    return cond


async def cut_at(
    agent: Agent, driver: NdjsonDriver, marks: list[int], detached: int, *, exact: bool = True
) -> None:
    """Cut every connection once the worker has written each mark (the driver caught up),
    with `detached` lines written while the driver is held away."""
    w = agent.rig.worker
    assert w is not None
    for mark in marks:
        await advance(w, mark)
        if exact:
            await wait_until(lambda: driver.cursor.seen == w.lines_emitted, 20, interval=0.002)
        else:
            await wait_until(settled(driver), 20, interval=0.01)
        agent.rig.gate.clear()
        w.cut_connections()
        await wait_until(lambda: driver._writer is None, 10, interval=0.002)
        await advance(w, w.lines_emitted + detached)
        agent.rig.gate.set()
    w.resume()


# ---- repeating lines across the replay window -------------------------------------------------

CUT_PLANS = {"1500+2600": [1500, 2600], "every512": list(range(512, 3000, 512))}


@pytest.mark.parametrize("period", [4, 1], ids=["period4", "identical"])
@pytest.mark.parametrize("plan", list(CUT_PLANS), ids=list(CUT_PLANS))
@pytest.mark.parametrize("late_session_dir", [False, True], ids=["transcript", "late-transcript"])
async def test_repeating_lines_cut_are_exact_with_the_transcript(
    agent: Agent, period: int, plan: str, late_session_dir: bool
) -> None:
    """The issue's measured case: thousands of repeating lines cut across the 1024-line replay
    lose nothing once the transcript is readable, also when `session_dir` is only filled in
    after the first connections (the manager learns it late for an agent it spawned)."""
    w = await agent.start(periodic_script(3000, period), paused=True, line_delay=0.0001)
    rec = BatchRecorder()
    driver = agent.driver_for(rec, session_dir=not late_session_dir)
    async with running(driver) as task:
        marks = CUT_PLANS[plan]
        if late_session_dir:
            await cut_at(agent, driver, marks[:1], 50)
            driver.target.session_dir = agent.tmp
            w.pause()
            marks = marks[1:]
        await cut_at(agent, driver, marks, 300)
        assert await asyncio.wait_for(task, 60) is DriverExit.finished
    assert rec.events == expected(w.history)
    assert driver.tail_connections >= 1


@pytest.mark.parametrize("period", [4, 1], ids=["period4", "identical"])
async def test_repeating_lines_without_transcript_are_never_lost_silently(
    agent: Agent, period: int
) -> None:
    """No transcript here: ambiguous replays are resolved to the longest overlap (never a
    duplicate) and every line possibly lost is covered by an `ambiguous_overlap` gap."""
    w = await agent.start(
        periodic_script(3000, period), transcript=False, paused=True, line_delay=0.0001
    )
    rec = Recorder()
    driver = agent.driver_for(rec, session_dir=False)
    async with running(driver) as task:
        await cut_at(agent, driver, [1500, 2600], 300, exact=False)
        assert await asyncio.wait_for(task, 60) is DriverExit.finished
    want = [e for e in expected(w.history) if isinstance(e, Output)]
    got = [e for e in rec.events if isinstance(e, Output)]
    gaps = [e for e in rec.events if isinstance(e, StreamGap)]
    assert len(got) <= len(want)
    assert gaps and all(g.reason == "ambiguous_overlap" for g in gaps)
    assert len(want) - len(got) <= sum(g.missing or 0 for g in gaps)
    assert isinstance(rec.events[-1], AgentFinished)


# ---- the worker exits before the re-dial ------------------------------------------------------


async def test_worker_exit_before_redial_recovers_the_tail_from_the_transcript(
    agent: Agent,
) -> None:
    """5000 lines cut at 1500; reconnects are refused while the run ends. The driver (with a
    30 s backoff) reads the transcript when the status turns terminal: the whole run, at once."""
    w = await agent.start(scripts.long_script(5000, per_turn=500), paused=True)
    rec = BatchRecorder()
    driver = agent.driver_for(rec, SLOW)
    async with running(driver) as task:
        await advance(w, 1500)
        await wait_until(lambda: driver.cursor.seen == w.lines_emitted, 10)
        agent.rig.fail_resolve = ConnectionRefusedError("the worker is not listening")
        w.cut_connections()
        w.resume()
        await w.wait_finished(30)
        began = time.monotonic()
        assert await asyncio.wait_for(task, 10) is DriverExit.finished
        assert time.monotonic() - began < 5
    assert rec.events == expected(w.history)
    assert "stream_gap" not in rec.kinds()


@pytest.mark.parametrize("transcript", [True, False], ids=["transcript", "no-transcript"])
async def test_crash_without_run_end_concludes_crashed(agent: Agent, transcript: bool) -> None:
    script: scripts.Script = [
        scripts.turn_start(0, model="claude-sonnet-4-6"),
        scripts.text_delta("working"),
        scripts.turn_end(0, input_tokens=7, output_tokens=3),
        scripts.turn_start(1, model="claude-sonnet-4-6"),
        scripts.tool_call_start("tu_1", "Bash", 1),
        scripts.tool_call_input_delta("tu_1", '{"command":"make"}', 1),
        scripts.text_delta("running make", 1),
        scripts.exit_(1),
    ]
    w = await agent.start(script, transcript=transcript)
    rec = BatchRecorder()
    driver = agent.driver_for(rec, SLOW, session_dir=transcript)
    assert await asyncio.wait_for(driver.run(), 15) is DriverExit.finished
    assert driver.finished
    head = expected(w.history)
    if not transcript:
        gap = rec.events[len(head)]
        assert isinstance(gap, StreamGap) and gap.reason == "worker_exited"
        head = [*head, gap]
    assert rec.events[: len(head)] == head
    tail = rec.events[len(head) :]
    assert [e.kind for e in tail] == ["tool_finished", "agent_finished"]
    closed, end = tail
    assert isinstance(closed, ToolFinished) and (closed.id, closed.name) == ("tu_1", "Bash")
    assert not closed.ok
    assert isinstance(end, AgentFinished) and end.outcome == "crashed"
    assert end.detail and "failed" in end.detail
    assert (end.turns, end.model) == (1, "claude-sonnet-4-6")
    assert end.usage is not None and end.usage.input_tokens == 7
    # Concluding is idempotent.
    await driver.conclude("crashed", "again")
    assert len(rec.of("agent_finished")) == 1


async def test_killed_worker_concludes_killed(agent: Agent) -> None:
    w = await agent.start([scripts.turn_start(0), scripts.text_delta("a"), scripts.sleep(3600)])
    rec = BatchRecorder()
    driver = agent.driver_for(rec, SLOW)
    async with running(driver) as task:
        await wait_until(lambda: rec.stdout() == ["a"], 10)
        await w.stop()  # SIGTERM: exit 143, the status turns `killed`
        assert await asyncio.wait_for(task, 10) is DriverExit.finished
    end = rec.events[-1]
    assert isinstance(end, AgentFinished) and end.outcome == "killed"
    assert "stream_gap" not in rec.kinds()


async def test_manager_conclude_after_close_is_a_fallback(agent: Agent) -> None:
    await agent.start([scripts.turn_start(0), scripts.text_delta("a"), scripts.sleep(3600)])
    rec = BatchRecorder()
    driver = agent.driver_for(rec, SLOW, session_dir=False)
    async with running(driver):
        await wait_until(lambda: rec.stdout() == ["a"], 10)
        await driver.conclude("killed", "killed while prosperod was down")
        assert driver.finished
    assert [e.kind for e in rec.events] == ["output", "stream_gap", "agent_finished"]
    end = rec.events[-1]
    assert isinstance(end, AgentFinished) and end.outcome == "killed"
    assert await driver.run() is DriverExit.finished


# ---- the cursor commits with its events -------------------------------------------------------


async def test_cursor_rides_with_every_batch_so_a_crash_repeats_nothing(agent: Agent) -> None:
    """Every batch carries the resume snapshot; a prosperod killed right after any commit
    restarts from exactly the events stored: 0 duplicates, 0 loss."""
    w = await agent.start(scripts.long_script(3000, per_turn=300), paused=True, line_delay=0.0001)
    store = MemoryCursorStore()
    rec = BatchRecorder()
    driver = agent.driver_for(rec, cursor_store=store)
    async with running(driver) as task:
        await cut_at(agent, driver, [900, 2100], 200)
        assert await asyncio.wait_for(task, 60) is DriverExit.finished
    whole = expected(w.history)
    assert rec.events == whole
    assert store.saves == 0  # no separate saver: the cursor only ever travels with its events
    assert len(rec.commits) > 10
    for stored, cursor in rec.commits[:: max(1, len(rec.commits) // 12)]:
        crashed = MemoryCursorStore()
        crashed.data[agent.rig.agent_id] = cursor
        again = BatchRecorder()
        d2 = agent.driver_for(again, cursor_store=crashed)
        # The worker is gone: the rest comes from the transcript, by position.
        assert await asyncio.wait_for(d2.run(), 20) is DriverExit.finished
        assert rec.events[:stored] + again.events == whole


# ---- slow reader ------------------------------------------------------------------------------


class BlockingRecorder(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.open = asyncio.Event()
        self.open.set()

    async def __call__(self, kind: EventKind) -> None:
        await self.open.wait()
        await super().__call__(kind)


def has_chunk(rec: Recorder, prefix: str) -> bool:
    return any(isinstance(e, Output) and e.chunk.startswith(prefix) for e in rec.events)


@pytest.mark.parametrize("transcript", [False, True], ids=["socket", "transcript"])
async def test_slow_reader_drop_then_cut_has_no_duplicate(agent: Agent, transcript: bool) -> None:
    """The worker drops lines for a stalled reader (a hole in what it holds), the reader
    catches up on the newest lines, then the connection is cut: the replay covers the hole.
    Without the transcript: no line twice and a `slow_reader` gap; with it: exact."""
    pad = "x" * 8000  # the reader buffers a few MiB before the worker must drop lines
    n = 1400

    def line(k: int) -> dict[str, Any]:
        return scripts.text_delta(f"{k:05d}{pad}")

    head = [scripts.turn_start(0), *(line(k) for k in range(400))]
    w = await agent.start(
        [*head, scripts.sleep(3600)], transcript=transcript, paused=True, live_queue_size=16
    )
    rec = BlockingRecorder()
    driver = agent.driver_for(rec, session_dir=transcript)
    async with running(driver):
        await advance(w, len(head))
        await wait_until(lambda: driver.cursor.seen == w.lines_emitted, 10)
        rec.open.clear()  # the reader stalls: the worker's queue for it overflows
        for k in range(400, 1300):
            w.emit(line(k))
            await asyncio.sleep(0)
        if not transcript:
            assert w.lines_dropped > 0
        rec.open.set()
        await wait_until(lambda: has_chunk(rec, "01299"), 20, what="the newest line")
        w.cut_connections()
        await wait_until(lambda: driver.connections >= 2 and not driver.cursor.matching, 20)
        for k in range(1300, n):
            w.emit(line(k))
            await wait_until(lambda k=k: has_chunk(rec, f"{k:05d}"), 20)  # no lag now
    chunks = [e.chunk[:5] for e in rec.events if isinstance(e, Output)]
    assert len(chunks) == len(set(chunks)), "a line delivered twice"
    assert chunks == sorted(chunks)
    gaps = [e for e in rec.events if isinstance(e, StreamGap)]
    if transcript:
        assert chunks == [f"{k:05d}" for k in range(n)] and not gaps
    else:
        assert len(chunks) < n
        assert [g.reason for g in gaps] == ["slow_reader"]
        assert gaps[0].missing in (None, n - len(chunks))


# ---- skips are visible ------------------------------------------------------------------------


async def test_skipped_lines_are_visible_in_history(agent: Agent) -> None:
    script: scripts.Script = [
        scripts.turn_start(0),
        scripts.text_delta("before"),
        scripts.raw("x" * (MAX_LINE + 100)),
        scripts.raw("this is not json"),
        scripts.raw("[1, 2]"),
        scripts.raw('{"type":"FromTheFuture"}'),
        scripts.text_delta("after"),
        scripts.run_end(turn_count=1),
    ]
    w = await agent.start(script, transcript=False, paused=True)
    rec = BatchRecorder()
    driver = agent.driver_for(rec, session_dir=False)
    async with running(driver) as task:
        w.resume()
        assert await asyncio.wait_for(task, 20) is DriverExit.finished
    skipped: dict[str, int] = {}
    for e in rec.events:
        if isinstance(e, FramesSkipped):
            skipped[e.reason] = skipped.get(e.reason, 0) + e.count
    assert skipped == {"oversized": 1, "malformed": 2, "unknown_type": 1}
    assert rec.stdout() == ["before", "after"]
    assert rec.kinds()[-1] == "agent_finished"
    assert orjson.loads(FramesSkipped(count=2, reason="malformed").model_dump_json()) == {
        "kind": "frames_skipped",
        "count": 2,
        "reason": "malformed",
    }


async def test_transcript_found_mid_connection_takes_over(agent: Agent) -> None:
    """`session_dir` is filled in while the first connection streams (the manager learns it
    from a later poll): the same connection switches to the transcript, exactly."""
    w = await agent.start(scripts.long_script(2000, per_turn=500), paused=True, line_delay=0.0005)
    rec = BatchRecorder()
    driver = agent.driver_for(rec, session_dir=False)
    async with running(driver) as task:
        await advance(w, 600)
        await wait_until(lambda: driver.cursor.seen == w.lines_emitted, 10)
        driver.target.session_dir = agent.tmp
        w.resume()
        assert await asyncio.wait_for(task, 30) is DriverExit.finished
    assert rec.events == expected(w.history)
    assert (driver.connections, driver.tail_connections) == (1, 1)
    assert driver.transcript_lines > 0
