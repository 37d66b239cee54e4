"""Replay benchmark: a stored history read back over the real HTTP stack (Runtime + uvicorn on
127.0.0.1), against a ceiling measured in the same run on the same rows: SQLite read + JSON
parse + dump (`SELECT ... ORDER BY seq` on its own connection, `orjson.loads` of each stored
kind, `orjson.dumps` of the whole event), no Prospero, no HTTP.

    uv run python bench/replay.py [--events 100000] [--reps 3]

Paths, each in events per second received by a raw-socket client (it counts frames and
bodies, it does not parse them; the content is checked once, outside the timings):

- `sse_agent`: `GET /api/agents/{id}/stream` from the first event to the end of the stream
  (the history ends with `agent_finished`, so the stream closes);
- `sse_fleet`: `GET /api/stream` until the last frame of the history arrived;
- `rest_1000`, `rest_10000`: `GET /api/agents/{id}/events?from=..&limit=..` page by page on
  one keep-alive connection.

Each figure is the median of `--reps` runs with [min-max], and its ratio to the ceiling's
median. To compare with an older tree, run the same script with `PYTHONPATH=<tree>/src`.
The last line is exactly `replay sse_agent=<ratio> sse_fleet=<ratio> rest_1000=<ratio>
rest_10000=<ratio> target=0.5`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from prospero.api.app import create_app
from prospero.api.server import ApiServer
from prospero.api.settings import ApiSettings
from prospero.core.store.sqlite.events import SqliteEventStore
from prospero.daemon.runtime import DaemonConfig, Runtime
from prospero.types.events import (
    AgentFinished,
    EventKind,
    FleetEvent,
    Output,
    ToolFinished,
    ToolResult,
    ToolStarted,
    TurnFinished,
    Usage,
)

AGENT = "a0"
TARGET = 0.5


def kind_for(i: int) -> EventKind:
    """A realistic mix: mostly short output chunks, a tool call and a turn end now and then."""
    r = i % 50
    if r == 47:
        return ToolStarted(id=f"t{i}", name="Read", input={"path": f"src/file_{i}.py"})
    if r == 48:
        return ToolFinished(id=f"t{i - 1}", ok=True, result=ToolResult(text="contents\n" * 3))
    if r == 49:
        return TurnFinished(
            turn=i // 50, stop_reason="EndOfTurn", usage=Usage(input_tokens=9, output_tokens=40)
        )
    return Output(chunk=f"word {i} of the agent's answer, with some “quotes” and text\n")


async def build(db: Path, n: int) -> None:
    store = SqliteEventStore(db)
    await store.open()
    try:
        batch: list[FleetEvent] = []
        for seq in range(1, n + 1):
            kind = kind_for(seq) if seq < n else AgentFinished(outcome="EndOfTurn", turns=1)
            ts = f"2026-11-30T00:{(seq // 6000) % 60:02d}:{(seq // 100) % 60:02d}.{seq:06d}+00:00"
            batch.append(FleetEvent(seq=seq, ts=ts, repo="ws", agent_id=AGENT, kind=kind))
            if len(batch) == 5000:
                await store.append_batch(batch)
                batch = []
        if batch:
            await store.append_batch(batch)
    finally:
        await store.close()


def ceiling(db: Path) -> float:
    """SQLite read + JSON parse + dump of the same rows, ev/s. Streamed (the rows and their
    dumps are not all kept: at 1M events, holding them made the collector, not the work,
    dominate the ceiling)."""
    conn = sqlite3.connect(db)
    try:
        t0 = time.perf_counter()
        rows = conn.execute(
            "SELECT seq, ts, repo, agent_id, kind FROM events WHERE stream_key = ? ORDER BY seq",
            (AGENT,),
        )
        loads, dumps = orjson.loads, orjson.dumps
        n = size = 0
        while batch := rows.fetchmany(5000):
            for s, t, r, a, k in batch:
                size += len(dumps({"seq": s, "ts": t, "repo": r, "agent_id": a, "kind": loads(k)}))
            n += len(batch)
        dt = time.perf_counter() - t0
    finally:
        conn.close()
    assert size > 0
    return n / dt


# ------------------------------------------------------------------------ raw HTTP client


async def _request(port: int, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return reader, writer


async def _head(reader: asyncio.StreamReader) -> dict[str, str]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert " 200 " in lines[0], lines[0]
    return {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}


async def sse(port: int, path: str, want: int, keep: list[bytes] | None = None) -> float:
    """Seconds from the request to the `want`-th frame (a chunked body; frames counted by
    their blank-line terminator, across chunk boundaries)."""
    t0 = time.perf_counter()
    reader, writer = await _request(port, path)
    try:
        headers = await _head(reader)
        assert headers.get("transfer-encoding") == "chunked", headers
        frames = 0
        prev_nl = False
        while frames < want:
            size_line = await reader.readline()
            size = int(size_line.strip() or b"0", 16)
            if size == 0:
                break
            data = await reader.readexactly(size + 2)
            data = data[:-2]
            if keep is not None:
                keep.append(data)
            frames += data.count(b"\n\n") + (1 if prev_nl and data[:1] == b"\n" else 0)
            prev_nl = data[-1:] == b"\n"
        dt = time.perf_counter() - t0
        assert frames >= want, (frames, want)
        return dt
    finally:
        writer.close()


async def rest(port: int, n: int, limit: int, keep: list[bytes] | None = None) -> float:
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
    try:
        start = 1
        while start <= n:
            writer.write(
                f"GET /api/agents/{AGENT}/events?from={start}&limit={limit} HTTP/1.1\r\n"
                f"Host: 127.0.0.1:{port}\r\n\r\n".encode()
            )
            headers = await _head(reader)
            body = await reader.readexactly(int(headers["content-length"]))
            if keep is not None:
                keep.append(body)
            start += limit
        return time.perf_counter() - t0
    finally:
        writer.close()


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs) / 1e3:.1f}k [{min(xs) / 1e3:.1f}-{max(xs) / 1e3:.1f}k]"


def check(n: int, sse_agent: list[bytes], sse_fleet: list[bytes], pages: list[bytes]) -> None:
    """The content, once: every event exactly once, in order, as the store's JSON."""

    def frames(chunks: list[bytes]) -> list[dict[str, Any]]:
        out = []
        for frame in b"".join(chunks).split(b"\n\n"):
            for line in frame.split(b"\n"):
                if line.startswith(b"data: "):
                    out.append(orjson.loads(line[6:]))
        return out

    want = list(range(1, n + 1))
    assert [e["seq"] for e in frames(sse_agent)] == want
    assert [e["seq"] for e in frames(sse_fleet)][:n] == want
    assert [e["seq"] for p in pages for e in orjson.loads(p)] == want


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    n, reps = args.events, args.reps
    tmp = Path(tempfile.mkdtemp(prefix="pspo-replay-", dir="/tmp"))
    os.environ["CALIBAN_DAEMON_RUNTIME_DIR"] = str(tmp / "run")
    (tmp / "run").mkdir()
    try:
        data = tmp / "data"
        data.mkdir()
        db = data / "events.db"
        await build(db, n)
        cfg = DaemonConfig(bind_host="127.0.0.1", port=0, data_dir=data, autostart=False)
        runtime = Runtime(cfg)
        await runtime.start()
        server = ApiServer(create_app(runtime, ApiSettings()), "127.0.0.1", 0, graceful_timeout=3)
        await server.start()
        port = server.port
        try:
            seen: tuple[list[bytes], list[bytes], list[bytes]] = ([], [], [])
            await sse(port, f"/api/agents/{AGENT}/stream", n, seen[0])  # warm-up + check
            await sse(port, "/api/stream", n, seen[1])
            await rest(port, n, 1000, seen[2])
            check(n, *seen)
            del seen  # 1M frames kept alive would weigh on the timed runs
            results: dict[str, list[float]] = {
                k: [] for k in ("ceiling", "sse_agent", "sse_fleet", "rest_1000", "rest_10000")
            }
            for _ in range(reps):
                # On the loop's thread (nothing else runs meanwhile): no thread hand-off.
                results["ceiling"].append(ceiling(db))
                print(f"rep {len(results['ceiling'])}/{reps}", file=sys.stderr, flush=True)
                results["sse_agent"].append(n / await sse(port, f"/api/agents/{AGENT}/stream", n))
                results["sse_fleet"].append(n / await sse(port, "/api/stream", n))
                results["rest_1000"].append(n / await rest(port, n, 1000))
                results["rest_10000"].append(n / await rest(port, n, 10000))
        finally:
            await server.stop()
            await runtime.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load = Path("/proc/loadavg").read_text().split()[:3]  # noqa: ASYNC240
    ceil = statistics.median(results["ceiling"])
    print(f"history {n} events, {reps} reps, loadavg {' '.join(load)}, cpus {os.cpu_count()}")
    print(f"  ceiling (SQLite read + JSON parse + dump): {fmt(results['ceiling'])} ev/s")
    ratios = {}
    for key in ("sse_agent", "sse_fleet", "rest_1000", "rest_10000"):
        xs = results[key]
        ratios[key] = statistics.median(xs) / ceil
        print(
            f"  {key:<11} {fmt(xs)} ev/s  ratio {ratios[key]:.3f} "
            f"[{min(xs) / ceil:.3f}-{max(xs) / ceil:.3f}]"
        )
    print("replay " + " ".join(f"{k}={v:.3f}" for k, v in ratios.items()) + f" target={TARGET}")
    sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
