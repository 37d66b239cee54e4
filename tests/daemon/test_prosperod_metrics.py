"""The issue's done-when for metrics: a real `prosperod` process, a fake caliband serving its
workspace, an agent run and a fleet SSE watcher; then `/metrics`, parsed with
prometheus_client's parser, carries labelled histograms (ingest -> publish by workspace,
publish -> SSE by stream) and the labelled counters of that run."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prospero.core.discovery import socket_path_for
from prospero.core.sources import canonical_root
from prospero.testkit import scripts
from prospero.testkit.fake_caliband import FakeCaliband
from tests.daemon.test_prosperod import Daemon, spawn_daemon
from tests.support import short_tmpdir, wait_until

T = 30.0


@pytest.fixture
async def daemons() -> AsyncIterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for d in started:
        if d.proc.returncode is None:
            d.proc.kill()
            await d.proc.wait()


async def test_prosperod_metrics_carry_labelled_histograms(
    tmp_path: Path, daemons: list[Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    rundir = short_tmpdir()
    monkeypatch.setenv("CALIBAN_DAEMON_RUNTIME_DIR", rundir)  # where both look for caliband
    root = tmp_path / "ws"
    root.mkdir()
    canon = canonical_root(str(root))
    fake = await FakeCaliband.start_unix(
        socket_path_for(canon), root=canon, script_for=lambda _spec: scripts.tool_run_script()
    )
    try:
        d = await spawn_daemon(tmp_path, "--addr", "127.0.0.1:0", CALIBAN_DAEMON_RUNTIME_DIR=rundir)
        daemons.append(d)
        url = await d.wait_url()
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            r = await c.post("/api/workspaces", json={"name": "ws", "root": str(root)})
            assert r.status_code == 201, r.text

            async def watch() -> None:
                async with c.stream(
                    "GET", "/api/stream", headers={"Accept": "text/event-stream"}
                ) as resp:
                    async for line in resp.aiter_lines():
                        if line.startswith("data: ") and '"agent_finished"' in line:
                            return  # the run's end reached the watcher live

            watcher = asyncio.create_task(watch())
            r = await c.post(
                "/api/workspaces/ws/agents", json={"prompt": "read it", "isolation": "shared"}
            )
            assert r.status_code == 201, r.text
            await asyncio.wait_for(watcher, T)
            text = ""

            async def counted() -> bool:
                nonlocal text
                text = (await c.get("/metrics")).text
                return 'prospero_agents_finished_total{outcome="done",workspace="ws"} 1.0' in text

            await wait_until(counted, T, what="the run counted in /metrics")
            fams = {f.name: f for f in text_string_to_metric_families(text)}
            for name, labels in (
                ("prospero_ingest_publish_seconds", {"workspace": "ws"}),
                ("prospero_sse_delivery_seconds", {"stream": "fleet"}),
            ):
                fam = fams[name]
                assert fam.type == "histogram"
                series = [
                    s
                    for s in fam.samples
                    if {k: v for k, v in s.labels.items() if k != "le"} == labels
                ]
                les = [s.labels["le"] for s in series if s.name == name + "_bucket"]
                assert len(les) >= 10 and les[-1] == "+Inf", les
                count = next(s.value for s in series if s.name == name + "_count")
                total = next(s.value for s in series if s.name == name + "_sum")
                assert count >= 1 and 0 <= total / count < 1.0, (name, count, total)
            tokens = {
                s.labels["type"]: s.value
                for s in fams["prospero_tokens"].samples
                if s.labels["workspace"] == "ws" and s.labels["model"] == scripts.DEFAULT_MODEL
            }
            assert tokens["input"] == 812 + 901 and tokens["output"] == 64 + 12
            kinds = {
                s.labels["kind"]
                for s in fams["prospero_events_appended"].samples
                if s.labels["workspace"] == "ws"
            }
            assert {
                "agent_spawned",
                "output",
                "tool_started",
                "turn_finished",
                "agent_finished",
            } <= kinds
        d.proc.send_signal(signal.SIGTERM)
        assert await d.finish() == 0
    finally:
        await fake.stop()
