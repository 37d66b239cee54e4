"""Live fan-out benchmark: worker-written frame -> SSE byte received, against a raw reader on
each worker socket measured in the same run. Not a test.

    uv run python bench/fanout.py [--agents 50] [--watchers 50] [--rate 5000]
                                  [--reps 3] [--window 4] [--stream agent|fleet]
                                  [--curve 1,10,50,200] [--profile out.prof] [--split]
                                  [--slow 1]

Layout (2 processes, like production): a real prosperod (Runtime + uvicorn with the daemon's
h11 protocol and full middleware chain, `prospero.daemon.main.serve`) runs in a child process;
this process hosts the fake caliband (`prospero.testkit`) and its `--agents` workers, the
paced producer, one raw reader per worker socket (the ceiling: the same socket prosperod
reads, read by a bare asyncio client) and `--watchers` SSE clients on
`/api/agents/{id}/stream` (round-robin over the agents) or `/api/stream` (`--stream fleet`).

The producer writes `--rate` AssistantTextDelta frames per second in aggregate, round-robin
over the agents; each frame's text carries a unique marker whose write time (the moment the
worker is told to write it) is remembered. Raw readers and SSE clients parse markers with the
same code on the same event loop, stamping each socket read once, so both latencies include
the same harness overhead; the SSE one adds prosperod (driver, normaliser, emitter commit,
bus, follower, SSE encoding, middleware, h11, the socket).

After a warm-up (every watcher has seen a live frame) the run is cut into `--reps` windows of
`--window` seconds; a frame belongs to the window it was written in. Per window: p50/p99 of
both latencies, and the ratios raw/SSE (the issue's convention: >= 0.5 means "within 2x").
Printed: each window, then the median with [min-max] over windows, prosperod's CPU %, this
process's CPU %, loadavg, gaps received and frames lost/duplicated (must be 0: gaps heal from
the store). The last line of a single point is
`fanout watchers=W rate=R sse_p50_ms=.. sse_p99_ms=.. raw_p50_ms=.. raw_p99_ms=.. ratio_p99=..`.

`--curve 1,10,50,200` runs one fresh stack per watcher count and prints a table (the cost
curve). `--slow N` ("a slow watcher never delays the others") runs the point twice on fresh
stacks: as usual, then with N more SSE watchers on the fleet stream (every frame: its socket
fills within seconds) that connect with a tiny receive buffer and never read a byte; it
prints the others' p99 both ways and `slow_ratio_p99` = p99 without / p99 with (>= 0.5: within
2x; ~1: unchanged). After the windows the slow watchers read again: prosperod's `bus_lagged`
(> 0: they lagged, as they must, instead of being buffered) and their lost/duplicated frames
(0: healed from the store) are printed too.

`--profile PATH` runs prosperod under cProfile, enabled only during the measurement
windows (the latencies of that run are inflated by the profiler: take the numbers from a run
without it), and prints the top entries.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARKER = re.compile(rb'"m(\d+)\.')
READ_SIZE = 256 * 1024
STARTUP_TIMEOUT = 60.0
WARMUP_TIMEOUT = 60.0
DRAIN_TIMEOUT = 15.0
SLOW_RCVBUF = 4096  # bytes: the --slow watchers' socket receive buffer
TICK = 0.001  # producer pacing step (s)
POLL = 0.05


# ------------------------------------------------------------------------------ the child


def child_main(argv: list[str]) -> None:
    """prosperod in this process: `serve()` with a DaemonConfig, the URL printed on stdout;
    with --profile, cProfile between SIGUSR1 and SIGUSR2, dumped at exit."""
    import cProfile

    from prospero.core.bus import BusItem
    from prospero.daemon.main import serve, setup_logging, tune_gc
    from prospero.daemon.runtime import DaemonConfig, Runtime

    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--profile")
    ap.add_argument("--switch-interval", type=float)
    ap.add_argument("--split", help="write marker -> bus publish time (ns) as JSON here")
    a = ap.parse_args(argv)
    if a.switch_interval:
        sys.setswitchinterval(a.switch_interval)
    setup_logging("text", "warning")
    tune_gc()  # as prosperod's main() does
    prof = cProfile.Profile() if a.profile else None

    async def on_ready(server: Any) -> None:
        loop = asyncio.get_running_loop()
        if prof is not None:
            loop.add_signal_handler(signal.SIGUSR1, prof.enable)
            loop.add_signal_handler(signal.SIGUSR2, prof.disable)
        print(f"URL {server.url}", flush=True)

    config = DaemonConfig(bind_host="127.0.0.1", port=0, data_dir=Path(a.data_dir), autostart=False)
    runtime = Runtime(config)
    published: dict[int, int] = {}
    if a.split:
        # Stamp each marker when the emitter hands it to the bus (after its commit): the clock
        # (CLOCK_MONOTONIC) is the harness's, so write -> publish -> SSE byte splits in two.
        bus_publish = runtime.bus.publish
        marker = re.compile(r"m(\d+)\.")

        def publish(item: BusItem) -> None:
            chunk = getattr(item.event.kind, "chunk", None)
            if chunk is not None and (m := marker.match(chunk)) is not None:
                published.setdefault(int(m.group(1)), time.perf_counter_ns())
            bus_publish(item)

        runtime.bus.publish = publish  # type: ignore[method-assign,unused-ignore]
    code = asyncio.run(serve(config, runtime=runtime, on_ready=on_ready))
    if a.split:
        Path(a.split).write_text(json.dumps(published))
    if prof is not None:
        prof.disable()
        prof.dump_stats(a.profile)
    sys.exit(code)


# ------------------------------------------------------------------------------ the harness


def now_ns() -> int:
    return time.perf_counter_ns()


@dataclass
class Clock:
    """Write time of every marker (index = marker)."""

    written: list[int] = field(default_factory=list)


class Sink:
    """One reader (raw or SSE): latencies of the markers it received, by marker."""

    def __init__(self, clock: Clock, name: str) -> None:
        self.clock = clock
        self.name = name
        self.latency: dict[int, int] = {}  # marker -> ns (first receipt)
        self.duplicates = 0
        self.gaps = 0
        self.messages = 0  # SSE `data:` lines (raw: lines)
        self.bytes = 0
        self._tail = b""

    def feed(self, data: bytes) -> None:
        t = now_ns()
        self.bytes += len(data)
        buf = self._tail + data
        cut = buf.rfind(b"\n")
        if cut < 0:
            self._tail = buf
            return
        body, self._tail = buf[: cut + 1], buf[cut + 1 :]
        self.messages += body.count(b"data:") or body.count(b"\n")
        if b"event: gap" in body:
            self.gaps += body.count(b"event: gap")
        written = self.clock.written
        lat = self.latency
        for m in MARKER.finditer(body):
            idx = int(m.group(1))
            if idx in lat:
                self.duplicates += 1
            else:
                lat[idx] = t - written[idx]


async def raw_reader(path: str, sink: Sink) -> None:
    r, w = await asyncio.open_unix_connection(path, limit=READ_SIZE)
    try:
        while data := await r.read(READ_SIZE):
            sink.feed(data)
    finally:
        w.close()


async def sse_reader(port: int, target: str, sink: Sink, ready: asyncio.Event) -> None:
    r, w = await asyncio.open_connection("127.0.0.1", port, limit=READ_SIZE)
    try:
        w.write(
            f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        await w.drain()
        head = await r.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"SSE {target}: {head[:200]!r}")
        ready.set()
        while data := await r.read(READ_SIZE):
            sink.feed(data)
    finally:
        w.close()


async def slow_reader(
    port: int, target: str, sink: Sink, ready: asyncio.Event, resume: asyncio.Event
) -> None:
    """An SSE client that reads the response head and then nothing until `resume` (a tiny
    receive buffer, so the server's socket fills up quickly and prosperod's writes to it
    block); then it reads everything, like `sse_reader`, to check it healed from the store."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RCVBUF)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    r, w = await asyncio.open_connection(sock=sock, limit=READ_SIZE)
    try:
        w.write(
            f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        await w.drain()
        head = await r.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"SSE {target}: {head[:200]!r}")
        transport: Any = w.transport
        transport.pause_reading()  # read nothing more for now
        ready.set()
        await resume.wait()
        transport.resume_reading()
        while data := await r.read(READ_SIZE):
            sink.feed(data)
    finally:
        w.close()


def cpu_ticks(pid: int, tid: int | None = None) -> int:
    """utime + stime of a process (or of one of its threads) in clock ticks."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def pct(values: list[int], q: float) -> float:
    """q-quantile (0..1) in ms, nearest-rank."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))
    return s[k] / 1e6


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


@dataclass
class Window:
    lo: int  # first marker written in the window
    hi: int  # one past the last
    seconds: float
    child_cpu: float
    loop_cpu: float  # prosperod's main (event loop) thread alone
    self_cpu: float


@dataclass
class Point:
    watchers: int
    rate: int
    rows: list[dict[str, float]]
    gaps: int
    lost: int
    duplicates: int
    raw_lost: int
    load_before: str
    load_after: str
    slow: int = 0
    bus_lagged: float = 0.0
    slow_lost: int = 0  # frames the slow watchers never got once they read again
    slow_duplicates: int = 0


def read_stamps(path: str) -> dict[int, int]:
    with open(path) as f:
        return {int(k): v for k, v in json.load(f).items()}


def _log_file(path: Path) -> Any:
    return open(path, "wb")  # the child's stderr; closed here once the child holds it


async def spawn_child(
    tmp: Path, profile: str | None, switch_interval: float | None, split: str | None
) -> tuple[asyncio.subprocess.Process, int]:
    args = [sys.executable, __file__, "--child", "--data-dir", str(tmp / "data")]
    if profile:
        args += ["--profile", profile]
    if switch_interval:
        args += ["--switch-interval", str(switch_interval)]
    if split:
        args += ["--split", split]
    err = _log_file(tmp / "prosperod.log")
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=err, env=dict(os.environ)
    )
    err.close()
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), STARTUP_TIMEOUT)
    except TimeoutError:
        line = b""
    if not line.startswith(b"URL "):
        proc.kill()
        log = (tmp / "prosperod.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"prosperod did not start: {line!r}\n{log}")
    port = int(line.decode().strip().rsplit(":", 1)[1])
    return proc, port


async def run_point(
    args: argparse.Namespace, watchers: int, profile: str | None, slow: int = 0
) -> Point:
    import httpx

    from prospero.core.discovery import socket_path_for
    from prospero.core.sources import canonical_root
    from prospero.core.wire.control import UnixEndpoint
    from prospero.testkit import scripts
    from prospero.testkit.fake_caliband import FakeCaliband

    tmp = Path(tempfile.mkdtemp(prefix="pr-fan-", dir="/tmp"))
    os.environ["CALIBAN_DAEMON_RUNTIME_DIR"] = str(tmp / "rt")
    root = tmp / "ws"
    root.mkdir()
    canon = canonical_root(str(root))
    sock = socket_path_for(canon)
    Path(sock).parent.mkdir(parents=True, exist_ok=True)
    fake = await FakeCaliband.start_unix(sock, root=canon)
    proc: asyncio.subprocess.Process | None = None
    tasks: list[asyncio.Task[None]] = []
    clock = Clock()
    try:
        workers = []
        endpoints: list[str] = []
        ids: list[str] = []
        for _ in range(args.agents):
            # No RunEnd: the agent stays running; the producer writes its live frames.
            rec = await fake.add_agent(script=[scripts.turn_start(0)])
            assert isinstance(rec.endpoint, UnixEndpoint)
            ids.append(rec.id)
            endpoints.append(rec.endpoint.path)
            workers.append(fake.workers[rec.id])
        split = str(tmp / "published.json") if args.split else None
        proc, port = await spawn_child(tmp, profile, args.switch_interval, split)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            r = await http.post("/api/workspaces", json={"name": "bench", "root": str(root)})
            assert r.status_code in (200, 201), r.text

        raw = [Sink(clock, f"raw-{i}") for i in range(args.agents)]
        tasks += [
            asyncio.create_task(raw_reader(p, s)) for p, s in zip(endpoints, raw, strict=True)
        ]
        sse: list[Sink] = []
        watched: list[int] = []  # agent index per watcher (-1: fleet)
        for i in range(watchers):
            ready = asyncio.Event()
            if args.stream == "fleet":
                target, agent = "/api/stream", -1
            else:
                agent = i % args.agents
                target = f"/api/agents/{ids[agent]}/stream"
            s = Sink(clock, f"sse-{i}")
            sse.append(s)
            watched.append(agent)
            tasks.append(asyncio.create_task(sse_reader(port, target, s, ready)))
            await asyncio.wait_for(ready.wait(), STARTUP_TIMEOUT)
        slow_sinks = [Sink(clock, f"slow-{i}") for i in range(slow)]
        resume = asyncio.Event()
        for s in slow_sinks:
            ready = asyncio.Event()
            # The fleet stream: every frame (~1 MB/s at 5k frames/s) fills its socket quickly.
            tasks.append(asyncio.create_task(slow_reader(port, "/api/stream", s, ready, resume)))
            await asyncio.wait_for(ready.wait(), STARTUP_TIMEOUT)

        # agent_discovered + turn_started (read from the worker) per agent: prosperod drives it.
        need = 2 * args.agents if args.stream == "fleet" else 2

        async def attached() -> None:
            while not all(s.messages >= need for s in sse) or not all(s.messages for s in raw):
                await asyncio.sleep(POLL)

        try:
            await asyncio.wait_for(attached(), WARMUP_TIMEOUT)
        except TimeoutError:
            log = (tmp / "prosperod.log").read_text(errors="replace")[-3000:]
            short = [s.name for s in sse if s.messages < need] + [
                s.name for s in raw if not s.messages
            ]
            raise RuntimeError(
                f"not attached after {WARMUP_TIMEOUT}s: {short[:10]}\n{log}"
            ) from None

        stop = False
        written = clock.written
        n_agents = len(workers)
        agent_of: list[int] = []  # marker -> agent index

        async def produce() -> None:
            rate = args.rate
            t0 = time.perf_counter()
            n = 0
            while not stop:
                due = int((time.perf_counter() - t0) * rate) - n
                for _ in range(due):
                    a = n % n_agents
                    agent_of.append(a)
                    written.append(now_ns())
                    workers[a].emit(scripts.text_delta(f"m{n}.", 0, 0))
                    n += 1
                await asyncio.sleep(TICK)

        producer = asyncio.create_task(produce())
        tasks.append(producer)

        async def settled() -> None:  # every watcher and raw reader sees live frames
            while not (all(s.latency for s in sse) and all(s.latency for s in raw)):
                for t in tasks:
                    if t.done() and t.exception() is not None:
                        raise RuntimeError(f"reader failed: {t.exception()!r}")
                await asyncio.sleep(POLL)

        t_settle = time.perf_counter()
        await asyncio.wait_for(settled(), WARMUP_TIMEOUT)
        print(
            f"  setup: {args.agents} agents attached, {watchers} watchers live after "
            f"{time.perf_counter() - t_settle:.2f}s of traffic",
            flush=True,
        )
        await asyncio.sleep(args.warmup)

        load_before = loadavg()
        if profile:
            os.kill(proc.pid, signal.SIGUSR1)
        windows: list[Window] = []
        for _ in range(args.reps):
            lo, c0, s0, t0 = len(written), cpu_ticks(proc.pid), self_cpu(), time.perf_counter()
            m0 = cpu_ticks(proc.pid, proc.pid)
            await asyncio.sleep(args.window)
            dt = time.perf_counter() - t0
            tick = os.sysconf("SC_CLK_TCK")
            windows.append(
                Window(
                    lo,
                    len(written),
                    dt,
                    100.0 * (cpu_ticks(proc.pid) - c0) / tick / dt,
                    100.0 * (cpu_ticks(proc.pid, proc.pid) - m0) / tick / dt,
                    100.0 * (self_cpu() - s0) / dt,
                )
            )
        if profile:
            os.kill(proc.pid, signal.SIGUSR2)
        load_after = loadavg()
        stop = True
        await producer
        end = windows[-1].hi

        def expected(w: int, lo: int, hi: int) -> int:
            agent = watched[w]
            if agent < 0:
                return hi - lo
            return sum(1 for k in range(lo, hi) if agent_of[k] == agent)

        def got(s: Sink, lo: int, hi: int) -> int:
            return sum(1 for k in s.latency if lo <= k < hi)

        first = windows[0].lo
        want_sse = [expected(w, first, end) for w in range(watchers)]

        resume.set()  # the slow watchers read again: they must heal from the store

        async def drained() -> None:
            while True:
                if all(got(s, first, end) >= want_sse[w] for w, s in enumerate(sse)) and all(
                    got(s, first, end) >= end - first for s in slow_sinks
                ):
                    return
                await asyncio.sleep(POLL)

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(drained(), DRAIN_TIMEOUT)
        lost = sum(want_sse[w] - got(s, first, end) for w, s in enumerate(sse))
        slow_lost = sum(end - first - got(s, first, end) for s in slow_sinks)
        raw_lost = sum(
            sum(1 for k in range(first, end) if agent_of[k] == a) - got(s, first, end)
            for a, s in enumerate(raw)
        )

        bus_lagged = 0.0
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            r = await http.get("/api/metrics")
            if r.status_code == 200:
                bus_lagged = float(r.json().get("bus_lagged", 0))

        published: dict[int, int] = {}
        if split:  # stop prosperod now: it writes its publish stamps at exit
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)
            published = read_stamps(split)

        rows: list[dict[str, float]] = []
        for w in windows:
            sl = [v for s in sse for k, v in s.latency.items() if w.lo <= k < w.hi]
            rl = [v for s in raw for k, v in s.latency.items() if w.lo <= k < w.hi]
            row = {
                "frames_per_s": (w.hi - w.lo) / w.seconds,
                "sse_p50": pct(sl, 0.50),
                "sse_p99": pct(sl, 0.99),
                "sse_max": pct(sl, 1.0),
                "raw_p50": pct(rl, 0.50),
                "raw_p99": pct(rl, 0.99),
                "prosperod_cpu": w.child_cpu,
                "loop_thread_cpu": w.loop_cpu,
                "harness_cpu": w.self_cpu,
                "sse_events": len(sl),
            }
            # CPU prosperod spends per frame written (less sensitive to load than latency).
            row["cpu_us_per_frame"] = w.child_cpu * 1e4 / max(row["frames_per_s"], 1e-9)
            row["ratio_p50"] = row["raw_p50"] / row["sse_p50"]
            row["ratio_p99"] = row["raw_p99"] / row["sse_p99"]
            if published:
                ing = [published[k] - written[k] for k in range(w.lo, w.hi) if k in published]
                fan = [
                    written[k] + v - published[k]
                    for s in sse
                    for k, v in s.latency.items()
                    if w.lo <= k < w.hi and k in published
                ]
                row["write_to_publish_p50"] = pct(ing, 0.50)
                row["write_to_publish_p99"] = pct(ing, 0.99)
                row["publish_to_sse_p50"] = pct(fan, 0.50)
                row["publish_to_sse_p99"] = pct(fan, 0.99)
            rows.append(row)
        return Point(
            watchers,
            args.rate,
            rows,
            gaps=sum(s.gaps for s in sse),
            lost=lost,
            duplicates=sum(s.duplicates for s in sse),
            raw_lost=raw_lost,
            load_before=load_before,
            load_after=load_after,
            slow=slow,
            bus_lagged=bus_lagged,
            slow_lost=slow_lost,
            slow_duplicates=sum(s.duplicates for s in slow_sinks),
        )
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await fake.stop()
        shutil.rmtree(tmp, ignore_errors=True)


KEYS = ["sse_p50", "sse_p99", "raw_p50", "raw_p99", "ratio_p50", "ratio_p99"]


def med(rows: list[dict[str, float]], key: str) -> tuple[float, float, float]:
    vals = [r[key] for r in rows]
    return statistics.median(vals), min(vals), max(vals)


def report(p: Point) -> None:
    slow = f" + {p.slow} slow (reading nothing)" if p.slow else ""
    print(
        f"-- watchers={p.watchers}{slow} rate={p.rate}/s  loadavg {p.load_before} -> {p.load_after}"
    )
    for i, r in enumerate(p.rows):
        print(
            f"  window {i + 1}: {r['frames_per_s']:.0f} frames/s, {r['sse_events']:.0f} SSE "
            f"events; SSE p50 {r['sse_p50']:.2f} p99 {r['sse_p99']:.2f} max {r['sse_max']:.1f} "
            f"ms; raw p50 {r['raw_p50']:.2f} p99 {r['raw_p99']:.2f} ms; ratio p50 "
            f"{r['ratio_p50']:.3f} p99 {r['ratio_p99']:.3f}; CPU prosperod "
            f"{r['prosperod_cpu']:.0f}% (loop thread {r['loop_thread_cpu']:.0f}%) harness {r['harness_cpu']:.0f}%"
        )
    extra = [k for k in p.rows[0] if k.startswith(("write_to", "publish_to"))]
    for k in [*KEYS, *extra, "prosperod_cpu", "loop_thread_cpu", "harness_cpu", "cpu_us_per_frame"]:
        m, lo, hi = med(p.rows, k)
        unit = (
            ""
            if k.startswith("ratio")
            else "%"
            if k.endswith("cpu")
            else " us"
            if k.endswith("frame")
            else " ms"
        )
        print(f"  {k:14s} median {m:8.3f}{unit}  [{lo:.3f}-{hi:.3f}]")
    print(
        f"  gaps received {p.gaps}, SSE frames lost {p.lost}, duplicated {p.duplicates}; "
        f"raw frames lost {p.raw_lost}; prosperod bus_lagged {p.bus_lagged:.0f}"
    )
    if p.slow:
        print(
            f"  slow watchers, once reading again: frames lost {p.slow_lost}, duplicated "
            f"{p.slow_duplicates} (healed from the store)"
        )


def summary_line(p: Point) -> str:
    m = {k: med(p.rows, k)[0] for k in KEYS}
    return (
        f"fanout watchers={p.watchers} rate={p.rate} sse_p50_ms={m['sse_p50']:.2f} "
        f"sse_p99_ms={m['sse_p99']:.2f} raw_p50_ms={m['raw_p50']:.2f} "
        f"raw_p99_ms={m['raw_p99']:.2f} ratio_p50={m['ratio_p50']:.3f} "
        f"ratio_p99={m['ratio_p99']:.3f}"
    )


PROFILE = [
    ("drivers/ndjson.py", "run", "ingest: NDJSON drivers (read, normalise, emit; + publish)"),
    ("core/normalize.py", "_feed_lines", "  normaliser"),
    ("core/emitter.py", "emit_many", "  emitter.emit_many (queue, pump, + publish)"),
    ("core/emitter.py", "_publish", "emitter._publish: committed batches -> bus"),
    ("types/events.py", "iter_events", "  EventRun.iter_events (a FleetEvent per event)"),
    ("core/bus.py", "publish", "  bus.publish"),
    ("types/events.py", "stream_key", "    FleetEvent.stream_key (property, per event)"),
    ("core/bus.py", "_offer", "    subscription._offer (per watcher per event)"),
    ("api/sse.py", "_pump", "SSE pump: follower -> session queue"),
    ("core/subscription.py", "__anext__", "  Follower.__anext__"),
    ("asyncio/queues.py", "put", "  asyncio.Queue.put"),
    ("starlette/responses.py", "stream_response", "SSE response: chunks -> ASGI send"),
    ("api/sse.py", "chunks", "  StreamSession.chunks (batching, encoding)"),
    ("api/sse.py", "agent_frame", "    agent_frame (SSE bytes of one item)"),
    ("types/events.py", "to_json", "      FleetEvent.to_json (pydantic, per watcher)"),
    ("core/aio.py", "wait_for", "    aio.wait_for (all callers: SSE heartbeat, tail waits)"),
    ("api/middleware.py", "send_wrapper", "  middleware send chain (disconnect guard ...)"),
    ("uvicorn/protocols/http/h11_impl.py", "send", "    uvicorn h11 send"),
    ("~", "<method 'send' of '_socket.socket' objects>", "      socket.send"),
    ("~", "<method 'poll' of 'select.epoll' objects>", "event loop idle (epoll)"),
]
PROFILE_ROWS = [(s, n) for s, n, _ in PROFILE]
PROFILE_LABELS = [label for _, _, label in PROFILE]


def print_profile(path: str, top: int) -> None:
    import pstats

    st = pstats.Stats(path)
    total = st.total_tt  # type: ignore[attr-defined]
    print(f"\n== cProfile of prosperod's loop thread during the windows: {total:.2f}s total")
    # (file suffix, function): cumulative seconds, nested (a row includes the rows it calls).
    cum: dict[tuple[str, str], tuple[int, float]] = {}
    for (file, _line, fn), (_cc, nc, _tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        for suffix, name in PROFILE_ROWS:
            if fn == name and file.endswith(suffix):
                n0, c0 = cum.get((suffix, name), (0, 0.0))
                cum[(suffix, name)] = (n0 + nc, c0 + ct)
    print("-- where the time goes (cumulative, nested; % of the profiled wall time)")
    for (suffix, name), label in zip(PROFILE_ROWS, PROFILE_LABELS, strict=True):
        calls, ct = cum.get((suffix, name), (0, 0.0))
        print(f"  {label:58s} {ct:7.2f}s {100 * ct / total:5.1f}%  {calls:8d} calls")
    print("-- top by self time")
    st.sort_stats("tottime").print_stats(top)
    print("-- top by cumulative time (prospero, fastapi, starlette, uvicorn, h11, anyio)")
    st.sort_stats("cumulative").print_stats(
        r"prospero/|fastapi/|starlette/|uvicorn/|h11/|anyio/", top
    )


async def main(args: argparse.Namespace) -> None:
    print(f"loadavg at start {loadavg()} ({os.cpu_count()} CPUs)", flush=True)
    if args.curve:
        counts = [int(x) for x in args.curve.split(",")]
        points = []
        for w in counts:
            p = await run_point(args, w, None)
            report(p)
            print(summary_line(p), flush=True)
            points.append(p)
        print("\nwatchers | SSE p50 ms | SSE p99 ms | raw p99 ms | ratio p99 | prosperod CPU")
        for p in points:
            m = {k: med(p.rows, k)[0] for k in [*KEYS, "prosperod_cpu"]}
            print(
                f"{p.watchers:8d} | {m['sse_p50']:10.2f} | {m['sse_p99']:10.2f} | "
                f"{m['raw_p99']:10.2f} | {m['ratio_p99']:9.3f} | {m['prosperod_cpu']:5.0f}%"
            )
        return
    if args.slow:
        base = await run_point(args, args.watchers, None)
        report(base)
        print(summary_line(base), flush=True)
        with_slow = await run_point(args, args.watchers, None, slow=args.slow)
        report(with_slow)
        print(summary_line(with_slow), flush=True)
        b, w = med(base.rows, "sse_p99"), med(with_slow.rows, "sse_p99")
        bw, ww = med(base.rows, "sse_p50"), med(with_slow.rows, "sse_p50")
        print(
            f"\nslow watchers={args.slow}: the other {args.watchers} watchers' SSE p99 "
            f"{b[0]:.2f} ms [{b[1]:.2f}-{b[2]:.2f}] without, {w[0]:.2f} ms [{w[1]:.2f}-{w[2]:.2f}] "
            f"with; p50 {bw[0]:.2f} -> {ww[0]:.2f} ms; others lost {with_slow.lost}, duplicated "
            f"{with_slow.duplicates}; slow watchers lagged (bus_lagged "
            f"{with_slow.bus_lagged:.0f}) and healed: lost {with_slow.slow_lost}, duplicated "
            f"{with_slow.slow_duplicates}"
        )
        print(
            f"fanout_slow watchers={args.watchers} slow={args.slow} rate={args.rate} "
            f"sse_p99_ms={b[0]:.2f} sse_p99_slow_ms={w[0]:.2f} "
            f"slow_ratio_p99={b[0] / w[0]:.3f} bus_lagged={with_slow.bus_lagged:.0f} "
            f"slow_lost={with_slow.slow_lost}"
        )
        return
    profile = args.profile
    p = await run_point(args, args.watchers, profile)
    report(p)
    if profile:
        print_profile(profile, args.top)
        print("(latencies above are inflated by cProfile)")
    print(summary_line(p))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child_main(sys.argv[2:])
    else:
        ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        ap.add_argument("--agents", type=int, default=50)
        ap.add_argument("--watchers", type=int, default=50)
        ap.add_argument("--rate", type=int, default=5000, help="frames/s, all agents together")
        ap.add_argument("--reps", type=int, default=3, help="measurement windows (>= 3)")
        ap.add_argument("--window", type=float, default=4.0, help="seconds per window")
        ap.add_argument("--warmup", type=float, default=1.0, help="seconds before window 1")
        ap.add_argument("--stream", choices=["agent", "fleet"], default="agent")
        ap.add_argument("--curve", help="comma-separated watcher counts, one stack each")
        ap.add_argument(
            "--slow",
            type=int,
            default=0,
            help="also run with this many extra SSE watchers that never read (slow-watcher "
            "isolation: the others' p99 with/without)",
        )
        ap.add_argument("--profile", help="cProfile prosperod during the windows into PATH")
        ap.add_argument("--top", type=int, default=30, help="profile entries to print")
        ap.add_argument(
            "--split",
            action="store_true",
            help="also split the latency at the bus: write -> publish (ingest + commit) and "
            "publish -> SSE byte (fan-out), stamped inside prosperod",
        )
        ap.add_argument(
            "--switch-interval",
            type=float,
            help="sys.setswitchinterval() in prosperod (experiment; default Python's 0.005)",
        )
        ns = ap.parse_args()
        if ns.profile:
            ns.profile = os.path.abspath(ns.profile)
        asyncio.run(main(ns))
