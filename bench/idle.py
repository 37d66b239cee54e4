"""Idle benchmark: N interactive agents parked at their input boundary, all attached by a real
prosperod (subprocess: `python -m prospero.daemon`, default poll interval) through a fake
caliband (prospero.testkit, in this process), and nothing happening.

    uv run python bench/idle.py [--agents 1000] [--window 10] [--reps 3]

Figures, measured on prosperod's process only (/proc/<pid>/task/*/schedstat, /proc/<pid>/stat,
/proc/<pid>/status):
- `cpu_pct`: prosperod's CPU time over a `--window`-second window of the idle fleet, as a
  percentage of one core, from its threads' schedstat counters (ns; the clock-tick count of
  /proc/<pid>/stat is 0.1 % coarse over 10 s); median of `--reps` windows (min/max in
  brackets). The floor is the same daemon with no workspace registered, measured in the same
  run. The windows start `--warmup` seconds after the fleet went quiet (steady state). Each
  window also counts prosperod's wakeups (voluntary context switches, all threads) per second.
- `rss_per_agent_kb`: (RSS with the N agents attached and idle - RSS of the empty daemon) / N.

All agents went quiet at the same moment, so their transcript tails' backed-off checks (at ~15,
45, 135 s of quiet, then every 120 s) come in bursts: the window holding one is the max, the
median is the steady state between them. `--warmup 140 --window 120 --reps 1` averages over one
whole period of every periodic wakeup (one burst, ~8 workspace polls).

Targets (issue 11): cpu_pct <= 0.3 and rss_per_agent_kb <= 40 at 1,000 agents. The last line
is exactly `idle agents=<N> cpu_pct=<C> floor_pct=<F> rss_per_agent_kb=<R> cpu_ratio=<C/0.3>
rss_ratio=<R/40>` (a ratio <= 1 meets the target).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from prospero.core.discovery import socket_path_for
from prospero.testkit import scripts
from prospero.testkit.fake_caliband import FakeCaliband

CPU_TARGET_PCT = 0.3
RSS_TARGET_KB = 40.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
POLL = 0.2  # how often the bench looks at prosperod's metrics while waiting
SETTLE = 3.0  # the fleet is idle once nothing was appended for this long


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """The process's CPU time in clock ticks (1/CLK_TCK s: 0.1 % of a 10 s window)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / CLK_TCK


def thread_cpu_ns(pid: int) -> dict[int, int]:
    """Each thread's CPU time in ns (/proc/<pid>/task/<tid>/schedstat, first field)."""
    out: dict[int, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return out


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def wakeups(pid: int) -> int:
    """Voluntary context switches of all threads: how often prosperod went to sleep (and so
    was woken again)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


async def cpu_pct(pid: int, window: float, wake_rates: list[float] | None = None) -> float:
    """prosperod's CPU over `window` seconds, in % of one core, to the ns: the threads' own
    schedstat counters (a thread that ended inside the window would be missed: then the
    coarser process tick count, which keeps dead threads' time, is used if it is higher).
    Appends the window's wakeups per second to `wake_rates`."""
    n0, c0, w0, t0 = thread_cpu_ns(pid), cpu_seconds(pid), wakeups(pid), time.monotonic()
    await asyncio.sleep(window)
    n1, c1, w1, t1 = thread_cpu_ns(pid), cpu_seconds(pid), wakeups(pid), time.monotonic()
    precise = sum(ns - n0.get(tid, 0) for tid, ns in n1.items()) / 1e9
    gone = set(n0) - set(n1)
    used = max(precise, c1 - c0 - 1 / CLK_TCK) if gone else precise
    if wake_rates is not None:
        wake_rates.append((w1 - w0) / (t1 - t0))
    return 100.0 * used / (t1 - t0)


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def start_daemon(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


async def metrics(client: httpx.AsyncClient) -> dict[str, Any]:
    r = await client.get("/api/metrics")
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


async def wait_idle(client: httpx.AsyncClient, n_agents: int, timeout: float) -> dict[str, Any]:
    """Every agent attached, and no event appended for SETTLE seconds."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        snap = await metrics(client)
        appended = int(snap.get("events_appended", 0))
        if appended != last:
            last, since = appended, time.monotonic()
        elif snap.get("active_attaches", 0) >= n_agents and time.monotonic() - since >= SETTLE:
            return snap
        await asyncio.sleep(POLL)
    raise TimeoutError(f"fleet not idle after {timeout}s: {snap}")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--window", type=float, default=10.0, help="seconds per CPU window")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--warmup",
        type=float,
        default=20.0,
        help="idle seconds before the windows (the poll backoffs start after 5-10 s quiet)",
    )
    ap.add_argument("--settle-timeout", type=float, default=300.0)
    ap.add_argument("--daemon-arg", action="append", default=[], help="extra prosperod flag")
    ap.add_argument("--profile", default=None, help="run prosperod under cProfile, stats here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pr-idle-", dir="/tmp"))
    rt = tmp / "rt"
    os.environ["CALIBAN_DAEMON_RUNTIME_DIR"] = str(rt)
    root = tmp / "ws"
    root.mkdir()
    canon = str(root.resolve())
    sock = socket_path_for(canon)
    Path(sock).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fake = await FakeCaliband.start_unix(sock, root=canon, data_dir=tmp / "sessions")
    port = free_port()
    proc: subprocess.Popen[bytes] | None = None
    try:
        for _ in range(args.agents):
            # One turn, then parked at the input boundary: reported idle, stream open.
            await fake.add_agent(script=scripts.interactive_script(), interactive=True)
        prof = ["-m", "cProfile", "-o", args.profile] if args.profile else []
        cmd = [
            sys.executable,
            *prof,
            "-m",
            "prospero.daemon",
            "--addr",
            f"127.0.0.1:{port}",
            "--data-dir",
            str(tmp / "data"),
            "--no-autostart",
            "--log-level",
            "warning",
            *args.daemon_arg,
        ]
        proc = start_daemon(cmd, tmp / "prosperod.log")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            for _ in range(300):
                try:
                    if (await client.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(POLL)
            else:
                raise RuntimeError("prosperod did not come up")
            print(f"load before: {loadavg()}", flush=True)
            floor_wakes: list[float] = []
            floor = [await cpu_pct(proc.pid, args.window, floor_wakes) for _ in range(args.reps)]
            rss0 = rss_kb(proc.pid)
            print(
                f"empty daemon: cpu {spread(floor)} %, {spread(floor_wakes)} wakeups/s,"
                f" rss {rss0} KB",
                flush=True,
            )
            t0 = time.monotonic()
            r = await client.post("/api/workspaces", json={"name": "idle", "root": canon})
            r.raise_for_status()
            snap = await wait_idle(client, args.agents, args.settle_timeout)
            print(
                f"setup: {args.agents} agents attached and idle in {time.monotonic() - t0:.1f}s"
                f" ({snap['events_appended']} events)",
                flush=True,
            )
            await asyncio.sleep(args.warmup)
            polled0 = (await metrics(client)).get("repos_polled", 0)
            idle_wakes: list[float] = []
            idle = [await cpu_pct(proc.pid, args.window, idle_wakes) for _ in range(args.reps)]
            rssn = rss_kb(proc.pid)
            polled = (await metrics(client)).get("repos_polled", 0) - polled0
            print(f"load after: {loadavg()}", flush=True)
            print(
                f"idle fleet (after {args.warmup:g}s warm-up): cpu {spread(idle)} % (windows:"
                f" {', '.join(f'{x:.3f}' for x in idle)}; mean {statistics.fmean(idle):.3f}),"
                f" {spread(idle_wakes)} wakeups/s,"
                f" rss {rssn} KB,"
                f" {polled} workspace polls in {args.reps * args.window:.0f}s",
                flush=True,
            )
        per_agent = (rssn - rss0) / args.agents
        c, f = statistics.median(idle), statistics.median(floor)
        print(
            f"idle agents={args.agents} cpu_pct={c:.3f} floor_pct={f:.3f}"
            f" rss_per_agent_kb={per_agent:.1f} cpu_ratio={c / CPU_TARGET_PCT:.2f}"
            f" rss_ratio={per_agent / RSS_TARGET_KB:.2f}"
        )
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        await fake.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
