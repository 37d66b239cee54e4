"""The AgentDriver conformance suite, run against NdjsonDriver and the fake caliban worker."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest

from prospero.core.drivers.base import (
    AgentDriver,
    DriverExit,
    DriverOptions,
    DriverTarget,
    EventSink,
)
from prospero.core.drivers.ndjson import NdjsonDriver
from prospero.core.metrics import Metrics
from prospero.core.wire.control import Endpoint
from prospero.testkit import scripts
from prospero.testkit.fake_agent import FakeAgentWorker
from prospero.types.events import AgentFinished, ToolFinished, ToolStarted, TurnFinished
from tests.conformance.agent_driver import SESSION, AgentDriverConformance, Recorder
from tests.support import short_tmpdir, wait_until

LONG_LINES = 600


def session_script() -> scripts.Script:
    """The conformance "session" (tests/conformance/agent_driver.py SESSION) as TurnEvents."""
    model = SESSION["model"]
    read, bash = SESSION["read"], SESSION["bash"]
    script: scripts.Script = [
        scripts.turn_start(0, model=model),
        scripts.thinking_delta(SESSION["thinking"], 0, 0),
        scripts.text_delta(SESSION["text_before"], 0, 1),
    ]
    for tool, is_error in ((read, False), (bash, True)):
        args = json.dumps(tool["input"], separators=(",", ":"))
        half = len(args) // 2
        script += [
            scripts.tool_call_start(tool["id"], tool["name"], 0),
            scripts.tool_call_input_delta(tool["id"], args[:half], 0),
            scripts.tool_call_input_delta(tool["id"], args[half:], 0),
            scripts.tool_call_end(tool["id"], tool["result"], is_error=is_error, turn_index=0),
        ]
    script += [
        scripts.text_delta(SESSION["text_after"], 0, 2),
        scripts.turn_end(0, input_tokens=812, output_tokens=64),
        scripts.run_end("EndOfTurn", turn_count=1, input_tokens=812, output_tokens=64),
    ]
    return script


def _script(name: str) -> tuple[scripts.Script, float]:
    if name == "tool_run":
        return scripts.tool_run_script(model="claude-sonnet-4-6"), 0.0
    if name == "session":
        return session_script(), 0.0
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
    exact_reattach = True
    extra_kinds: frozenset[str] = frozenset()
    reports_tokens = True

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

    def make_driver(
        self, target: DriverTarget, sink: EventSink, *, include_thinking: bool = False
    ) -> AgentDriver:
        options = DriverOptions(
            include_thinking=include_thinking, backoff_base=0.01, backoff_cap=0.05, max_failures=5
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

    # NDJSON-only: caliban's per-model-call turns (ACP has one turn per prompt, see
    # docs/acp-mapping.md), so this stays outside the shared suite.
    async def test_tool_run_has_one_turn_finished_per_model_call(
        self, harness: NdjsonHarness
    ) -> None:
        target = await harness.start_agent("tool_run")
        rec = Recorder()
        driver = harness.make_driver(target, rec)
        assert await asyncio.wait_for(driver.run(), 20) is DriverExit.finished
        assert rec.kinds() == TOOL_RUN_KINDS
        started, finished = rec.events[1], rec.events[2]
        assert isinstance(started, ToolStarted) and isinstance(finished, ToolFinished)
        assert started.name == "Read" and started.input == {"path": "README.md"}
        assert finished.id == started.id and finished.name == "Read" and finished.ok
        assert finished.result is not None and finished.result.text == "# demo\nA tiny project.\n"
        turn0 = rec.events[3]
        assert isinstance(turn0, TurnFinished) and turn0.turn == 0
        assert turn0.usage is not None and turn0.usage.input_tokens == 812
        end = rec.events[-1]
        assert isinstance(end, AgentFinished)
        assert end.outcome == "EndOfTurn" and end.turns == 2
        assert end.usage is not None and (end.usage.input_tokens, end.usage.output_tokens) == (
            1713,
            76,
        )
        assert end.cost_usd is not None and end.cost_usd > 0
        assert driver.finished


TOOL_RUN_KINDS = [
    "output",
    "tool_started",
    "tool_finished",
    "turn_finished",
    "output",
    "turn_finished",
    "agent_finished",
]
