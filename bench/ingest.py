"""Ingest benchmark: N fake agents stream TurnEvents through real Unix sockets into
FleetManager + NdjsonDriver + Emitter + SQLite, against a raw ceiling measured in the same run
on the same lines (read the same sockets, orjson parse, batched SQLite insert, no Prospero).

    uv run python bench/ingest.py [--agents 200] [--lines 1000] [--reps 3]

Both figures count TurnEvent lines consumed per second. Each repetition measures the ceiling,
then Prospero (a fresh manager and store), on the same agents (interactive workers replay their
whole run to every connection); each repetition's ratio is printed, then the median with
[min-max]. The last line is exactly `ingest events_per_s=<E> ceiling_per_s=<C> ratio=<E/C>`
(the medians over repetitions; `ratio` is the median of the per-repetition ratios).
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

from prospero.core.bus import InProcessBus
from prospero.core.discovery import socket_path_for
from prospero.core.drivers.base import DriverOptions
from prospero.core.emitter import Emitter
from prospero.core.fleet.local import LocalFleet, LocalFleetConfig
from prospero.core.fleet.manager import FleetConfig, FleetManager, default_driver_factories
from prospero.core.metrics import Metrics
from prospero.core.normalize import Normalizer
from prospero.core.store.sqlite.events import SqliteConfigStore, SqliteEventStore
from prospero.core.transport import open_endpoint, read_line
from prospero.core.wire.control import UnixEndpoint
from prospero.testkit import scripts
from prospero.testkit.fake_caliband import FakeCaliband


def agent_script(agent: int, lines: int) -> list[dict[str, Any]]:
    """A realistic mix: thinking, text, a tool call with streamed input and a result, usage."""
    out: list[dict[str, Any]] = []
    turn = 0
    while len(out) < lines - 1:
        out.append(scripts.turn_start(turn, model="claude-sonnet-4-6"))
        for i in range(3):
            out.append(scripts.thinking_delta(f"a{agent} t{turn} think {i}", turn, 0))
        for i in range(30):
            out.append(scripts.text_delta(f"a{agent} t{turn} word {i} ", turn, 1))
        tid = f"toolu_{agent}_{turn}"
        out.append(scripts.tool_call_start(tid, "Read", turn))
        out.append(scripts.tool_call_input_delta(tid, '{"path":', turn))
        out.append(scripts.tool_call_input_delta(tid, f'"src/file_{turn}.py"}}', turn))
        out.append(scripts.tool_call_end(tid, f"contents of file {turn}\n" * 3, turn_index=turn))
        out.append(scripts.turn_end(turn, content=[scripts.text_block("done")], output_tokens=40))
        turn += 1
    out = out[: lines - 1]
    out.append(scripts.run_end("EndOfTurn", turn_count=turn))
    return out


def expected_events(script: list[dict[str, Any]]) -> int:
    n = Normalizer(DriverOptions(include_thinking=True), Metrics())
    # The RunEnd is withheld (interactive), so anything still held back stays unemitted.
    return sum(len(n.feed(orjson.dumps(f))) for f in script[:-1])


async def ceiling(endpoints: list[UnixEndpoint], per_agent: int, db: Path) -> float:
    conn = sqlite3.connect(db, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(
        "CREATE TABLE lines(ordinal INTEGER PRIMARY KEY, stream_key TEXT, seq INTEGER, ts TEXT,"
        " body TEXT, UNIQUE(stream_key, seq))"
    )
    queue: asyncio.Queue[list[tuple[str, int, str, str]] | None] = asyncio.Queue()

    def insert(batch: list[tuple[str, int, str, str]]) -> None:
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO lines(stream_key, seq, ts, body) VALUES (?,?,?,?)", batch)
        conn.execute("COMMIT")

    async def writer() -> None:
        while (first := await queue.get()) is not None:
            batch = first
            while not queue.empty() and len(batch) < 1000:
                nxt = queue.get_nowait()
                if nxt is None:
                    await asyncio.to_thread(insert, batch)
                    return
                batch.extend(nxt)
            await asyncio.to_thread(insert, batch)

    async def reader(ep: UnixEndpoint, key: str) -> None:
        r, w = await open_endpoint(ep)
        buf: list[tuple[str, int, str, str]] = []
        for seq in range(1, per_agent + 1):
            line = await read_line(r)
            assert line is not None
            obj = orjson.loads(line)
            buf.append((key, seq, "2026-11-29T00:00:00.000000+00:00", orjson.dumps(obj).decode()))
            if len(buf) >= 100:
                queue.put_nowait(buf)
                buf = []
        if buf:
            queue.put_nowait(buf)
        w.close()

    t0 = time.perf_counter()
    wtask = asyncio.create_task(writer())
    await asyncio.gather(*(reader(ep, f"a{i}") for i, ep in enumerate(endpoints)))
    queue.put_nowait(None)
    await wtask
    elapsed = time.perf_counter() - t0
    (total,) = conn.execute("SELECT count(*) FROM lines").fetchone()
    conn.close()
    assert total == per_agent * len(endpoints), total
    return total / elapsed


async def prospero(root: str, n_agents: int, per_agent: int, want_events: int, db: Path) -> float:
    metrics = Metrics()
    store = SqliteEventStore(db)
    await store.open()
    cstore = SqliteConfigStore(db)
    await cstore.open()
    emitter = Emitter(store, InProcessBus(), metrics)
    await emitter.start()
    manager = FleetManager(
        LocalFleet(LocalFleetConfig(autostart=False)),
        cstore,
        store,
        emitter,
        metrics,
        FleetConfig(poll_interval=3600, include_thinking=True),
        driver_factories=default_driver_factories(),
    )
    await manager.start(poll=False)
    t0 = time.perf_counter()
    await manager.add_workspace("bench", root)  # one poll: discovers and attaches every agent
    while metrics.get("events_appended") < want_events:
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - t0
    await manager.stop()
    await emitter.close()
    await cstore.close()
    await store.close()
    return n_agents * per_agent / elapsed


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--agents", type=int, default=200)
    ap.add_argument("--lines", type=int, default=1000, help="lines per agent (<= 1024)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (median, min-max)")
    args = ap.parse_args()
    if args.reps < 1:
        sys.exit("--reps must be >= 1")
    if not 2 <= args.lines <= 1024:
        sys.exit("--lines must be within 2..1024 so each agent's replay holds its whole run")
    tmp = Path(tempfile.mkdtemp(prefix="pr-bench-", dir="/tmp"))
    os.environ["CALIBAN_DAEMON_RUNTIME_DIR"] = str(tmp / "rt")
    root = tmp / "ws"
    root.mkdir()
    sock = socket_path_for(str(root.resolve()))
    Path(sock).parent.mkdir(parents=True, exist_ok=True)
    fake = await FakeCaliband.start_unix(sock, root=str(root.resolve()))
    try:
        want = 0
        endpoints: list[UnixEndpoint] = []
        workers = []
        for i in range(args.agents):
            script = agent_script(i, args.lines)
            want += expected_events(script) + 1  # + agent_discovered
            # interactive: the worker holds its RunEnd until input, so every line stays
            # replayable and both measurements read exactly the same lines.
            rec = await fake.add_agent(script=script, interactive=True)
            assert isinstance(rec.endpoint, UnixEndpoint)
            endpoints.append(rec.endpoint)
            workers.append(fake.workers[rec.id])
        per_agent = args.lines - 1
        while any(w.lines_emitted < per_agent for w in workers):
            await asyncio.sleep(0.05)
        lines = per_agent * args.agents
        print(f"setup: {args.agents} agents x {per_agent} lines = {lines} TurnEvents", flush=True)
        cs: list[float] = []
        es: list[float] = []
        ratios: list[float] = []
        for r in range(1, args.reps + 1):
            c = await ceiling(endpoints, per_agent, tmp / f"ceiling{r}.db")
            print(f"rep {r} ceiling: {c:,.0f} lines/s (read + orjson + batched sqlite insert)")
            db = tmp / f"events{r}.db"
            e = await prospero(str(root.resolve()), args.agents, per_agent, want, db)
            print(f"rep {r} prospero: {e:,.0f} lines/s -> {want} events stored")
            print(f"rep {r} ratio {e / c:.3f}  (loadavg {_loadavg()})", flush=True)
            cs.append(c)
            es.append(e)
            ratios.append(e / c)
        med = statistics.median
        print(f"ratio median {med(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")
        print(
            f"ingest events_per_s={med(es):.0f} ceiling_per_s={med(cs):.0f} ratio={med(ratios):.3f}"
        )
    finally:
        await fake.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
