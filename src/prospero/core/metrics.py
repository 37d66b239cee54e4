"""Process-lifetime metrics, shared by the core and exported by the API.

Counted in plain Python numbers on the hot path and turned into Prometheus metric families only
when `/metrics` is scraped (`core.metrics_export`: a custom collector on a `CollectorRegistry`
of this `Metrics`, one per Runtime). Measured (bench/metrics_increments.py, 1e6 each, 2 loaded
cores): prometheus_client's `Counter.labels(...).inc()` ~3.7 µs a call, a cached labelled
child's `inc()` ~0.8 µs (a lock per increment), `Metrics.inc(name, 1, labels)` ~0.25 µs and a
`get` + add on the dict of `series(name)` ~0.09 µs; a prometheus_client histogram child's
`observe` ~1.7 µs against ~0.4 µs for `Histogram.observe` here. The live path counts every event
it publishes, so it uses the dict.

* counters: `inc(name, by)`, or `inc(name, by, labels)` for a labelled series (`labels` is the
  tuple of label values, in the order `core.metrics_catalog` declares for that name);
  `series(name)` hands out the live dict of a labelled counter for code that counts in bulk
  (the emitter);
* gauges: `set_gauge` / `add_gauge`, with optional `labels` likewise; `gauge_fn(name, fn)`
  registers a gauge computed at scrape time (`fn() -> {labels: value}`);
* histograms: `histogram(name, labels)` returns the (cached) `Histogram` of one label set;
  `observe(value, n)` adds `n` observations of `value` (a batch of events with one latency).

`get(name)` is the total of a name over its label sets (what `/api/metrics` reports).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence

Labels = tuple[str, ...]

# Seconds: a live event is published within a loop turn or two (ADR 0011), a catch-up backlog
# or a slow store can take seconds.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class Histogram:
    """Bucketed observations of one label set, in plain ints: `counts[i]` is the number of
    observations `<= bounds[i]` and `> bounds[i-1]`; the last count is the overflow (+Inf)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds: tuple[float, ...] = tuple(sorted(bounds))
        self.counts: list[int] = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it), +Inf last: the Prometheus buckets."""
        out: list[tuple[float, int]] = []
        acc = 0
        for bound, c in zip((*self.bounds, float("inf")), self.counts, strict=True):
            acc += c
            out.append((bound, acc))
        return out


GaugeFn = Callable[[], Mapping[Labels, float]]


class Metrics:
    """Named counters (monotonic), gauges and histograms, optionally labelled. Cheap enough for
    the ingest hot path: an unlabelled `inc` is one dict update."""

    def __init__(self) -> None:
        self._counters: dict[str, float] = {}
        self._gauges: dict[str, float] = {}
        self._lcounters: dict[str, dict[Labels, float]] = {}
        self._lgauges: dict[str, dict[Labels, float]] = {}
        self._hists: dict[str, dict[Labels, Histogram]] = {}
        self._gauge_fns: dict[str, GaugeFn] = {}
        self._lock = threading.Lock()
        self._registry: object | None = None

    # -- counting ----------------------------------------------------------------------------

    def inc(self, name: str, by: float = 1, labels: Labels | None = None) -> None:
        if labels is None:
            c = self._counters
            c[name] = c.get(name, 0) + by
            return
        s = self._lcounters.get(name)
        if s is None:
            s = self._lcounters[name] = {}
        s[labels] = s.get(labels, 0) + by

    def series(self, name: str) -> dict[Labels, float]:
        """The live dict of a labelled counter (label values -> count): add to it directly."""
        s = self._lcounters.get(name)
        if s is None:
            s = self._lcounters[name] = {}
        return s

    def set_gauge(self, name: str, value: float, labels: Labels | None = None) -> None:
        if labels is None:
            self._gauges[name] = value
            return
        self._lgauges.setdefault(name, {})[labels] = value

    def add_gauge(self, name: str, by: float, labels: Labels | None = None) -> None:
        if labels is None:
            g = self._gauges
            g[name] = g.get(name, 0) + by
            return
        s = self._lgauges.setdefault(name, {})
        s[labels] = s.get(labels, 0) + by

    def gauge_fn(self, name: str, fn: GaugeFn) -> None:
        """A gauge computed when scraped: `fn()` gives its value per label set."""
        self._gauge_fns[name] = fn

    def histogram(
        self, name: str, labels: Labels = (), bounds: Sequence[float] | None = None
    ) -> Histogram:
        """The histogram of `name` for these label values (created on first use; keep it)."""
        fam = self._hists.get(name)
        if fam is None:
            fam = self._hists[name] = {}
        h = fam.get(labels)
        if h is None:
            if bounds is None:
                from prospero.core.metrics_catalog import buckets_for

                bounds = buckets_for(name)
            h = fam[labels] = Histogram(bounds)
        return h

    # -- reading -----------------------------------------------------------------------------

    def get(self, name: str) -> float:
        """A gauge's value or a counter's count, summed over its label sets."""
        if name in self._gauges or name in self._lgauges:
            return self._gauges.get(name, 0) + sum(self._lgauges.get(name, {}).values())
        return self._counters.get(name, 0) + sum(self._lcounters.get(name, {}).values())

    def labelled(self, name: str) -> dict[Labels, float]:
        """A copy of a labelled counter's or gauge's series (scrape-time gauges included)."""
        with self._lock:
            if name in self._gauge_fns:
                return dict(self._gauge_fns[name]())
            return dict(self._lcounters.get(name) or self._lgauges.get(name) or {})

    def histograms(self, name: str) -> dict[Labels, Histogram]:
        with self._lock:
            return dict(self._hists.get(name, {}))

    def counters(self) -> dict[str, float]:
        """Every counter's total (labelled ones summed)."""
        with self._lock:
            out = dict(self._counters)
            for name, s in list(self._lcounters.items()):
                out[name] = out.get(name, 0) + sum(list(s.values()))
            return out

    def gauges(self) -> dict[str, float]:
        """Every gauge's total (labelled ones summed; scrape-time ones not included)."""
        with self._lock:
            out = dict(self._gauges)
            for name, s in list(self._lgauges.items()):
                out[name] = out.get(name, 0) + sum(list(s.values()))
            return out

    def snapshot(self) -> dict[str, float]:
        out: dict[str, float] = self.counters()
        out.update(self.gauges())
        return out

    def state(
        self,
    ) -> tuple[
        dict[str, float],
        dict[str, float],
        dict[str, dict[Labels, float]],
        dict[str, dict[Labels, float]],
        dict[str, dict[Labels, Histogram]],
        dict[str, GaugeFn],
    ]:
        """Copies of everything, for one scrape (`core.metrics_export`)."""
        with self._lock:
            return (
                dict(self._counters),
                dict(self._gauges),
                {k: dict(v) for k, v in list(self._lcounters.items())},
                {k: dict(v) for k, v in list(self._lgauges.items())},
                {k: dict(v) for k, v in list(self._hists.items())},
                dict(self._gauge_fns),
            )

    @property
    def registry(self) -> object:
        """This Metrics' own prometheus_client `CollectorRegistry` (created on first use), so
        that many Runtimes in one process never share series (`core.metrics_export`)."""
        if self._registry is None:
            from prospero.core.metrics_export import new_registry

            self._registry = new_registry(self)
        return self._registry


# Counter names used across the core (kept here so the API can document them).
EVENTS_APPENDED = "events_appended"
APPEND_FAILURES = "append_failures"
# Events a fenced emitter dropped: written under a lease this replica no longer holds.
EVENTS_FENCED = "events_fenced"
UNKNOWN_FRAMES = "unknown_frames"
MALFORMED_LINES = "malformed_lines"
OVERSIZED_LINES = "oversized_lines"
STREAM_GAPS = "stream_gaps"
REPOS_POLLED = "repos_polled"
POLL_FAILURES = "poll_failures"
ACTIVE_ATTACHES = "active_attaches"
ATTACH_RECONNECTS = "attach_reconnects"
TRANSCRIPT_RECOVERIES = "transcript_recoveries"
BUS_LAGGED = "bus_lagged"
# Labelled families counted by the emitter as it publishes (core.event_metrics).
AGENTS_FINISHED = "agents_finished"
TURNS = "turns"
TOKENS = "tokens"
COST_USD = "cost_usd"
DECISIONS_RESOLVED = "decisions_resolved"
# Histograms.
INGEST_PUBLISH_SECONDS = "ingest_publish_seconds"
SSE_DELIVERY_SECONDS = "sse_delivery_seconds"
# Scrape-time gauges (the daemon registers them over its FleetManager).
AGENTS = "agents"
DRIVERS_ACTIVE = "drivers_active"
WORKSPACE_UP = "workspace_up"
