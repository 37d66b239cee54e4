"""The fake worker's fault plans behave as documented (prospero.testkit.faults), over real
sockets, and its transcript always holds every line."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from prospero.core.transport import MAX_LINE
from prospero.testkit import scripts
from prospero.testkit.fake_agent import FakeAgentWorker
from prospero.testkit.faults import BadFrames, FaultPlan, SlowReader, periodic_script, wire_lines
from tests.support import short_tmpdir, wait_until


@pytest.fixture
async def tmp() -> AsyncIterator[str]:
    d = short_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def transcript(tmp: str) -> list[bytes]:
    return Path(f"{tmp}/stdout.ndjson").read_bytes().splitlines()


def exists(path: str) -> bool:
    return Path(path).exists()


async def read_all(path: str, limit: int = 4 * MAX_LINE) -> list[bytes]:
    """Dial once, read until EOF or reset."""
    reader, writer = await asyncio.open_unix_connection(path, limit=limit)
    out: list[bytes] = []
    try:
        while True:
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.IncompleteReadError:
                break
            out.append(line.rstrip(b"\n"))
    except (ConnectionResetError, BrokenPipeError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return out


async def start(tmp: str, script: scripts.Script, plan: FaultPlan) -> FakeAgentWorker:
    w = FakeAgentWorker(
        "f1", script, fault_plan=plan, transcript_path=f"{tmp}/stdout.ndjson", linger=0.05
    )
    await w.serve_unix(f"{tmp}/f1.sock")
    return w


async def read_from_the_start(tmp: str, w: FakeAgentWorker, timeout: float) -> list[bytes]:
    """Start the worker paused, dial once, let it play: what that one reader got until EOF."""
    w.start()
    w.pause()
    reading = asyncio.create_task(read_all(f"{tmp}/f1.sock"))
    await wait_until(lambda: w.connections_total == 1, 5)
    w.resume()
    return await asyncio.wait_for(reading, timeout)


async def test_cut_at_and_every_abort_readers_and_transcript_is_complete(tmp: str) -> None:
    script = scripts.long_script(300, per_turn=100)
    plan = FaultPlan(cut_at=(50,), cut_every=120)
    w = await start(tmp, script, plan)
    first = await read_from_the_start(tmp, w, 10)
    assert 0 < len(first) <= 50 and first == w.history[: len(first)]
    await w.wait_finished(10)
    assert w.cuts == 1 + len(w.history) // 120
    assert transcript(tmp) == w.history
    assert w.history == wire_lines(script, plan)
    assert not exists(f"{tmp}/f1.sock")


async def test_refuse_ms_then_listens_again_and_replays(tmp: str) -> None:
    script = periodic_script(40, 4)
    plan = FaultPlan(cut_at=(10,), refuse_ms=150)
    w = await start(tmp, [*script[:20], scripts.sleep(3600)], plan)
    w.start()
    await wait_until(lambda: w.lines_emitted == 20, 5)
    assert w.refused_windows == 1
    with pytest.raises(ConnectionRefusedError):  # the socket file is there, nobody listens
        await asyncio.open_unix_connection(f"{tmp}/f1.sock")
    assert exists(f"{tmp}/f1.sock")

    async def dial() -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            return await asyncio.open_unix_connection(f"{tmp}/f1.sock")
        except ConnectionRefusedError:
            return None

    conn = None

    async def listening() -> bool:
        nonlocal conn
        conn = await dial()
        return conn is not None

    await wait_until(listening, 5, what="listening again")
    assert conn is not None
    reader, writer = conn
    got = [await reader.readline() for _ in range(20)]
    assert [g.rstrip(b"\n") for g in got] == w.history
    writer.close()
    await w.stop()


async def test_refuse_until_exit_ends_the_run_detached(tmp: str) -> None:
    script = scripts.long_script(500, per_turn=250)
    plan = FaultPlan(cut_at=(100,), refuse_until_exit=True)
    w = await start(tmp, script, plan)
    w.start()
    assert await w.wait_finished(10) == 0
    assert w.refused_windows == 1 and w.connections_total == 0
    assert not exists(f"{tmp}/f1.sock")  # unlinked at exit, as always
    assert transcript(tmp) == wire_lines(script)


async def test_slow_reader_loses_oldest_lines_beyond_the_broadcast_depth(tmp: str) -> None:
    script = scripts.long_script(3000, per_turn=3000)
    plan = FaultPlan(slow_readers=(SlowReader(at=200, lines=1500),))
    w = await start(tmp, script, plan)
    got = await read_from_the_start(tmp, w, 20)
    # lines 201..1700 queue up behind a reader that stopped reading (line 200 may still be
    # queued too): all but the 1024 newest are lost
    assert 1500 - 1024 <= w.lines_dropped <= 1501 - 1024
    assert len(got) == len(w.history) - w.lines_dropped
    # what the reader missed is one contiguous block right after line 200 (+ what was in flight)
    k = next(i for i, (a, b) in enumerate(zip(got, w.history, strict=False)) if a != b)
    assert 199 <= k and got == w.history[:k] + w.history[k + w.lines_dropped :]
    assert transcript(tmp) == w.history


async def test_crash_at_exits_non_zero_without_run_end(tmp: str) -> None:
    script = scripts.long_script(100)
    plan = FaultPlan(crash_at=40, crash_code=3)
    w = await start(tmp, script, plan)
    w.start()
    assert await w.wait_finished(10) == 3
    assert len(w.history) == 40 and b"RunEnd" not in b"".join(w.history)
    assert w.history == wire_lines(script, plan)


async def test_bad_frames_are_written_and_kept_in_the_transcript(tmp: str) -> None:
    script = scripts.text_script(10)
    plan = FaultPlan(
        bad_frames=(
            BadFrames(after=0, kind="unknown_type"),
            BadFrames(after=3, kind="malformed", count=2),
            BadFrames(after=6, kind="oversized"),
        )
    )
    w = await start(tmp, script, plan)
    w.start()
    assert await w.wait_finished(10) == 0
    assert w.history == wire_lines(script, plan)
    assert len(w.history) == len(wire_lines(script)) + 4
    assert any(len(line) > MAX_LINE for line in w.history)
    assert transcript(tmp) == w.history
