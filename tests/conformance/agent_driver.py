"""AgentDriver conformance: what every data-path driver (NDJSON today, ACP next) must do.

A test module subclasses `AgentDriverConformance` and provides a `harness` fixture implementing
`DriverHarness`. The harness owns the fake agents (real sockets) and knows how to play these
named scripts in its protocol:

- `"tool_run"`: the two-turn run of turnevents-tool-run.ndjson (thinking, text, a `Read` tool
  call of `{"path": "README.md"}` with result `"# demo\\nA tiny project.\\n"`, a closing text
  turn, run end `EndOfTurn` after 2 turns, usage 1713/76) on model `claude-sonnet-4-6`.
- `"interactive"`: one turn of output, then an input boundary: each user message produces a
  turn of output, end-of-input ends the run (`EndOfTurn`).
- `"long"`: many distinct text outputs (`expected_output("long")`), paced so the suite can
  cut connections while it runs, then run end.
- `"endless"`: one text output, then nothing (the run never ends by itself).

Drivers are made with thinking off and a small reconnect backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol

import pytest

from prospero.core.drivers.base import AgentDriver, DriverExit, DriverTarget, EventSink
from prospero.core.errors import Unsupported
from prospero.types.events import (
    AgentFinished,
    EventKind,
    Output,
    ToolFinished,
    ToolStarted,
    TurnFinished,
)
from tests.support import wait_until

TOOL_RUN_KINDS = [
    "output",
    "tool_started",
    "tool_finished",
    "turn_finished",
    "output",
    "turn_finished",
    "agent_finished",
]


class DriverHarness(Protocol):
    protocol: str
    # Whether the protocol can cancel a turn (else cancel_turn must raise Unsupported).
    supports_cancel: bool

    async def start_agent(self, script: str, *, interactive: bool = False) -> DriverTarget:
        """Start a fake agent playing the named script; return how to reach it."""
        ...

    def make_driver(self, target: DriverTarget, sink: EventSink) -> AgentDriver: ...

    def inbound(self, target: DriverTarget) -> list[dict[str, Any]]:
        """Steering frames the agent received, as `{"type": "UserMessage", "text": ...}` /
        `{"type": "EndInput"}` dicts."""
        ...

    async def cut_connections(self, target: DriverTarget) -> None:
        """Drop every connection to the agent now (the agent keeps running)."""
        ...

    def expected_output(self, script: str) -> list[str]:
        """The `output` chunks (stdout) one uninterrupted run of `script` produces."""
        ...


class Recorder:
    """An EventSink that records events."""

    def __init__(self) -> None:
        self.events: list[EventKind] = []

    async def __call__(self, kind: EventKind) -> None:
        self.events.append(kind)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def of(self, kind: str) -> list[EventKind]:
        return [e for e in self.events if e.kind == kind]

    def stdout(self) -> list[str]:
        return [e.chunk for e in self.events if isinstance(e, Output) and e.stream == "stdout"]


@contextlib.asynccontextmanager
async def running(driver: AgentDriver) -> AsyncIterator[asyncio.Task[DriverExit]]:
    task = asyncio.create_task(driver.run())
    try:
        yield task
    finally:
        if not task.done():
            await driver.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10)


class AgentDriverConformance:
    async def test_tool_run_yields_expected_kinds_in_order(self, harness: DriverHarness) -> None:
        target = await harness.start_agent("tool_run")
        rec = Recorder()
        driver = harness.make_driver(target, rec)
        assert driver.protocol == harness.protocol
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

    async def test_steering_reaches_interactive_agent(self, harness: DriverHarness) -> None:
        target = await harness.start_agent("interactive", interactive=True)
        rec = Recorder()
        driver = harness.make_driver(target, rec)
        async with running(driver) as task:
            await wait_until(lambda: len(rec.stdout()) >= 1, 10, what="first output")
            before = len(rec.stdout())
            await driver.send_input("hello there")
            await wait_until(
                lambda: any(f.get("text") == "hello there" for f in harness.inbound(target)),
                10,
                what="UserMessage received",
            )
            await wait_until(lambda: len(rec.stdout()) > before, 10, what="reply output")
            assert not driver.finished
            await driver.end_input()
            assert await asyncio.wait_for(task, 15) is DriverExit.finished
        frames = harness.inbound(target)
        assert {"type": "UserMessage", "text": "hello there"} in frames
        assert {"type": "EndInput"} in frames
        assert rec.kinds()[-1] == "agent_finished"
        assert driver.finished

    async def test_finishes_cleanly_and_stays_finished(self, harness: DriverHarness) -> None:
        target = await harness.start_agent("tool_run")
        rec = Recorder()
        driver = harness.make_driver(target, rec)
        assert await asyncio.wait_for(driver.run(), 20) is DriverExit.finished
        assert len(rec.of("agent_finished")) == 1
        n = len(rec.events)
        # Running a finished driver again emits nothing and returns at once.
        assert await asyncio.wait_for(driver.run(), 5) is DriverExit.finished
        assert len(rec.events) == n
        await driver.close()

    async def test_close_stops_a_running_driver(self, harness: DriverHarness) -> None:
        target = await harness.start_agent("endless")
        rec = Recorder()
        driver = harness.make_driver(target, rec)
        task = asyncio.create_task(driver.run())
        await wait_until(lambda: len(rec.stdout()) >= 1, 10, what="first output")
        await asyncio.wait_for(driver.close(), 10)
        assert await asyncio.wait_for(task, 10) is DriverExit.closed
        assert not driver.finished
        assert "agent_finished" not in rec.kinds()
        # Closed is final.
        assert await asyncio.wait_for(driver.run(), 5) is DriverExit.closed

    async def test_close_before_run(self, harness: DriverHarness) -> None:
        target = await harness.start_agent("endless")
        rec = Recorder()
        driver = harness.make_driver(target, rec)
        await driver.close()
        assert await asyncio.wait_for(driver.run(), 5) is DriverExit.closed
        assert rec.events == []

    async def test_cancel_turn(self, harness: DriverHarness) -> None:
        target = await harness.start_agent("endless")
        driver = harness.make_driver(target, Recorder())
        if harness.supports_cancel:
            async with running(driver):
                await driver.cancel_turn()
        else:
            with pytest.raises(Unsupported):
                await driver.cancel_turn()

    async def test_reconnect_after_cuts_has_no_duplicate_and_no_gap(
        self, harness: DriverHarness
    ) -> None:
        target = await harness.start_agent("long")
        expected = harness.expected_output("long")
        rec = Recorder()
        driver = harness.make_driver(target, rec)
        async with running(driver) as task:
            for frac in (0.15, 0.4, 0.7):
                mark = int(len(expected) * frac)
                await wait_until(lambda m=mark: len(rec.stdout()) >= m, 20, what=f"{mark} outputs")
                await harness.cut_connections(target)
            assert await asyncio.wait_for(task, 30) is DriverExit.finished
        assert "stream_gap" not in rec.kinds()
        assert rec.stdout() == expected
        assert len(rec.of("agent_finished")) == 1
