"""Cross-replica live latency on PostgreSQL: an event committed by one replica -> its SSE bytes
read from another replica, against the NOTIFY doorbell itself measured in the same run. Not a
test.

    uv run python bench/cluster_latency.py [--rate 500] [--agents 10] [--seconds 4] [--reps 3]

Three processes on a throwaway PostgreSQL server (`prospero.testkit.postgres`, fsync off):

- the *writer* replica (a child): `PostgresEventStore` + `Emitter`, emitting `--rate` output
  events/s in aggregate over `--agents` streams, each chunk carrying a marker; it records the
  moment each append committed (`append_batch` returned), per marker and per batch's last
  ordinal (CLOCK_MONOTONIC, which all processes on the host share);
- the *serving* replica (a child): a real prosperod stack on the same database (`serve`:
  Runtime with `PgBus`, uvicorn, the full middleware chain), with no workspace of its own;
- this process: one SSE client on the serving replica's `/api/stream` (the fleet stream),
  stamping each marker as its bytes arrive, and the ceiling: a bare asyncpg LISTEN on the same
  channel, stamping each doorbell (batch) as it arrives.

Figure: commit -> SSE byte on the other replica, p50/p99 per `--seconds` window (`--reps`
windows). Ceiling: commit -> NOTIFY received (what any replica needs before it can read the
rows at all). Ratio = ceiling p99 / figure p99 (>= 0.5: within 2x). Last line
`cluster_latency rate=R sse_p50_ms=.. sse_p99_ms=.. notify_p50_ms=.. notify_p99_ms=.. ratio_p99=..`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import asyncpg

MARKER = re.compile(rb"m(\d+)\.")
CHANNEL = "prospero_events"


def now_ns() -> int:
    return time.perf_counter_ns()  # CLOCK_MONOTONIC: comparable across processes on one host


# ------------------------------------------------------------------------------ children


async def writer_main(dsn: str, rate: int, agents: int, total: int, out: str) -> None:
    from prospero.core.bus import InProcessBus
    from prospero.core.emitter import Emitter
    from prospero.core.metrics import Metrics
    from prospero.core.store.postgres.events import PostgresEventStore
    from prospero.types.events import EventRun, Output

    store = PostgresEventStore(dsn)
    await store.open()
    committed: dict[int, int] = {}  # marker -> commit ns
    batches: dict[int, int] = {}  # last ordinal -> commit ns
    original = store.append_batch

    async def append_batch(events, **kw):  # type: ignore[no-untyped-def]
        ordinals = await original(events, **kw)
        t = now_ns()
        if ordinals:
            batches[ordinals[-1]] = t
        for e in events:
            kinds = e.kinds if type(e) is EventRun else [getattr(e, "kind", None)]
            for k in kinds:
                chunk = k[1] if type(k) is tuple else getattr(k, "chunk", None)
                if isinstance(chunk, str) and (m := MARKER.match(chunk.encode())):
                    committed[int(m.group(1))] = t
        return ordinals

    store.append_batch = append_batch  # type: ignore[method-assign]
    emitter = Emitter(store, InProcessBus(), Metrics())
    await emitter.start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go"
    t0 = time.monotonic()
    for i in range(total):
        due = t0 + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)  # pacing the producer
        await emitter.emit("ws", f"agent-{i % agents}", Output(chunk=f"m{i}. some output"))
    await emitter.flush()
    await emitter.close()
    await store.close()
    payload = json.dumps({"markers": committed, "batches": batches})
    await asyncio.to_thread(Path(out).write_text, payload)


def serve_main(dsn: str, data_dir: str) -> None:
    from prospero.api.server import ApiServer
    from prospero.daemon.main import serve
    from prospero.daemon.runtime import DaemonConfig, Runtime

    def on_ready(server: ApiServer) -> None:
        print(f"URL {server.url}", flush=True)

    config = DaemonConfig(
        bind_host="127.0.0.1",
        port=0,
        data_dir=Path(data_dir),
        autostart=False,
        database_url=dsn,
        replica_id="serving",
    )
    sys.exit(asyncio.run(serve(config, runtime=Runtime(config), on_ready=on_ready)))


# ------------------------------------------------------------------------------ the harness


async def sse_reader(url: str, seen: dict[int, int], ready: asyncio.Event) -> None:
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    r, w = await asyncio.open_connection(host, int(port), limit=1 << 20)
    try:
        w.write(
            f"GET /api/stream HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        await w.drain()
        head = await r.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"SSE: {head[:200]!r}")
        ready.set()
        while data := await r.read(1 << 16):
            t = now_ns()
            for m in MARKER.finditer(data):
                seen.setdefault(int(m.group(1)), t)
    finally:
        w.close()


def quantiles(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    if not xs:
        return float("nan"), float("nan")
    return xs[len(xs) // 2], xs[min(len(xs) - 1, int(0.99 * (len(xs) - 1)))]


async def run_once(dsn: str, a: argparse.Namespace, tmp: Path) -> dict[str, float]:
    total = a.rate * a.seconds * a.reps
    out = tmp / "writer.json"
    env = {**os.environ}
    serving = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", "--dsn", dsn, "--data-dir", str(tmp / "serving"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env,
    )  # fmt: skip
    writer = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--write", "--dsn", dsn, "--rate", str(a.rate),
        "--agents", str(a.agents), "--total", str(total), "--out", str(out),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert serving.stdout is not None and writer.stdout is not None and writer.stdin is not None
    try:
        line = await asyncio.wait_for(serving.stdout.readline(), 60)
        url = line.decode().split()[1]
        assert (await asyncio.wait_for(writer.stdout.readline(), 60)).strip() == b"ready"
        seen: dict[int, int] = {}
        doorbells: dict[int, int] = {}
        listen = await asyncpg.connect(dsn)

        def on_notify(conn: object, pid: int, channel: str, payload: object) -> None:
            doorbells.setdefault(int(str(payload)), now_ns())

        await listen.add_listener(CHANNEL, on_notify)
        ready = asyncio.Event()
        reader = asyncio.create_task(sse_reader(url, seen, ready))
        await asyncio.wait_for(ready.wait(), 30)
        t_go = now_ns()
        writer.stdin.write(b"go\n")
        await writer.stdin.drain()
        await asyncio.wait_for(writer.wait(), a.seconds * a.reps + 60)
        data = json.loads(await asyncio.to_thread(out.read_text))
        committed = {int(k): v for k, v in data["markers"].items()}
        batches = {int(k): v for k, v in data["batches"].items()}
        deadline = time.monotonic() + 15
        while len(seen) < len(committed) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the last events are still on their way
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader
        await listen.close()
    finally:
        for p in (serving, writer):
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(p.wait(), 20)
                if p.returncode is None:
                    p.kill()
    window_ns = a.seconds * 1_000_000_000
    per_rep: list[dict[str, float]] = []
    span = a.rate * a.seconds
    for rep in range(a.reps):
        ids = range(rep * span, (rep + 1) * span)
        sse = [(seen[i] - committed[i]) / 1e6 for i in ids if i in seen and i in committed]
        lost = sum(1 for i in ids if i in committed and i not in seen)
        lo, hi = t_go + rep * window_ns, t_go + (rep + 1) * window_ns
        notify = [
            (doorbells[o] - t) / 1e6 for o, t in batches.items() if o in doorbells and lo <= t < hi
        ]
        s50, s99 = quantiles(sse)
        n50, n99 = quantiles(notify)
        per_rep.append({"sse_p50": s50, "sse_p99": s99, "notify_p50": n50, "notify_p99": n99,
                        "lost": lost, "ratio_p99": n99 / s99 if s99 else float("nan")})  # fmt: skip
        print(
            f"  window {rep + 1}: {len(sse)} events; SSE p50 {s50:.2f} p99 {s99:.2f} ms; "
            f"NOTIFY p50 {n50:.2f} p99 {n99:.2f} ms; lost {lost}"
        )
    return (
        {k: statistics.median(r[k] for r in per_rep) for k in per_rep[0]}
        | {f"{k}_min": min(r[k] for r in per_rep) for k in ("sse_p99", "ratio_p99")}
        | {f"{k}_max": max(r[k] for r in per_rep) for k in ("sse_p99", "ratio_p99")}
    )


async def harness(a: argparse.Namespace) -> None:
    from prospero.testkit.postgres import PgServer

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"loadavg at start {load} ({os.cpu_count()} CPUs)")
    print(f"{a.rate} events/s over {a.agents} streams, {a.reps} windows of {a.seconds}s")
    with tempfile.TemporaryDirectory(prefix="pr-clat-") as d, PgServer() as pg:
        res = await run_once(pg.create_database(), a, Path(d))
    for k in ("sse_p50", "sse_p99", "notify_p50", "notify_p99", "ratio_p99"):
        extra = ""
        if f"{k}_min" in res:
            extra = f"  [{res[k + '_min']:.3f}-{res[k + '_max']:.3f}]"
        print(f"  {k:<12} median {res[k]:8.3f}{extra}")
    print(f"  lost (median per window) {res['lost']:.0f}")
    print(
        f"cluster_latency rate={a.rate} sse_p50_ms={res['sse_p50']:.2f} "
        f"sse_p99_ms={res['sse_p99']:.2f} notify_p50_ms={res['notify_p50']:.2f} "
        f"notify_p99_ms={res['notify_p99']:.2f} ratio_p99={res['ratio_p99']:.3f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=500)
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--write", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dsn", help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", help=argparse.SUPPRESS)
    ap.add_argument("--total", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve_main(a.dsn, a.data_dir)
    elif a.write:
        asyncio.run(writer_main(a.dsn, a.rate, a.agents, a.total, a.out))
    else:
        asyncio.run(harness(a))


if __name__ == "__main__":
    main()
