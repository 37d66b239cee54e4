"""How an ACP agent's history ends (issue 9 deliverable 8, driver side): a kill mid-turn is
`agent_finished{killed}` with its open calls closed (never "connection lost"), `conclude()` is
idempotent, caliband's terminal status ends the run promptly, and run totals count every turn."""

from __future__ import annotations

import asyncio

from prospero.core.drivers.base import DriverExit, DriverOptions
from prospero.testkit import acp_scripts as S
from prospero.types.events import AgentFinished, ToolFinished, TurnLost, Usage
from prospero.types.model import AgentStatus
from tests.conformance.agent_driver import Recorder
from tests.core.acp_support import Rig, rig
from tests.support import wait_until

__all__ = ["rig"]  # the shared fixture

T = 15.0


def busy_turn() -> S.AcpScript:
    return S.AcpScript(
        turns=[
            [
                S.text("on it"),
                S.tool_call("t1", "Bash", "execute", raw_input={"c": 1}),
                S.sleep(3600),
            ]
        ]
    )


async def test_conclude_mid_turn_closes_calls_and_finishes_killed_once(rig: Rig) -> None:
    peer = await rig.peer(busy_turn())
    rec = Recorder()
    d = rig.driver(rig.target(peer), rec)
    task = asyncio.create_task(d.run())
    await wait_until(lambda: "tool_started" in rec.kinds(), T)
    await d.conclude("killed", "killed by the user")
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    await d.conclude("crashed", "again")  # idempotent
    assert rec.kinds()[-3:] == ["tool_finished", "turn_lost", "agent_finished"]
    fin, lost, end = rec.events[-3:]
    assert isinstance(fin, ToolFinished) and not fin.ok
    assert isinstance(lost, TurnLost) and "connection" not in lost.reason
    assert isinstance(end, AgentFinished) and (end.outcome, end.detail) == (
        "killed",
        "killed by the user",
    )
    assert rec.kinds().count("agent_finished") == 1 and d.finished


async def test_a_drop_while_caliband_says_killed_is_a_kill_not_a_lost_connection(
    rig: Rig,
) -> None:
    peer = await rig.peer(busy_turn())
    status: list[AgentStatus | None] = [AgentStatus.running]
    target = rig.target(peer)
    target.status = lambda: status[0]
    rec = Recorder()
    # A large reconnect budget: the terminal status, not the budget, ends the run.
    opts = DriverOptions(backoff_base=0.01, backoff_cap=0.05, max_failures=1000)
    d = rig.driver(target, rec, opts)
    task = asyncio.create_task(d.run())
    await wait_until(lambda: "tool_started" in rec.kinds(), T)
    status[0] = AgentStatus.killed  # the manager's registry, before the worker is gone
    await peer.listener.stop()
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    assert rec.kinds()[-3:] == ["tool_finished", "turn_lost", "agent_finished"]
    lost, end = rec.events[-2:]
    assert isinstance(lost, TurnLost) and "connection to the agent was lost" not in lost.reason
    assert isinstance(end, AgentFinished) and end.outcome == "killed" and end.detail
    assert rec.kinds().count("turn_lost") == 1


async def test_conclude_on_an_idle_driver_that_gave_up(rig: Rig) -> None:
    peer = await rig.peer(S.simple_script("hi"))
    await peer.listener.stop()
    rec = Recorder()
    opts = DriverOptions(backoff_base=0.005, backoff_cap=0.01, max_failures=2)
    d = rig.driver(rig.target(peer), rec, opts)
    assert await asyncio.wait_for(d.run(), T) is DriverExit.gave_up
    await d.conclude("crashed", "the worker exited (failed) without ending its run")
    assert rec.kinds() == ["agent_finished"]
    assert await asyncio.wait_for(d.run(), T) is DriverExit.finished


async def test_run_totals_include_turns_driven_by_send(rig: Rig) -> None:
    script = S.AcpScript(
        turns=[
            [S.text("a"), S.stop("end_turn", input_tokens=10, output_tokens=1)],
            [S.text("b"), S.stop("end_turn", input_tokens=20, output_tokens=2)],
            [S.text("c"), S.stop("end_turn", input_tokens=30, output_tokens=3)],
        ]
    )
    peer = await rig.peer(script)
    rec = Recorder()
    d = rig.driver(rig.target(peer, interactive=True), rec)
    task = asyncio.create_task(d.run())
    await wait_until(lambda: rec.kinds().count("turn_finished") == 1, T)
    await d.send_input("more")
    await d.send_input("and more")
    await d.end_input()
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    end = rec.events[-1]
    assert isinstance(end, AgentFinished)
    assert end.turns == 3 and end.usage == Usage(input_tokens=60, output_tokens=6)


async def test_a_tool_call_id_reused_by_a_later_turn_keeps_its_events(rig: Rig) -> None:
    def turn(n: int) -> S.Turn:
        return [
            S.tool_call("call_1", "Read", "read", raw_input={"n": n}),
            S.tool_update("call_1", status="completed", raw_output=f"r{n}"),
            S.stop("end_turn"),
        ]

    peer = await rig.peer(S.AcpScript(turns=[turn(0), turn(1)]))
    rec = Recorder()
    d = rig.driver(rig.target(peer, interactive=True), rec)
    task = asyncio.create_task(d.run())
    await wait_until(lambda: rec.kinds().count("turn_finished") == 1, T)
    await d.send_input("again")
    await d.end_input()
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    assert rec.kinds() == [
        "agent_init",
        *["tool_started", "tool_finished", "turn_finished"] * 2,
        "agent_finished",
    ]
