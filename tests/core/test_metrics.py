"""core.metrics (plain counts, labels, histograms), the scrape-time collector on a per-Metrics
registry (core.metrics_export), and what the emitter counts of what it publishes."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from prospero.core import metrics as m
from prospero.core.bus import InProcessBus
from prospero.core.emitter import Emitter
from prospero.core.metrics import Histogram, Metrics
from prospero.core.metrics_catalog import SPECS
from prospero.core.metrics_export import render
from prospero.core.store.sqlite.events import SqliteEventStore
from prospero.types.events import (
    AgentFinished,
    DecisionResolved,
    Output,
    TurnFinished,
    Usage,
)


def scrape(metrics: Metrics, accept: str = "") -> dict[str, list[Sample]]:
    body, _ = render(metrics, accept)
    return {f.name: f.samples for f in text_string_to_metric_families(body.decode())}


def value(samples: list[Sample], name: str, **labels: str) -> float | None:
    for s in samples:
        if s.name == name and s.labels == labels:
            return float(s.value)
    return None


def test_histogram_buckets_are_le_and_cumulative() -> None:
    h = Histogram((0.1, 1.0))
    h.observe(0.1)  # on a bound: in that bucket (le)
    h.observe(0.5, 3)  # three observations of one latency
    h.observe(7.0)
    assert h.counts == [1, 3, 1] and h.count == 5
    assert h.sum == 0.1 + 1.5 + 7.0
    assert h.cumulative() == [(0.1, 1), (1.0, 4), (float("inf"), 5)]


def test_counts_labels_and_totals() -> None:
    mt = Metrics()
    mt.inc("plain")
    mt.inc("plain", 2)
    mt.inc("lab", 1, ("a",))
    mt.inc("lab", 4, ("b",))
    s = mt.series("lab")
    s[("a",)] = s.get(("a",), 0) + 10  # the emitter's bulk path is the same dict
    mt.add_gauge("g", 2, ("x",))
    mt.add_gauge("g", -1, ("x",))
    mt.set_gauge("g", 5, ("y",))
    assert mt.get("plain") == 3 and mt.get("lab") == 15 and mt.get("g") == 6
    assert mt.labelled("lab") == {("a",): 11, ("b",): 4}
    snap = mt.snapshot()
    assert snap["plain"] == 3 and snap["lab"] == 15 and snap["g"] == 6
    assert mt.histogram("h", ("w",)) is mt.histogram("h", ("w",))  # cached per label set


def test_collector_exports_catalogue_labels_and_extras() -> None:
    mt = Metrics()
    mt.inc(m.EVENTS_APPENDED, 3, ("ws", "output"))
    mt.inc(m.EVENTS_APPENDED, 1, ("ws", "agent_finished"))
    mt.inc("something_new", 2)  # not catalogued: still exported
    mt.add_gauge("decisions_pending", 1, ("ws",))
    mt.histogram(m.INGEST_PUBLISH_SECONDS, ("ws",)).observe(0.002, 4)
    mt.inc(m.TOKENS, 5, ("ws",))  # wrong number of label values: skipped, not a failed scrape
    mt.gauge_fn(m.AGENTS, lambda: {("ws", "running", "acp"): 2})
    mt.gauge_fn(m.DRIVERS_ACTIVE, lambda: 1 / 0)  # type: ignore[arg-type, return-value]
    fams = scrape(mt)
    ev = fams["prospero_events_appended"]
    assert value(ev, "prospero_events_appended_total", workspace="ws", kind="output") == 3
    assert value(ev, "prospero_events_appended_total", workspace="ws", kind="agent_finished") == 1
    assert value(fams["prospero_something_new"], "prospero_something_new_total") == 2
    # every unlabelled catalogued name is there at 0 before it is first counted
    assert value(fams["prospero_append_failures"], "prospero_append_failures_total") == 0
    assert value(fams["prospero_api_sse_streams"], "prospero_api_sse_streams") == 0
    for name in SPECS:
        assert f"prospero_{name}" in fams, name
    assert (
        value(fams["prospero_decisions_pending"], "prospero_decisions_pending", workspace="ws") == 1
    )
    assert (
        value(
            fams["prospero_agents"],
            "prospero_agents",
            workspace="ws",
            status="running",
            protocol="acp",
        )
        == 2
    )
    assert fams["prospero_drivers_active"] == [] and fams["prospero_tokens"] == []
    hist = fams["prospero_ingest_publish_seconds"]
    b = "prospero_ingest_publish_seconds_bucket"
    assert value(hist, b, workspace="ws", le="0.001") == 0
    assert value(hist, b, workspace="ws", le="0.0025") == 4
    assert value(hist, b, workspace="ws", le="+Inf") == 4
    assert value(hist, "prospero_ingest_publish_seconds_count", workspace="ws") == 4
    assert value(hist, "prospero_ingest_publish_seconds_sum", workspace="ws") == 0.008
    # the registry's standard collectors
    assert "process_cpu_seconds" in fams and "python_info" in fams
    # OpenMetrics when asked
    body, ctype = render(mt, "application/openmetrics-text; version=1.0.0")
    assert ctype.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")


def test_registries_are_per_metrics() -> None:
    a, b = Metrics(), Metrics()
    a.inc(m.APPEND_FAILURES, 7)
    assert a.registry is a.registry and a.registry is not b.registry
    assert value(scrape(a)["prospero_append_failures"], "prospero_append_failures_total") == 7
    assert value(scrape(b)["prospero_append_failures"], "prospero_append_failures_total") == 0


async def test_emitter_counts_what_it_publishes_and_times_it(tmp_path: Path) -> None:
    store = SqliteEventStore(tmp_path / "e.db")
    await store.open()
    mt = Metrics()
    em = Emitter(store, InProcessBus(), mt)
    try:
        usage = Usage(
            input_tokens=100,
            output_tokens=10,
            cache_read_input_tokens=50,
            cache_creation_input_tokens=5,
        )
        await em.emit_many("ws", "a1", [("stdout", "x"), ("stdout", "y"), Output(chunk="z")])
        await em.emit("ws", "a1", TurnFinished(turn=0, model="m1", usage=usage, cost_usd=0.25))
        await em.emit_many(
            "ws",
            "a1",
            [
                TurnFinished(turn=1, model="m1", usage=usage, cost_usd=0.5),
                AgentFinished(outcome="EndOfTurn"),
            ],
        )
        await em.emit("other", "b1", AgentFinished(outcome="MaxTurnsReached"))
        await em.emit(
            "other", "b1", DecisionResolved(id="d", state="decided", option_kind="allow_once")
        )
        await em.flush()
        assert mt.get(m.EVENTS_APPENDED) == 8
        assert mt.labelled(m.EVENTS_APPENDED) == {
            ("ws", "output"): 3,
            ("ws", "turn_finished"): 2,
            ("ws", "agent_finished"): 1,
            ("other", "agent_finished"): 1,
            ("other", "decision_resolved"): 1,
        }
        assert mt.labelled(m.TURNS) == {("ws", "m1"): 2}
        assert mt.labelled(m.COST_USD) == {("ws", "m1"): 0.75}
        assert mt.labelled(m.TOKENS) == {
            ("ws", "m1", "input"): 200,
            ("ws", "m1", "output"): 20,
            ("ws", "m1", "cache_read"): 100,
            ("ws", "m1", "cache_write"): 10,
        }
        assert mt.labelled(m.AGENTS_FINISHED) == {("ws", "done"): 1, ("other", "failed"): 1}
        assert mt.labelled(m.DECISIONS_RESOLVED) == {("other", "decided", "allow_once"): 1}
        hists = mt.histograms(m.INGEST_PUBLISH_SECONDS)
        # every event is observed once, with the latency of the emit call it came in
        assert hists[("ws",)].count == 6 and hists[("other",)].count == 2
        assert 0 <= hists[("ws",)].sum / 6 < 5
    finally:
        await em.close()
        await store.close()
