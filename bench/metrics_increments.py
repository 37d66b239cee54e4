"""What a metric increment costs on the hot path: 1e6 increments of a labelled counter (and
observations of a labelled histogram) through prometheus_client and through Prospero's plain
counts (`core.metrics`), in one process, one after the other.

    uv run python bench/metrics_increments.py [--n 1000000] [--reps 3]

Ways timed (each the median over reps, in ns per operation, the empty loop subtracted):

- `prom_labels_inc`: `Counter.labels(ws, protocol, kind).inc()` every time;
- `prom_child_inc`: a cached labelled child's `.inc()` (it takes a lock per call);
- `metrics_inc_labels`: `Metrics.inc(name, 1, labels)` (a dict of label tuples);
- `metrics_series_add`: `d[key] = d.get(key, 0) + 1` on `Metrics.series(name)` (what the
  emitter does per published event kind);
- `prom_hist_observe`: a cached labelled `Histogram` child's `.observe()`;
- `metrics_hist_observe`: `core.metrics.Histogram.observe()` (bisect into plain ints).

The last line is `metrics_increments prom_labels_inc=<ns> ... metrics_hist_observe=<ns>`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client import Histogram as PromHistogram

from prospero.core.metrics import LATENCY_BUCKETS, Histogram, Metrics


def timed(fn: Callable[[int], None], n: int) -> float:
    t0 = time.perf_counter()
    fn(n)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    n: int = args.n

    registry = CollectorRegistry()
    counter = Counter("x", "x", ["workspace", "protocol", "kind"], registry=registry)
    child = counter.labels("ws", "ndjson", "output")
    prom_hist = PromHistogram("h", "h", ["workspace"], registry=registry, buckets=LATENCY_BUCKETS)
    prom_hist_child = prom_hist.labels("ws")
    metrics = Metrics()
    series = metrics.series("x")
    hist = Histogram(LATENCY_BUCKETS)
    key = ("ws", "ndjson", "output")

    def empty(n: int) -> None:
        for _ in range(n):
            pass

    def prom_labels_inc(n: int) -> None:
        for _ in range(n):
            counter.labels("ws", "ndjson", "output").inc()

    def prom_child_inc(n: int) -> None:
        for _ in range(n):
            child.inc()

    def metrics_inc_labels(n: int) -> None:
        for _ in range(n):
            metrics.inc("y", 1, key)

    def metrics_series_add(n: int) -> None:
        for _ in range(n):
            series[key] = series.get(key, 0) + 1

    def prom_hist_observe(n: int) -> None:
        for _ in range(n):
            prom_hist_child.observe(0.003)

    def metrics_hist_observe(n: int) -> None:
        for _ in range(n):
            hist.observe(0.003)

    ways = [
        prom_labels_inc,
        prom_child_inc,
        metrics_inc_labels,
        metrics_series_add,
        prom_hist_observe,
        metrics_hist_observe,
    ]
    base: list[float] = []
    times: dict[str, list[float]] = {w.__name__: [] for w in ways}
    for _ in range(args.reps):
        base.append(timed(empty, n))
        for w in ways:
            times[w.__name__].append(timed(w, n))
    loop = statistics.median(base)
    with open("/proc/loadavg") as f:
        print(
            f"loadavg {f.read().strip()}; n={n}, reps={args.reps}, empty loop {loop / n * 1e9:.0f} ns"
        )
    out: dict[str, float] = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        out[name] = (med - loop) / n * 1e9
        lo, hi = ((min(ts) - loop) / n * 1e9, (max(ts) - loop) / n * 1e9)
        print(f"{name:22s} {out[name]:7.0f} ns/op  [{lo:.0f}-{hi:.0f}]  ({med:.2f} s per {n:,})")
    assert series[key] == n * args.reps and metrics.get("y") == n * args.reps
    print("metrics_increments " + " ".join(f"{k}={v:.0f}" for k, v in out.items()))


if __name__ == "__main__":
    main()
