"""A turn is driven at most once (issue 9 deliverable 6): the resume state is committed with its
events, the spawn prompt is never re-sent, a turn in flight at a hard stop is lost once with its
open tool calls closed, and only agents spawned here (or adopted) are driven."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from prospero.core.decisions import DecisionConfig, DecisionService
from prospero.core.drivers.acp import registry
from prospero.core.drivers.acp.driver import STOPPED_MID_TURN
from prospero.core.drivers.acp.resume import AcpResumeState
from prospero.core.drivers.base import DriverExit
from prospero.core.metrics import Metrics
from prospero.core.permissions import PermissionOutcome, PermissionRequest
from prospero.core.store.sqlite.decisions import SqliteDecisionStore
from prospero.testkit import acp_scripts as S
from prospero.types.events import (
    AgentFinished,
    CompactKind,
    EventKind,
    ToolFinished,
    TurnLost,
    expand_kind,
)
from prospero.types.model import AgentMeta
from tests.core.acp_support import MemoryCursorStore, Rig, rig
from tests.support import wait_until

__all__ = ["rig"]  # the shared fixture

T = 15.0


class CursorSink:
    """A batch sink with contract 1: events and the cursor commit together (here: at once),
    into `committed` (the store's cursors row) and `events` (the store's history)."""

    def __init__(self, store: MemoryCursorStore, agent_id: str) -> None:
        self.store = store
        self.agent_id = agent_id
        self.events: list[EventKind] = []
        self.batches: list[tuple[int, bytes | None]] = []
        self.flushes = 0

    async def __call__(self, kind: EventKind) -> None:
        self.events.append(kind)

    async def emit_batch(self, kinds: list[CompactKind], cursor: bytes | None = None) -> None:
        self.events.extend(expand_kind(k) for k in kinds)
        if cursor is not None:
            self.store.data[self.agent_id] = cursor
        self.batches.append((len(kinds), cursor))

    async def flush(self) -> None:
        self.flushes += 1

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def state(self) -> AcpResumeState:
        st = AcpResumeState.load(self.store.data.get(self.agent_id))
        assert st is not None
        return st


def hard_stop(d: Any, task: asyncio.Task[Any]) -> None:
    """A prosperod killed -9: the run task dies, nothing more is emitted or saved by it."""
    task.cancel()
    registry._REGISTRY.pop(d.target.agent_id, None)


async def test_the_turn_begin_is_committed_before_its_prompt_goes_out(rig: Rig) -> None:
    peer = await rig.peer(S.simple_script("hi"))
    target = rig.target(peer)
    store = MemoryCursorStore()
    sink = CursorSink(store, target.agent_id)
    seen: list[AcpResumeState] = []

    def at_prompt(ev: Any) -> None:
        if ev.direction.value == "outgoing" and ev.message.get("method") == "session/prompt":
            seen.append(sink.state())

    d = rig.driver(target, sink, cursor_store=store, observers=[at_prompt])
    assert await asyncio.wait_for(d.run(), T) is DriverExit.finished
    (st,) = seen
    assert st.in_flight == 0 and st.initial_prompt_sent and st.turns == 1
    assert sink.flushes >= 1  # made durable before the prompt was written
    assert sink.kinds() == ["agent_init", "output", "turn_finished", "agent_finished"]
    # Every batch that carried events carried the state covering them.
    assert all(c is not None for n, c in sink.batches if n)
    final = sink.state()
    assert final.terminal and final.in_flight is None and final.outcome == "EndOfTurn"


async def test_a_hard_stop_mid_turn_is_lost_once_with_its_open_calls_and_never_reprompted(
    rig: Rig,
) -> None:
    script = S.AcpScript(
        turns=[
            [
                S.text("working"),
                S.tool_call("t1", "Bash", "execute", raw_input={"c": 1}),
                S.sleep(3600),
            ]
        ]
    )
    peer = await rig.peer(script)
    target = rig.target(peer, interactive=True)
    store = MemoryCursorStore()
    sink = CursorSink(store, target.agent_id)
    d1 = rig.driver(target, sink, cursor_store=store)
    t1 = asyncio.create_task(d1.run())
    await wait_until(lambda: "tool_started" in sink.kinds(), T)
    await wait_until(lambda: sink.state().open_tools != [], T)
    hard_stop(d1, t1)
    with pytest.raises(asyncio.CancelledError):
        await t1
    st = sink.state()
    assert st.in_flight == 0 and [t.id for t in st.open_tools] == ["t1"]
    before = len(sink.events)

    d2 = rig.driver(target, sink, cursor_store=store)  # the restarted prosperod
    t2 = asyncio.create_task(d2.run())
    await wait_until(lambda: peer.agent.loads == [d1.session_id], T)
    new = sink.events[before:]
    assert [e.kind for e in new] == ["tool_finished", "turn_lost"]
    fin, lost = new
    assert isinstance(fin, ToolFinished) and fin.id == "t1" and not fin.ok and fin.name == "Bash"
    assert isinstance(lost, TurnLost) and lost.turn == 0 and lost.reason == STOPPED_MID_TURN
    assert sink.state().in_flight is None and sink.state().open_tools == []
    hard_stop(d2, t2)
    with pytest.raises(asyncio.CancelledError):
        await t2

    before = len(sink.events)
    d3 = rig.driver(target, sink, cursor_store=store)  # and once more
    t3 = asyncio.create_task(d3.run())
    await wait_until(lambda: len(peer.agent.loads) == 2, T)
    await d3.send_input("next")
    await wait_until(lambda: "turn_finished" in sink.kinds()[before:], T)
    await d3.end_input()
    assert await asyncio.wait_for(t3, T) is DriverExit.finished
    assert "turn_lost" not in sink.kinds()[before:]  # not repeated
    assert peer.agent.prompts == ["do the thing", "next"]  # the spawn prompt went out once
    end = sink.events[-1]
    assert isinstance(end, AgentFinished) and end.turns == 2


async def test_an_agent_not_spawned_here_is_never_driven(rig: Rig) -> None:
    peer = await rig.peer(S.simple_script("hi"))
    target = rig.target(peer)
    assert target.meta is not None
    target.meta = AgentMeta(agent_id=target.agent_id, workspace="ws", drive_protocol="acp")
    d = rig.driver(target, rig_recorder := _Rec(), cursor_store=MemoryCursorStore())
    assert await asyncio.wait_for(d.run(), T) is DriverExit.closed
    assert await asyncio.wait_for(d.run(), T) is DriverExit.closed
    assert peer.listener.connections_total == 0 and rig_recorder.events == []
    assert not d.drivable


async def test_an_adopted_agent_is_driven_without_the_spawn_prompt(rig: Rig) -> None:
    peer = await rig.peer(S.simple_script("hi"))
    target = rig.target(peer)  # one-shot spec: adoption still waits for input
    target.meta = AgentMeta(
        agent_id=target.agent_id, workspace="ws", drive_protocol="acp", adopted=True
    )
    rec = _Rec()
    d = rig.driver(target, rec)
    task = asyncio.create_task(d.run())
    await wait_until(lambda: rec.kinds() == ["agent_init"], T)
    await d.send_input("take over")
    await wait_until(lambda: "turn_finished" in rec.kinds(), T)
    await d.end_input()
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    assert peer.agent.prompts == ["take over"]


class DecisionBroker:
    """A broker with the DecisionService's `cancel_agent`, recording when it is called."""

    def __init__(self, rec: _Rec) -> None:
        self.rec = rec
        self.cancelled: list[tuple[str, list[str]]] = []

    async def decide(self, request: PermissionRequest) -> PermissionOutcome:
        return PermissionOutcome.cancelled("user")

    async def cancel_agent(self, agent_id: str, reason: str) -> int:
        self.cancelled.append((reason, self.rec.kinds()))
        return 1


async def test_not_resumable_ends_pending_decisions_before_agent_finished(rig: Rig) -> None:
    peer = await rig.peer(S.simple_script("hi"), load_session=False)
    target = rig.target(peer)
    store = MemoryCursorStore()
    store.data[target.agent_id] = AcpResumeState(
        session_id="sess-old", turns=1, initial_prompt_sent=True
    ).dump()
    rec = _Rec()
    broker = DecisionBroker(rec)
    d = rig.driver(target, rec, cursor_store=store, broker=broker)
    assert await asyncio.wait_for(d.run(), T) is DriverExit.finished
    assert rec.kinds() == ["stream_gap", "agent_finished"]
    ((reason, kinds_then),) = broker.cancelled
    assert "NotResumable" in reason and "agent_finished" not in kinds_then
    assert peer.agent.prompts == []
    assert orjson.loads(store.data[target.agent_id])["terminal"] is True


class _Rec:
    """The agent's stream: the driver's sink and a DecisionService's emitter in one list."""

    def __init__(self) -> None:
        self.events: list[EventKind] = []

    async def __call__(self, kind: EventKind) -> None:
        self.events.append(kind)

    async def emit(self, repo: str, agent_id: str, kind: EventKind) -> None:
        self.events.append(kind)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


async def test_a_decision_orphaned_by_a_restart_ends_when_the_session_is_not_resumable(
    rig: Rig, tmp_path: Path
) -> None:
    """Issue 9 item 14: the pending decision of a session that cannot be rejoined is cancelled
    as the driver finds that out — not after the 30 s rejoin grace, not after agent_finished."""
    db = tmp_path / "decisions.db"
    rec = _Rec()
    script = S.AcpScript(
        turns=[
            [
                S.tool_call("e1", "Edit a.py", "edit", raw_input={"path": "a.py"}),
                S.permission("e1", title="Edit a.py"),
            ]
        ]
    )
    peer = await rig.peer(script, load_session=False)
    target = rig.target(peer, interactive=True, posture="supervised")
    cursors = MemoryCursorStore()
    svc1 = DecisionService(SqliteDecisionStore(db), rec, Metrics(), DecisionConfig())
    await svc1.start()
    d1 = rig.driver(target, rec, cursor_store=cursors, broker=svc1)
    t1 = asyncio.create_task(d1.run())

    async def pending() -> bool:
        return len(await svc1.query(state="pending")) == 1

    await wait_until(pending, T, what="a pending decision")
    svc1.begin_shutdown()
    await d1.close()
    await asyncio.wait_for(t1, T)
    await svc1.close()

    svc2 = DecisionService(SqliteDecisionStore(db), rec, Metrics(), DecisionConfig())
    await svc2.start()
    try:
        before = len(rec.events)
        d2 = rig.driver(target, rec, cursor_store=cursors, broker=svc2)
        assert await asyncio.wait_for(d2.run(), T) is DriverExit.finished
        assert await svc2.query(state="pending") == []
        kinds = rec.kinds()[before:]
        assert kinds.index("decision_resolved") < kinds.index("agent_finished")
        end = rec.events[-1]
        assert isinstance(end, AgentFinished) and end.outcome == "NotResumable"
    finally:
        await svc2.close()
