"""AgentDriver conformance: what every data-path driver (NdjsonDriver, AcpDriver) must do.

ONE suite runs over both drivers (ADR 0011 decision 6, docs/acp-mapping.md): the same scripted
session yields the same event kinds, in the same order and with the same content, wherever
both protocols carry the data. A test module subclasses `AgentDriverConformance` and provides
a `harness` fixture implementing `DriverHarness`. The harness owns the fake agents (real
sockets) and plays these named scripts in its protocol:

- `"session"`: one prompt turn (`SESSION` below): thinking, text, a `Read` tool call of
  `{"path": "README.md"}` with result `"# demo\\nA tiny project.\\n"`, a failing `Bash` tool
  call of `{"command": "false"}` with result `"exit status 1"`, a closing text, the end of the
  run (`EndOfTurn`, 1 turn) with a cost reported or computable (> 0).
- `"interactive"`: one turn of output, then an input boundary: each user message produces a
  turn of output, end-of-input ends the run (`EndOfTurn`).
- `"long"`: many distinct text outputs (`expected_output("long")`), paced so the suite can
  cut connections while it runs, then the end of the run.
- `"endless"`: one text output, then nothing (the run never ends by itself).

Where the protocols differ by nature, the harness says so and the suite asserts each side:
`supports_cancel` (ACP cancels a turn, NDJSON raises Unsupported), `exact_reattach` (NDJSON
re-attaches to the worker's replay without loss; an ACP turn cut mid-way is lost and recorded
as `turn_lost`), `extra_kinds` (kinds only one protocol carries, e.g. ACP's `agent_init` with
the session id), `reports_tokens` (token usage on the wire).

Drivers are made with a small reconnect backoff; thinking is off unless a test asks for it.
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
    TurnLost,
)
from tests.support import wait_until

# The "session" script's content, shared by every harness.
SESSION: dict[str, Any] = {
    "prompt": "Summarise the README",
    "model": "claude-sonnet-4-6",
    "thinking": "Check the README first.",
    "text_before": "Let me read the README.",
    "read": {
        "id": "toolu_01",
        "name": "Read",
        "input": {"path": "README.md"},
        "result": "# demo\nA tiny project.\n",
    },
    "bash": {
        "id": "toolu_02",
        "name": "Bash",
        "input": {"command": "false"},
        "result": "exit status 1",
    },
    "text_after": "The README says this is a tiny project.",
}

SESSION_KINDS = [
    "output",  # thinking (only with include_thinking)
    "output",
    "tool_started",
    "tool_finished",
    "tool_started",
    "tool_finished",
    "output",
    "turn_finished",
    "agent_finished",
]


class DriverHarness(Protocol):
    protocol: str
    # Whether the protocol can cancel a turn (else cancel_turn must raise Unsupported).
    supports_cancel: bool
    # Whether a cut connection is re-attached without loss (else the turn is lost).
    exact_reattach: bool
    # Kinds only this protocol carries (ignored when comparing kinds across protocols).
    extra_kinds: frozenset[str]
    # Whether token usage is reported on the wire for the "session" script.
    reports_tokens: bool

    async def start_agent(self, script: str, *, interactive: bool = False) -> DriverTarget:
        """Start a fake agent playing the named script; return how to reach it."""
        ...

    def make_driver(
        self, target: DriverTarget, sink: EventSink, *, include_thinking: bool = False
    ) -> AgentDriver: ...

    def inbound(self, target: DriverTarget) -> list[dict[str, Any]]:
        """Steering the agent received, as `{"type": "UserMessage", "text": ...}` /
        `{"type": "EndInput"}` dicts (ACP: prompts after the spawn prompt / session/close)."""
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

    def kinds(self, ignore: frozenset[str] = frozenset()) -> list[str]:
        return [e.kind for e in self.events if e.kind not in ignore]

    def of(self, kind: str) -> list[EventKind]:
        return [e for e in self.events if e.kind == kind]

    def stdout(self) -> list[str]:
        return [e.chunk for e in self.events if isinstance(e, Output) and e.stream == "stdout"]

    def thinking(self) -> list[str]:
        return [e.chunk for e in self.events if isinstance(e, Output) and e.stream == "thinking"]


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
    @pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
    async def test_session_yields_the_same_kinds_in_order(
        self, harness: DriverHarness, thinking: bool
    ) -> None:
        target = await harness.start_agent("session")
        rec = Recorder()
        driver = harness.make_driver(target, rec, include_thinking=thinking)
        assert driver.protocol == harness.protocol
        assert await asyncio.wait_for(driver.run(), 20) is DriverExit.finished
        expected = SESSION_KINDS if thinking else SESSION_KINDS[1:]
        assert rec.kinds(harness.extra_kinds) == expected
        assert rec.thinking() == ([SESSION["thinking"]] if thinking else [])
        assert rec.stdout() == [SESSION["text_before"], SESSION["text_after"]]
        events = [e for e in rec.events if e.kind not in harness.extra_kinds]
        if thinking:
            events = events[1:]
        read_start, read_end, bash_start, bash_end = events[1:5]
        for start, end, tool in ((read_start, read_end, "read"), (bash_start, bash_end, "bash")):
            spec = SESSION[tool]
            assert isinstance(start, ToolStarted) and isinstance(end, ToolFinished)
            assert (start.id, start.name, start.input) == (spec["id"], spec["name"], spec["input"])
            assert (end.id, end.name) == (spec["id"], spec["name"])
            assert end.result is not None and end.result.text == spec["result"]
            assert not end.result.truncated
        assert isinstance(read_end, ToolFinished) and read_end.ok
        assert isinstance(bash_end, ToolFinished) and not bash_end.ok
        turn = events[-2]
        assert isinstance(turn, TurnFinished)
        assert (turn.turn, turn.stop_reason) == (0, "end_turn")
        assert turn.cost_usd is not None and turn.cost_usd > 0
        end = events[-1]
        assert isinstance(end, AgentFinished)
        assert (end.outcome, end.turns) == ("EndOfTurn", 1)
        assert end.cost_usd is not None and end.cost_usd > 0
        assert end.model == SESSION["model"]
        if harness.reports_tokens:
            assert turn.usage is not None and end.usage is not None
        else:
            # not reported: null, never a fake 0
            assert turn.usage is None and end.usage is None
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
        end = rec.events[-1]
        assert isinstance(end, AgentFinished) and end.outcome == "EndOfTurn"
        assert driver.finished

    async def test_finishes_cleanly_and_stays_finished(self, harness: DriverHarness) -> None:
        target = await harness.start_agent("session")
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
        if not harness.exact_reattach:
            # The driver owned the turn in flight: closing loses it, explicitly.
            lost = rec.of("turn_lost")
            assert len(lost) == 1 and isinstance(lost[0], TurnLost) and lost[0].turn == 0
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
        rec = Recorder()
        driver = harness.make_driver(target, rec)
        if harness.supports_cancel:
            async with running(driver) as task:
                await wait_until(lambda: len(rec.stdout()) >= 1, 10, what="first output")
                await driver.cancel_turn()
                # The turn ends `cancelled`; the (non-interactive) run then ends.
                assert await asyncio.wait_for(task, 15) is DriverExit.finished
            turns = [e for e in rec.events if isinstance(e, TurnFinished)]
            assert [(t.turn, t.stop_reason) for t in turns] == [(0, "cancelled")]
            end = rec.events[-1]
            assert isinstance(end, AgentFinished) and end.outcome == "Cancelled"
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
                if not harness.exact_reattach:
                    break  # the turn is lost with the connection: nothing left to cut
            assert await asyncio.wait_for(task, 30) is DriverExit.finished
        assert "stream_gap" not in rec.kinds()
        assert len(rec.of("agent_finished")) == 1
        out = rec.stdout()
        if harness.exact_reattach:
            assert out == expected
            assert "turn_lost" not in rec.kinds()
        else:
            # Never a duplicate (the agent's replay on rejoin is suppressed); the cut turn is
            # recorded as lost and its open output simply stops.
            assert out == expected[: len(out)] and len(out) < len(expected)
            assert len(rec.of("turn_lost")) == 1
            end = rec.events[-1]
            assert isinstance(end, AgentFinished) and end.outcome == "Error"
