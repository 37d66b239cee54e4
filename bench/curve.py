"""Cost curve: how each figure of issue 11 grows with the fleet, the watchers and the history.
Not a test.

    uv run python bench/curve.py [--quick] [--only replay,fanout,idle,ingest,summary]
                                 [--out-dir DIR] [--readme PATH] [--no-lock]

Runs the existing benches as subprocesses, one at a time, each holding the shared bench lock
(`/tmp/bench.lock`, the same flock(2) lock as `flock /tmp/bench.lock ...`; taken per bench
run so other work can interleave, and skipped when this script already runs under
`flock /tmp/bench.lock`), and parses the figures they print:

- history 10k / 100k / 1M events: `bench/replay.py --events N` (SSE per agent, SSE fleet,
  REST limit 1000 / 10000, each against the SQLite read + JSON parse + dump ceiling);
- watchers 1 / 10 / 50 / 200: `bench/fanout.py --watchers W` (50 agents, 5k frames/s: SSE
  p50/p99 against a raw reader on each worker socket; one fresh stack per point);
- agents 10 / 100 / 1000: `bench/idle.py --agents N` (idle CPU and RSS per agent),
  `bench/ingest.py --agents N` (+ 200, the issue's size; run `--ingest-runs` times, median)
  and `bench/dashboard_summary.py --agents N` (+ 500, the issue's size).

Writes, in `--out-dir` (default `bench/`): `curve.json` (every figure, its load average and
the bench's own runtime), `curve.png` (matplotlib, headless Agg) and, in `--readme` (default
`bench/README.md`), the curve table and the before/after table between their markers
(regenerated; the rest of the file is left alone). `--only` reruns some groups or points and merges
them into the existing `curve.json`. `--quick` runs tiny sizes (seconds, for development; its
figures mean nothing) into /tmp/prospero-curve-quick/ (with a copy of the README) unless
`--out-dir`/`--readme` say otherwise. Each bench's full output is kept in `<out-dir>/logs/`
(quick) or a temporary directory (printed). The last line is
`curve points=<N> failed=<F> bench_s=<seconds running benches> wall_s=<seconds>`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curve_report import GROUPS, before_after_md, curve_md, curve_rows, plot, splice, table

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
LOCK = "/tmp/bench.lock"
QUICK_DIR = Path("/tmp/prospero-curve-quick")


@dataclass
class Spec:
    group: str
    size: int
    argline: str
    timeout: float
    runs: int = 1  # separate invocations (ingest prints one figure per run)
    issue: bool = False  # the issue table's size for this group

    @property
    def args(self) -> list[str]:
        return self.argline.split()

    @property
    def key(self) -> str:
        return f"{self.group}:{self.size}"

    @property
    def script(self) -> str:
        return {"summary": "dashboard_summary"}.get(self.group, self.group) + ".py"


def specs(quick: bool, ingest_runs: int) -> list[Spec]:
    """Every point of the curve; `issue` marks the size of the issue's table row."""
    if quick:
        return [
            *(
                Spec("replay", n, f"--events {n} --reps 3", 120, issue=n == 3000)
                for n in (1000, 3000)
            ),
            *(
                Spec(
                    "fanout",
                    w,
                    f"--watchers {w} --agents 4 --rate 400 --window 1 --warmup 0.5",
                    120,
                    issue=w == 4,
                )
                for w in (1, 4)
            ),
            *(
                Spec("idle", n, f"--agents {n} --window 1 --warmup 1", 120, issue=n == 5)
                for n in (2, 5)
            ),
            *(Spec("ingest", n, f"--agents {n} --lines 50", 120, 3, n == 5) for n in (2, 5)),
            *(
                Spec(
                    "summary",
                    n,
                    f"--agents {n} --events 40 --calls 5 --advance 2 --skip-before",
                    120,
                    issue=n == 20,
                )
                for n in (5, 20)
            ),
        ]
    return [
        *(
            Spec("replay", n, f"--events {n}", 1800, issue=n == 100_000)
            for n in (10_000, 100_000, 1_000_000)
        ),
        *(Spec("fanout", w, f"--watchers {w}", 600, issue=w == 50) for w in (1, 10, 50, 200)),
        # 10 / 100 agents: 5 s windows (their CPU is a small fraction of the 1,000 figure).
        *(
            Spec("idle", n, f"--agents {n} --window {5 if n < 1000 else 10}", 900, issue=n == 1000)
            for n in (10, 100, 1000)
        ),
        # 1,000 agents x 200 lines: as many lines as 200 x 1000, so a run stays short.
        *(
            Spec(
                "ingest",
                n,
                f"--agents {n} --lines {200 if n >= 1000 else 1000}",
                900,
                ingest_runs,
                issue=n == 200,
            )
            for n in (10, 100, 200, 1000)
        ),
        *(
            Spec("summary", n, f"--agents {n} --skip-before", 900, issue=n == 500)
            for n in (10, 100, 500, 1000)
        ),
    ]


# ------------------------------------------------------------------------------ the lock


def lock_held_by_ancestor() -> bool:
    """True when this process runs under `flock /tmp/bench.lock ...` (taking it again per
    bench would wait forever on our own parent)."""
    pid = os.getppid()
    while pid > 1:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        if argv and os.path.basename(argv[0]) == b"flock" and LOCK.encode() in argv:
            return True
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


@contextlib.contextmanager
def bench_lock(enabled: bool) -> Iterator[float]:
    """Hold the shared bench lock; yields the seconds spent waiting for it."""
    if not enabled:
        yield 0.0
        return
    fd = os.open(LOCK, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        t0 = time.monotonic()
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield time.monotonic() - t0
    finally:
        os.close(fd)  # releases the lock


# ------------------------------------------------------------------------------- parsing

NUM = r"([0-9.]+)"


def kv(line: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tok in line.split():
        k, eq, v = tok.partition("=")
        if not eq:
            continue
        try:
            out[k] = float(v)
        except ValueError:
            out[k] = {"True": True, "False": False}.get(v, v)
    return out


def last_line(text: str, prefix: str) -> str:
    for line in reversed(text.splitlines()):
        if line.startswith(prefix):
            return line
    raise ValueError(f"no line starting with {prefix!r}")


def parse(group: str, text: str) -> dict[str, Any]:
    """The figures of one run of a bench, from its output."""
    if group == "replay":
        r = {f"{k}_ratio": v for k, v in kv(last_line(text, "replay ")).items() if k != "target"}
        m = re.search(rf"ceiling \(.*\): {NUM}k \[{NUM}-{NUM}k\]", text)
        if m:
            r["ceiling_evs"], r["ceiling_evs_min"], r["ceiling_evs_max"] = (
                float(x) * 1e3 for x in m.groups()
            )
        for m in re.finditer(
            rf"^\s+(\w+)\s+{NUM}k \[{NUM}-{NUM}k\] ev/s\s+ratio {NUM} \[{NUM}-{NUM}\]", text, re.M
        ):
            k = m.group(1)
            r[f"{k}_evs"], r[f"{k}_evs_min"], r[f"{k}_evs_max"] = (
                float(x) * 1e3 for x in m.group(2, 3, 4)
            )
            r[f"{k}_ratio_min"], r[f"{k}_ratio_max"] = float(m.group(6)), float(m.group(7))
        return r
    if group == "fanout":
        r = kv(last_line(text, "fanout watchers="))
        pat = rf"^\s+(\w+)\s+median\s+{NUM}\s*(?:%|us|ms)?\s+\[{NUM}-{NUM}\]"
        for m in re.finditer(pat, text, re.M):
            k = f"{m.group(1)}_ms" if f"{m.group(1)}_ms" in r else m.group(1)
            r.setdefault(k, float(m.group(2)))
            r[f"{k}_min"], r[f"{k}_max"] = float(m.group(3)), float(m.group(4))
        m = re.search(r"gaps received (\d+), SSE frames lost (\d+), duplicated (\d+)", text)
        if m:
            r["gaps"], r["lost"], r["duplicated"] = (int(x) for x in m.groups())
        if m := re.search(r"raw frames lost (\d+)", text):
            r["raw_lost"] = int(m.group(1))
        return r
    if group == "idle":
        r = kv(last_line(text, "idle agents="))
        m = re.search(rf"idle fleet .*: cpu {NUM} \({NUM}-{NUM}\)", text)
        if m:
            r["cpu_pct_min"], r["cpu_pct_max"] = float(m.group(2)), float(m.group(3))
        return r
    if group == "ingest":
        return kv(last_line(text, "ingest events_per_s="))
    if group == "summary":
        r = kv(last_line(text, "summary after "))
        m = re.search(rf"high-water SELECTs \(raw\): {NUM}", text)
        if m:
            r["heads_ms"] = float(m.group(1))
        m = re.search(rf"one filtered SQL query \(raw\):\s+{NUM}", text)
        if m:
            r["query_ms"] = float(m.group(1))
        m = re.search(rf"after: warm p50 {NUM} \[{NUM}-{NUM}\].*ceiling / warm {NUM}", text)
        if m:
            r["warm_p50_ms_min"], r["warm_p50_ms_max"] = float(m.group(2)), float(m.group(3))
            r["warm_ratio"] = float(m.group(4))
        return r
    raise ValueError(group)


def combine_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several invocations of a one-figure bench (ingest): median, with min/max."""
    if len(runs) == 1:
        return runs[0]
    out: dict[str, Any] = {"runs": len(runs)}
    for k in runs[0]:
        xs = [r[k] for r in runs if isinstance(r.get(k), float)]
        if xs:
            out[k], out[f"{k}_min"], out[f"{k}_max"] = statistics.median(xs), min(xs), max(xs)
    return out


# ------------------------------------------------------------------------------- running


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run_once(cmd: list[str], timeout: float) -> tuple[int, str]:
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: a timeout ends its children too
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                out, _ = proc.communicate(timeout=15)
                break
            except subprocess.TimeoutExpired:
                out = ""
        return -1, f"{out}\n[curve.py: timed out after {timeout:.0f}s]"


def run_spec(spec: Spec, logs: Path, use_lock: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(BENCH / spec.script), *spec.args]
    runs: list[dict[str, Any]] = []
    point: dict[str, Any] = {
        "group": spec.group,
        "size": spec.size,
        "issue": spec.issue,
        "command": "uv run python bench/" + " ".join([spec.script, *spec.args]),
        "load": [],
        "bench_s": 0.0,
        "lock_wait_s": 0.0,
    }
    for i in range(spec.runs):
        with bench_lock(use_lock) as waited:
            point["lock_wait_s"] += waited
            point["load"].append(loadavg())
            t0 = time.monotonic()
            rc, out = run_once(cmd, spec.timeout)
            point["bench_s"] += time.monotonic() - t0
        log = logs / f"{spec.group}-{spec.size}-{i + 1}.log"
        log.write_text(f"$ {' '.join(cmd)}\n{out}")
        try:
            if rc != 0:
                raise RuntimeError(f"exit {rc}")
            runs.append(parse(spec.group, out))
        except (RuntimeError, ValueError) as e:
            point["error"] = f"{e} (log: {log})"
            tail = "\n".join(out.strip().splitlines()[-5:])
            print(f"    FAILED: {e}; last lines:\n{tail}", flush=True)
            return point
    point["figures"] = combine_runs(runs)
    return point


# ---------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for development")
    ap.add_argument(
        "--only", help=f"comma-separated groups ({','.join(GROUPS)}) or points (e.g. replay:10000)"
    )
    ap.add_argument("--out-dir", type=Path, help="curve.json, curve.png (default bench/)")
    ap.add_argument("--readme", type=Path, help="README to update (default bench/README.md)")
    ap.add_argument("--ingest-runs", type=int, default=3, help="ingest.py runs per point")
    ap.add_argument("--no-lock", action="store_true", help="do not take /tmp/bench.lock")
    ap.add_argument("--render-only", action="store_true", help="redraw from curve.json")
    args = ap.parse_args()
    out = args.out_dir or (QUICK_DIR if args.quick else BENCH)
    out.mkdir(parents=True, exist_ok=True)
    readme = args.readme
    if readme is None:
        readme = out / "README.md" if args.quick else BENCH / "README.md"
        if args.quick:  # a fresh copy: the real README is left alone
            shutil.copy(BENCH / "README.md", readme)
    groups = args.only.split(",") if args.only else list(GROUPS)
    if bad := {x for x in groups if x.split(":")[0] not in GROUPS}:
        raise SystemExit(f"unknown groups {sorted(bad)}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 20000 if hard == resource.RLIM_INFINITY else min(20000, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))  # the benches open many fds
    use_lock = not args.no_lock and not lock_held_by_ancestor()
    jpath = out / "curve.json"
    data: dict[str, Any] = {"points": {}}
    if jpath.exists() and (args.only or args.render_only):
        data = json.loads(jpath.read_text())
    todo = (
        []
        if args.render_only
        else [
            s for s in specs(args.quick, args.ingest_runs) if s.group in groups or s.key in groups
        ]
    )
    logs = out / "logs" if args.quick else Path(tempfile.mkdtemp(prefix="prospero-curve-"))
    logs.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if todo:
        data["meta"] = {
            "at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit + ("+dirty" if dirty else ""),
            "quick": args.quick,
            "cpus": os.cpu_count(),
            "logs": str(logs),
        }
    print(
        f"curve: {len(todo)} points, logs in {logs}, lock {'per bench' if use_lock else 'not taken'}"
        f", loadavg {loadavg()}",
        flush=True,
    )
    t_wall = time.monotonic()
    bench_s = 0.0
    failed = 0
    for i, spec in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {spec.group} {spec.size}: {' '.join(spec.args)}", flush=True)
        point = run_spec(spec, logs, use_lock)
        at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        point.update(at=at, commit=data["meta"]["commit"], logs=str(logs))
        data["points"][spec.key] = point
        bench_s += point["bench_s"]
        failed += "error" in point
        f = point.get("figures", {})
        shown = {k: v for k, v in f.items() if not k.endswith(("_min", "_max"))}
        print(
            f"    {shown}\n    ran {point['bench_s']:.1f}s, waited {point['lock_wait_s']:.1f}s "
            f"for the lock, load {point['load']}",
            flush=True,
        )
        jpath.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    if not data["points"]:
        raise SystemExit("nothing measured (no curve.json to render)")
    plot(data["points"], out / "curve.png", bool(data.get("meta", {}).get("quick")))
    text = readme.read_text()
    text = splice(text, "curve", curve_md(data))
    text = splice(text, "before-after", before_after_md(data))
    readme.write_text(text)
    print(
        "\n"
        + table(
            ["axis", "size", "path", "figure", "ceiling", "ratio", "target", "load"],
            curve_rows(data["points"]),
        )
    )
    print("\n" + before_after_md(data))
    print(f"wrote {out / 'curve.png'}, {jpath}, {readme}")
    print(
        f"curve points={len(todo)} failed={failed} bench_s={bench_s:.0f} "
        f"wall_s={time.monotonic() - t_wall:.0f}"
    )


if __name__ == "__main__":
    main()
