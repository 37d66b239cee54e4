"""`/metrics` on a real prosperod stack (Runtime + uvicorn + fake caliband) after real traffic,
parsed with prometheus_client's own parser: labelled counters and gauges, the latency
histograms with their buckets, tokens and cost by workspace and model, pending decisions,
active drivers; one registry per Runtime; the metric set as docs/operations.md lists it."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from prospero.core.metrics_catalog import SPECS
from prospero.core.ratecard import Rate, RateCard
from prospero.testkit.scripts import DEFAULT_MODEL
from tests.api.conftest import SseReader, Stack, StackFactory, sse_headers
from tests.api.test_decisions_api import acp_stack, pending, spawn
from tests.support import wait_until

T = 20.0
DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"

Families = dict[str, list[Sample]]


async def scrape(client: httpx.AsyncClient) -> Families:
    r = await client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return {f.name: f.samples for f in text_string_to_metric_families(r.text)}


def val(fams: Families, family: str, sample: str | None = None, **labels: str) -> float | None:
    """The value of the sample named `sample` (default: the family's own name) with exactly
    these labels, or None when there is no such series."""
    name = sample or family
    for s in fams.get(family, []):
        if s.name == name and s.labels == labels:
            return float(s.value)
    return None


def buckets(fams: Families, family: str, **labels: str) -> list[tuple[float, float]]:
    """A histogram's (le, cumulative count) pairs for one label set, ascending."""
    out = [
        (float(s.labels["le"]), float(s.value))
        for s in fams.get(family, [])
        if s.name == family + "_bucket"
        and {k: v for k, v in s.labels.items() if k != "le"} == labels
    ]
    return sorted(out)


def check_histogram(fams: Families, family: str, min_count: float, **labels: str) -> float:
    """The histogram's buckets are Prometheus's (cumulative, ending at +Inf == _count) and its
    mean is plausible for a live path on one machine; returns the count."""
    bs = buckets(fams, family, **labels)
    assert len(bs) >= 10 and bs[-1][0] == float("inf"), bs
    counts = [c for _, c in bs]
    assert counts == sorted(counts), f"not cumulative: {bs}"
    count = val(fams, family, family + "_count", **labels)
    total = val(fams, family, family + "_sum", **labels)
    assert count is not None and total is not None
    assert counts[-1] == count >= min_count, (family, labels, count)
    assert 0 <= total / count < 1.0, f"mean {total / count:.3f} s"
    # nearly all of a live path's observations are well under a second
    under_1s = next(c for le, c in bs if le == 1.0)
    assert under_1s >= 0.9 * count, bs
    return count


async def read_until_finished(stack: Stack, path: str, finishes: int) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    async with stack.client.stream("GET", path, headers=sse_headers()) as resp:
        assert resp.status_code == 200
        reader = SseReader(resp)
        while (msg := await reader.next()) is not None:
            if msg.event is None:
                seen.append(msg.json())
                if sum(e["kind"]["kind"] == "agent_finished" for e in seen) >= finishes:
                    break
    return seen


async def test_metrics_after_real_traffic(make_stack: StackFactory) -> None:
    card = RateCard(rates={DEFAULT_MODEL: Rate(2.0, 8.0)})
    stack = await make_stack(rate_card=card)
    fleet = asyncio.create_task(read_until_finished(stack, "/api/stream", 2))
    a = await stack.spawn("tools")
    b = await stack.spawn("slow")
    await stack.wait_status(b, "running")

    # while `slow` runs: its driver, and the agents by status and protocol (read at scrape)
    async def driving() -> bool:
        fams = await scrape(stack.client)
        return (val(fams, "prospero_drivers_active", workspace="ws", protocol="ndjson") or 0) >= 1

    await wait_until(driving, T, what="drivers_active{ws,ndjson}")
    fams = await scrape(stack.client)
    assert (
        val(fams, "prospero_agents", workspace="ws", status="running", protocol="ndjson") or 0
    ) >= 1
    assert val(fams, "prospero_workspace_up", workspace="ws") == 1

    follow = asyncio.create_task(read_until_finished(stack, f"/api/agents/{b}/stream", 1))
    await wait_until(lambda: stack.runtime.metrics.get("api_sse_streams") >= 2, T, what="streams")
    assert (await stack.client.post(f"/api/agents/{b}/kill")).status_code == 202
    await asyncio.wait_for(follow, T)
    await asyncio.wait_for(fleet, T)
    await stack.wait_finished(a)
    json_appended = (await stack.client.get("/api/metrics")).json()["events_appended"]

    async def settled() -> bool:
        nonlocal fams
        fams = await scrape(stack.client)
        appended = sum(
            float(s.value)
            for s in fams["prospero_events_appended"]
            if s.name == "prospero_events_appended_total" and s.labels["workspace"] == "ws"
        )
        observed = val(
            fams,
            "prospero_ingest_publish_seconds",
            "prospero_ingest_publish_seconds_count",
            workspace="ws",
        )
        return (
            val(
                fams,
                "prospero_agents_finished",
                "prospero_agents_finished_total",
                workspace="ws",
                outcome="killed",
            )
            == 1
            and val(
                fams, "prospero_turns", "prospero_turns_total", workspace="ws", model=DEFAULT_MODEL
            )
            == 3
            and observed == appended  # every committed event timed once
        )

    await wait_until(settled, T, what="both runs counted, every event timed")

    def total(family: str, **labels: str) -> float | None:
        return val(fams, family, family + "_total", **labels)

    ev = "prospero_events_appended"
    assert (total(ev, workspace="ws", kind="output") or 0) > 0
    assert total(ev, workspace="ws", kind="agent_finished") == 2
    assert total(ev, workspace="ws", kind="tool_started") == 1
    all_events = sum(float(s.value) for s in fams[ev] if s.name == ev + "_total")
    assert all_events >= json_appended  # the same counter, read a moment later
    assert total("prospero_agents_finished", workspace="ws", outcome="done") == 1
    # tokens and cost by workspace and model (tool_run_script: 812 + 901 in, 64 + 12 out; the
    # killed run's finished turn: 10 in, 1 out), priced by the stack's rate card
    assert total("prospero_tokens", workspace="ws", model=DEFAULT_MODEL, type="input") == 1723
    assert total("prospero_tokens", workspace="ws", model=DEFAULT_MODEL, type="output") == 77
    cost = total("prospero_cost_usd", workspace="ws", model=DEFAULT_MODEL)
    assert cost is not None and abs(cost - (1723 * 2.0 + 77 * 8.0) / 1e6) < 1e-9
    # latency histograms: ingest -> publish by workspace, publish -> SSE write by stream
    check_histogram(fams, "prospero_ingest_publish_seconds", 10, workspace="ws")
    check_histogram(fams, "prospero_sse_delivery_seconds", 1, stream="fleet")
    check_histogram(fams, "prospero_sse_delivery_seconds", 1, stream="agent")
    # the API's own series
    assert (total("prospero_api_requests", method="GET", code="200") or 0) >= 5
    assert (total("prospero_api_requests", method="POST", code="201") or 0) == 2
    assert (total("prospero_api_requests", method="POST", code="202") or 0) == 1
    assert (total("prospero_repos_polled", workspace="ws") or 0) > 0
    assert total("prospero_poll_failures", workspace="ws") is None  # never failed: no series
    # unlabelled names of before keep their names and types
    assert val(fams, "prospero_active_attaches") is not None
    assert total("prospero_append_failures") == 0
    assert "process_cpu_seconds" in fams and "python_info" in fams
    # JSON: the totals, as before
    body = (await stack.client.get("/api/metrics")).json()
    for key in (
        "events_appended",
        "append_failures",
        "unknown_frames",
        "repos_polled",
        "active_attaches",
    ):
        assert isinstance(body[key], int), key


async def test_pending_decisions_and_acp_drivers(make_stack: StackFactory) -> None:
    stack = await acp_stack(make_stack)
    agent_id = await spawn(stack)  # supervised: its edit waits for a human
    [d] = await pending(stack, agent_id)
    fams = await scrape(stack.client)
    assert val(fams, "prospero_decisions_pending", workspace="ws") == 1
    assert val(fams, "prospero_drivers_active", workspace="ws", protocol="acp") == 1
    agents = [s for s in fams["prospero_agents"] if s.labels["protocol"] == "acp"]
    assert [s.labels["workspace"] for s in agents] == ["ws"] and agents[0].value == 1
    r = await stack.client.post(f"/api/decisions/{d['id']}", json={"option_id": "reject-always"})
    assert r.status_code == 200, r.text

    async def resolved() -> bool:
        nonlocal fams
        fams = await scrape(stack.client)
        return (
            val(
                fams,
                "prospero_decisions_resolved",
                "prospero_decisions_resolved_total",
                workspace="ws",
                state="decided",
                option="reject_always",
            )
            == 1
        )

    await wait_until(resolved, T, what="decision_resolved counted")
    assert val(fams, "prospero_decisions_pending", workspace="ws") == 0


async def test_each_runtime_has_its_own_registry(make_stack: StackFactory) -> None:
    first = await make_stack()
    second = await make_stack()
    agent = await first.spawn()
    await first.wait_finished(agent)
    one, two = await scrape(first.client), await scrape(second.client)
    spawned = ("prospero_events_appended", "prospero_events_appended_total")
    assert val(one, *spawned, workspace="ws", kind="agent_spawned") == 1
    assert val(two, *spawned, workspace="ws", kind="agent_spawned") is None
    assert first.runtime.metrics.registry is not second.runtime.metrics.registry


async def test_openmetrics_when_asked(stack: Stack) -> None:
    r = await stack.client.get(
        "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert r.text.endswith("# EOF\n")
    names = {f.name for f in openmetrics_families(r.text)}
    assert "prospero_ingest_publish_seconds" in names


def test_the_metric_set_is_documented() -> None:
    text = DOCS.read_text().split("## Health and metrics", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`prospero_([a-z0-9_]+)`", text))
    assert set(SPECS) <= documented, sorted(set(SPECS) - documented)
    assert documented <= set(SPECS), sorted(documented - set(SPECS))
