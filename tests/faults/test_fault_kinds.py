"""One test per fault kind of issue 9, through the real stack (fake caliband worker with a
FaultPlan -> NdjsonDriver -> FleetManager -> Emitter -> SQLite):

- the worker exits before the re-dial (reconnects refused for 1.2 s while the run ends; or
  refused until it exits) -> the tail comes from the transcript, nothing lost, no gap; with
  the transcript unreadable (remote) -> a gap, and the driver's own agent_finished;
- a crash without RunEnd -> agent_finished{outcome: crashed, detail}, open tool calls closed;
- bad frames (malformed, oversized > 1 MiB, unknown type) -> coalesced frames_skipped;
- a slow reader that loses lines in the broadcast, then a cut -> 0 duplicates.
"""

from __future__ import annotations

import dataclasses

import pytest

from prospero.testkit import scripts
from prospero.testkit.faults import BadFrames, FaultPlan, SlowReader, wire_lines
from prospero.types.events import AgentFinished, FleetEvent, FramesSkipped, StreamGap
from prospero.types.model import AgentStatus
from tests.faults.history import expected_of, judge, report, stream_of
from tests.faults.stack import CONFIG, Case, FaultStack, stack

__all__ = ["stack"]  # the shared fixture
from tests.support import wait_until


def finished_events(history: list[FleetEvent]) -> list[AgentFinished]:
    return [e.kind for e in history if isinstance(e.kind, AgentFinished)]


def gaps_of(history: list[FleetEvent]) -> list[StreamGap]:
    return [e.kind for e in history if isinstance(e.kind, StreamGap)]


async def status_is(stack: FaultStack, agent_id: str, status: AgentStatus) -> None:
    async def check() -> bool:
        await stack.manager.poll_workspace("app")
        return stack.manager.get_agent(agent_id).status == status

    await wait_until(check, 15, what=f"status {status.value}")


@pytest.mark.parametrize(
    "plan",
    [
        FaultPlan(cut_at=(1500,), refuse_ms=1200),
        FaultPlan(cut_at=(1500,), refuse_until_exit=True),
    ],
    ids=["refuse-1.2s", "refuse-until-exit"],
)
async def test_worker_exits_before_the_redial_tail_from_transcript(
    stack: FaultStack, plan: FaultPlan
) -> None:
    script = scripts.long_script(5000, per_turn=500)
    case = Case("exit", script, plan)
    w = await stack.spawn(case)
    history = await stack.settle(case, w)
    assert w.exited_detached, "precondition: the run ended while nobody was connected"
    v = judge(history, expected_of(wire_lines(script), stack.config.include_thinking))
    report(
        f"FAULT-SUITE kind exit-before-redial [{plan.describe()}]: exact={v.exact} gaps={v.gaps} "
        f"dup={v.duplicates} loss={v.silent_loss} {v.detail}"
    )
    assert v.exact and v.seq_ok, v.detail
    assert not gaps_of(history)
    assert [f.outcome for f in finished_events(history)] == ["EndOfTurn"]
    await status_is(stack, case.agent_id, AgentStatus.done)


async def test_worker_exits_before_the_redial_remote_transcript_gives_a_gap(
    stack: FaultStack,
) -> None:
    script = scripts.long_script(5000, per_turn=500)
    case = Case(
        "exitremote", script, FaultPlan(cut_at=(1500,), refuse_until_exit=True), remote=True
    )
    w = await stack.spawn(case)
    history = await stack.settle(case, w)
    assert w.exited_detached
    v = judge(
        history,
        expected_of(wire_lines(script), stack.config.include_thinking),
        concluded_outcomes=frozenset({"crashed"}),
    )
    report(
        f"FAULT-SUITE kind exit-before-redial remote: ok={v.ok} gaps={v.gaps} covered={v.covered} "
        f"dup={v.duplicates} loss={v.silent_loss} {v.detail}"
    )
    assert v.ok and v.gaps == 1 and v.duplicates == 0 and v.silent_loss == 0, v.detail
    (fin,) = finished_events(history)
    assert fin.outcome == "crashed" and fin.detail


async def check_caught_up_after_a_detached_exit(
    stack: FaultStack, key: str, remote: bool, line_delay: float, timeout: float, title: str
) -> None:
    """Reconnects are refused from line 1500 until the worker exits, so the run ends with
    nobody attached: the history must still be complete (local: exactly, from the transcript)
    or concluded `crashed` (remote), with one agent_finished and no seq hole."""
    script = scripts.long_script(3000, per_turn=500)
    plan = FaultPlan(cut_at=(1500,), refuse_until_exit=True, line_delay=line_delay)
    case = Case(key + ("remote" if remote else ""), script, plan, remote=remote)
    w = await stack.spawn(case)
    history = await stack.settle(case, w, timeout=timeout)
    assert w.exited_detached
    exp = expected_of(wire_lines(script), stack.config.include_thinking)
    v = judge(history, exp, concluded_outcomes=frozenset({"crashed"}) if remote else frozenset())
    report(
        f"FAULT-SUITE kind {title} ({'remote' if remote else 'local'}):"
        f" ok={v.ok} exact={v.exact} gaps={v.gaps} dup={v.duplicates} loss={v.silent_loss}"
        f" agent_finished={len(finished_events(history))} {v.detail}"
    )
    assert v.ok and v.seq_ok, v.detail
    assert len(finished_events(history)) == 1
    if not remote:
        assert v.exact


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
async def test_driver_out_of_budget_before_the_worker_exits_is_caught_up(
    stack: FaultStack, remote: bool
) -> None:
    """Refused dials spend the driver's budget (gave_up) while the worker still plays on; the
    run then ends with nobody attached. The agent is terminal and its history has no
    agent_finished: it must still be completed (transcript) or concluded (remote), never left
    open."""
    await check_caught_up_after_a_detached_exit(
        stack, "budget", remote, 0.002, 30, "budget spent before a detached exit"
    )


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
async def test_driver_gave_up_then_the_agent_ended_is_caught_up(
    monkeypatch: pytest.MonkeyPatch, remote: bool
) -> None:
    """The same with the default 2 s poll: the driver spends its budget (~1 s of refused
    dials) and returns `gave_up`; the worker ends its run ~1.5 s after the cut, before a poll
    re-attaches, so the next poll finds the agent terminal with no driver running and no
    agent_finished stored. It must be caught up all the same (issue 9, items 2-3)."""
    config = dataclasses.replace(CONFIG, poll_interval=2.0)
    stack = FaultStack(monkeypatch, config)
    await stack.start()
    try:
        await check_caught_up_after_a_detached_exit(
            stack, "gaveup", remote, 0.001, 20, "gave up, then the run ended"
        )
    finally:
        await stack.stop()


async def test_crash_without_run_end_finishes_crashed_and_closes_open_tools(
    stack: FaultStack,
) -> None:
    script = scripts.tool_run_script()
    # line 6 is the second input fragment of the tool call: the worker dies inside the call
    plan = FaultPlan(crash_at=6, crash_code=1)
    case = Case("crash", script, plan)
    w = await stack.spawn(case)
    history = await stack.settle(case, w)
    assert w.exit_code == 1 and len(w.history) == 6
    await status_is(stack, case.agent_id, AgentStatus.failed)
    history = await stack.history(case.agent_id)
    exp = expected_of(wire_lines(script, plan), stack.config.include_thinking).events
    got = [k.model_dump(mode="json") for k in stream_of(history)]
    report(f"FAULT-SUITE kind crash: {[g['kind'] for g in got]}")
    assert got[: len(exp)] == exp  # everything the worker wrote, the held-back tool included
    rest = got[len(exp) :]
    assert [r["kind"] for r in rest] == ["tool_finished", "agent_finished"], rest
    assert rest[0]["id"] == "toolu_01" and rest[0]["ok"] is False
    assert rest[1]["outcome"] == "crashed" and rest[1]["detail"]
    assert [e.seq for e in history] == list(range(1, len(history) + 1))


async def test_crash_of_a_long_run_is_recorded_once(stack: FaultStack) -> None:
    script = scripts.long_script(2000, per_turn=400)
    plan = FaultPlan(crash_at=1700, crash_code=1, cut_at=(1200,))
    case = Case("crashlong", script, plan)
    w = await stack.spawn(case)
    history = await stack.settle(case, w)
    assert w.exit_code == 1
    exp = expected_of(wire_lines(script, plan), stack.config.include_thinking).events
    got = [k.model_dump(mode="json") for k in stream_of(history)]
    assert got[: len(exp)] == exp
    assert [g["kind"] for g in got[len(exp) :]] == ["agent_finished"]
    (fin,) = finished_events(history)
    assert fin.outcome == "crashed" and fin.detail


async def test_bad_frames_are_skipped_visibly_and_counted_once(stack: FaultStack) -> None:
    script = scripts.long_script(300, per_turn=100)
    plan = FaultPlan(
        bad_frames=(
            BadFrames(after=50, kind="malformed", count=3),
            BadFrames(after=100, kind="oversized"),
            BadFrames(after=150, kind="unknown_type", count=2),
            BadFrames(after=200, kind="malformed"),
        ),
        cut_at=(160, 260),  # the replays carry the bad lines again: never counted twice
    )
    case = Case("bad", script, plan)
    w = await stack.spawn(case)
    history = await stack.settle(case, w)
    v = judge(history, expected_of(wire_lines(script, plan), stack.config.include_thinking))
    skipped = [e.kind for e in history if isinstance(e.kind, FramesSkipped)]
    report(
        f"FAULT-SUITE kind bad frames: exact={v.exact} frames_skipped={v.frames_skipped} events={len(skipped)}"
    )
    assert v.exact, v.detail
    assert v.frames_skipped == {"malformed": 4, "oversized": 1, "unknown_type": 2}
    assert 3 <= len(skipped) <= 4  # coalesced: one event per reason per read at most


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
async def test_slow_reader_drop_then_cut_has_no_duplicates(stack: FaultStack, remote: bool) -> None:
    script = scripts.long_script(3000, per_turn=1000)
    plan = FaultPlan(slow_readers=(SlowReader(at=300, lines=1500),), cut_at=(2200,))
    case = Case("slow", script, plan, remote=remote)
    w = await stack.spawn(case)
    history = await stack.settle(case, w)
    assert w.lines_dropped > 400, "precondition: the broadcast dropped lines for the reader"
    exp = expected_of(wire_lines(script), stack.config.include_thinking)
    v = judge(history, exp)
    outs = [e.kind.chunk for e in history if e.kind.kind == "output"]  # type: ignore[union-attr]
    dup = len(outs) - len(set(outs))
    where = "remote" if remote else "local"
    tail = f"wire-dropped={w.lines_dropped} dup={dup}"
    if remote:
        tail += f" missing={v.silent_loss} (a broadcast drop is invisible on the wire)"
    else:
        tail += f" ok={v.ok} exact={v.exact} gaps={v.gaps} loss={v.silent_loss} {v.detail}"
    report(f"FAULT-SUITE kind slow reader + cut ({where}): {tail}")
    assert dup == 0
    if not remote:
        assert v.ok and v.duplicates == 0 and v.silent_loss == 0, v.detail
        return
    # Remote: the hole is invisible on the wire (the next replay starts after it), so at most
    # the lines the broadcast dropped are missing, as one block, and nothing is repeated.
    expected_outs = [e["chunk"] for e in exp.events if e["kind"] == "output"]
    missing = [o for o in expected_outs if o not in set(outs)]
    assert len(missing) <= w.lines_dropped
    k = expected_outs.index(missing[0]) if missing else 0
    assert outs == expected_outs[:k] + expected_outs[k + len(missing) :]
    assert [f.outcome for f in finished_events(history)] == ["EndOfTurn"]
