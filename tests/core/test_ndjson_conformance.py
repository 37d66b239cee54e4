"""The AgentDriver conformance suite, run against NdjsonDriver and the fake caliban worker."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest

from prospero.core.drivers.base import AgentDriver, DriverOptions, DriverTarget, EventSink
from prospero.core.drivers.ndjson import NdjsonDriver
from prospero.core.metrics import Metrics
from prospero.core.wire.control import Endpoint
from prospero.testkit import scripts
from prospero.testkit.fake_agent import FakeAgentWorker
from tests.conformance.agent_driver import AgentDriverConformance
from tests.support import short_tmpdir, wait_until

LONG_LINES = 600


def _script(name: str) -> tuple[scripts.Script, float]:
    if name == "tool_run":
        return scripts.tool_run_script(model="claude-sonnet-4-6"), 0.0
    if name == "interactive":
        return scripts.interactive_script(), 0.0
    if name == "long":
        return scripts.long_script(LONG_LINES, per_turn=200), 0.002
    if name == "endless":
        return [scripts.turn_start(0), scripts.text_delta("hi"), scripts.sleep(3600)], 0.0
    raise KeyError(name)


class NdjsonHarness:
    protocol = "ndjson"
    supports_cancel = False

    def __init__(self) -> None:
        self.dir = short_tmpdir()
        self.workers: dict[str, FakeAgentWorker] = {}
        self.metrics = Metrics()
        self._tasks: list[asyncio.Task[None]] = []

    @staticmethod
    async def _resume_on_first_client(worker: FakeAgentWorker) -> None:
        await wait_until(lambda: worker.connections_total > 0, 60, interval=0.002)
        worker.resume()

    async def start_agent(self, script: str, *, interactive: bool = False) -> DriverTarget:
        agent_id = f"ag{len(self.workers):02d}"
        frames, delay = _script(script)
        worker = FakeAgentWorker(agent_id, frames, interactive=interactive, line_delay=delay)
        endpoint = await worker.serve_unix(f"{self.dir}/{agent_id}.sock")
        self.workers[agent_id] = worker
        # Play only once someone is connected: a short run must not finish (and its socket
        # vanish) before the driver dials.
        worker.start()
        worker.pause()
        self._tasks.append(asyncio.create_task(self._resume_on_first_client(worker)))

        async def resolve(ep: Endpoint = endpoint) -> Endpoint:
            return ep

        return DriverTarget(
            agent_id=agent_id, workspace="ws", resolve_endpoint=resolve, interactive=interactive
        )

    def make_driver(self, target: DriverTarget, sink: EventSink) -> AgentDriver:
        options = DriverOptions(
            include_thinking=False, backoff_base=0.01, backoff_cap=0.05, max_failures=5
        )
        return NdjsonDriver(target, sink, options, self.metrics)

    def inbound(self, target: DriverTarget) -> list[dict[str, Any]]:
        return self.workers[target.agent_id].inbound

    async def cut_connections(self, target: DriverTarget) -> None:
        self.workers[target.agent_id].cut_connections()

    def expected_output(self, script: str) -> list[str]:
        frames, _ = _script(script)
        return [
            f["text"]
            for f in frames
            if isinstance(f, dict) and f.get("type") == "AssistantTextDelta"
        ]

    async def aclose(self) -> None:
        for t in self._tasks:
            t.cancel()
        for w in self.workers.values():
            await w.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class TestNdjsonDriverConformance(AgentDriverConformance):
    @pytest.fixture
    async def harness(self) -> AsyncIterator[NdjsonHarness]:
        h = NdjsonHarness()
        try:
            yield h
        finally:
            await h.aclose()
