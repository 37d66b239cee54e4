"""`Metrics` as Prometheus metric families: a custom prometheus_client collector that reads the
plain counts when scraped, on a `CollectorRegistry` of each `Metrics` (one per Runtime: tests
run many daemons in one process, so nothing goes to prometheus_client's global registry).

The registry also carries prometheus_client's process, platform and GC collectors
(`process_*`, `python_*`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import cast

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _float_to_go

from prospero.core.metrics import GaugeFn, Histogram, Labels, Metrics
from prospero.core.metrics_catalog import SPECS, MetricSpec

log = logging.getLogger(__name__)

PREFIX = "prospero_"

# A bucket bound as Prometheus writes it ("0.005", "1.0", "+Inf"): the client's own helper.
float_to_go = cast(Callable[[float], str], _float_to_go)


def exported_name(name: str) -> str:
    """`prospero_<name>`, with anything Prometheus does not allow in a name as `_`."""
    clean = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name)
    return PREFIX + clean


class MetricsCollector(Collector):
    """Every name of the catalogue (`core.metrics_catalog.SPECS`), at 0 until counted, so that
    dashboards and alerts do not see series appear out of nowhere (labelled families appear
    with their first series), and every other name counted."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._warned: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        counters, gauges, lcounters, lgauges, hists, fns = self.metrics.state()
        for name, spec in SPECS.items():
            if spec.kind == "histogram":
                yield self._histogram(name, spec, hists.get(name, {}))
            elif spec.kind == "counter":
                fam_c = CounterMetricFamily(exported_name(name), spec.help, labels=spec.labels)
                self._fill(fam_c, name, spec, counters.get(name), lcounters.get(name))
                yield fam_c
            else:
                fam_g = GaugeMetricFamily(exported_name(name), spec.help, labels=spec.labels)
                if name in fns:
                    series: Mapping[Labels, float] | None = self._call(name, fns[name])
                else:
                    series = lgauges.get(name)
                self._fill(fam_g, name, spec, gauges.get(name), series)
                yield fam_g
        # Names counted but not catalogued: exported plainly (a gauge name wins over a counter).
        for name in sorted(set(gauges) | set(lgauges) | set(fns)):
            if name not in SPECS:
                g = GaugeMetricFamily(exported_name(name), name.replace("_", " "))
                total = gauges.get(name, 0) + sum((lgauges.get(name) or {}).values())
                g.add_metric([], total)
                yield g
        for name in sorted(set(counters) | set(lcounters)):
            if name not in SPECS and name not in gauges and name not in lgauges:
                c = CounterMetricFamily(exported_name(name), name.replace("_", " "))
                c.add_metric([], counters.get(name, 0) + sum((lcounters.get(name) or {}).values()))
                yield c
        for name in sorted(hists):
            if name not in SPECS:
                yield self._histogram(name, MetricSpec("histogram", name, ()), hists[name])

    def _fill(
        self,
        family: CounterMetricFamily | GaugeMetricFamily,
        name: str,
        spec: MetricSpec,
        plain: float | None,
        series: Mapping[Labels, float] | None,
    ) -> None:
        n = len(spec.labels)
        if not n:
            total = (plain or 0) + sum((series or {}).values())
            family.add_metric([], total)
            return
        if plain:  # counted without labels: the series whose labels are all empty
            series = dict(series or {})
            key = ("",) * n
            series[key] = series.get(key, 0) + plain
        for labels, value in sorted((series or {}).items()):
            if len(labels) != n:
                self._warn(name, f"label values {labels!r} for labels {spec.labels!r}")
                continue
            family.add_metric(list(labels), value)

    @staticmethod
    def _histogram(
        name: str, spec: MetricSpec, series: Mapping[Labels, Histogram]
    ) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(exported_name(name), spec.help, labels=spec.labels)
        for labels, h in sorted(series.items()):
            if len(labels) != len(spec.labels):
                continue
            buckets = [(float_to_go(b), float(c)) for b, c in h.cumulative()]
            fam.add_metric(list(labels), buckets, h.sum)
        return fam

    def _call(self, name: str, fn: GaugeFn) -> Mapping[Labels, float] | None:
        try:
            return fn()
        except Exception as e:  # a scrape never fails for one gauge
            self._warn(name, f"its scrape-time function failed: {e!r}")
            return None

    def _warn(self, name: str, what: str) -> None:
        if name not in self._warned:
            self._warned.add(name)
            log.warning("metrics: %s: %s (skipped)", name, what)


def new_registry(metrics: Metrics) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MetricsCollector(metrics))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def render(metrics: Metrics, accept: str = "") -> tuple[bytes, str]:
    """The exposition of `metrics`' registry in the format the `Accept` header asks for
    (Prometheus text 0.0.4 by default, OpenMetrics when asked) and its content type."""
    encode, content_type = choose_encoder(accept)
    registry = metrics.registry
    assert isinstance(registry, CollectorRegistry)
    return encode(registry), content_type
