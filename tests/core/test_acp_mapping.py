"""The ACP → event mapping as a pure unit (no sockets, no event loop): raw JSON-RPC messages in,
events out of the ordered queue, and the resume state folded from them."""

from __future__ import annotations

from typing import Any

from prospero.core.drivers.acp.mapping import (
    ACP_IGNORED_UPDATES,
    ACP_UNKNOWN_UPDATES,
    AcpMapper,
    outcome_for,
)
from prospero.core.drivers.acp.output import OutputQueue, Slot
from prospero.core.drivers.acp.resume import AcpResumeState, OpenTool
from prospero.core.metrics import Metrics
from prospero.types.events import (
    AgentFinished,
    AgentInit,
    EventKind,
    FileDiff,
    FramesSkipped,
    Output,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnLost,
    Usage,
    kind_to_json,
)


def upd(variant: str, **fields: Any) -> dict[str, Any]:
    return {"sessionId": "s1", "update": {"sessionUpdate": variant, **fields}}


def text(t: str) -> dict[str, Any]:
    return upd("agent_message_chunk", content={"type": "text", "text": t})


def tool(tid: str, title: str = "Read", **fields: Any) -> dict[str, Any]:
    return upd("tool_call", toolCallId=tid, title=title, **fields)


def tool_upd(tid: str, **fields: Any) -> dict[str, Any]:
    return upd("tool_call_update", toolCallId=tid, **fields)


class Rig:
    def __init__(self, **kw: Any) -> None:
        self.queue = OutputQueue()
        self.metrics = Metrics()
        self.holds: list[tuple[str, Slot]] = []
        self.mapper = AcpMapper(
            self.queue,
            agent_id="a1",
            metrics=self.metrics,
            on_hold=lambda tid, slot: self.holds.append((tid, slot)),
            **kw,
        )
        self.state = AcpResumeState()

    def take(self) -> list[EventKind]:
        """Ready events, folded into the state as the pump does."""
        out: list[EventKind] = []
        for slot in self.queue.take_ready():
            if slot.event is not None:
                self.state.apply(slot.event)
                out.append(slot.event)
            elif slot.mark is not None:
                slot.mark(self.state)
        return out


def test_a_turn_maps_in_wire_order_and_folds_into_the_state() -> None:
    r = Rig()
    m = r.mapper
    m.session_started("s1", None)
    m.begin_turn(0)
    r.queue.mark(lambda st: st.begin_turn(0, initial=True))
    m.update(upd("agent_thought_chunk", content={"type": "text", "text": "hmm"}))
    m.update(text("a"))
    m.update(tool("t1", kind="read", status="pending"))  # input unknown: held
    m.update(text("b"))  # waits behind the held start
    assert [type(e) for e in r.take()] == [AgentInit, Output, Output]
    assert r.state.in_flight == 0 and r.state.initial_prompt_sent
    m.update(tool_upd("t1", rawInput={"path": "x"}))
    evs = r.take()
    assert evs == [ToolStarted(id="t1", name="Read", input={"path": "x"}), Output(chunk="b")]
    assert r.state.open_tools == [OpenTool(id="t1", name="Read")]
    m.update(tool_upd("t1", status="completed", rawOutput="ok"))
    m.update(upd("usage_update", used=1, size=10, cost={"amount": 0.5, "currency": "USD"}))
    m.response(
        {"stopReason": "end_turn", "usage": {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7}}
    )
    evs = r.take()
    assert [type(e) for e in evs] == [ToolFinished, TurnFinished]
    fin, turn = evs
    assert isinstance(fin, ToolFinished) and fin.ok and fin.result is not None
    assert fin.result.text == "ok"
    assert isinstance(turn, TurnFinished) and turn.cost_usd == 0.5
    assert turn.usage == Usage(input_tokens=3, output_tokens=4)
    assert r.state.in_flight is None and r.state.open_tools == []
    assert r.state.cost_total == 0.5 and r.state.usage_total == turn.usage
    m.finish("EndOfTurn", None, 1)
    (end,) = r.take()
    assert isinstance(end, AgentFinished) and end.turns == 1 and end.cost_usd == 0.5
    assert r.state.terminal and r.state.outcome == "EndOfTurn"


def test_an_expired_hold_releases_the_start_without_input() -> None:
    r = Rig()
    r.mapper.begin_turn(0)
    r.mapper.update(tool("t1"))
    r.mapper.update(text("after"))
    assert r.take() == []
    ((tid, slot),) = r.holds
    r.mapper.expire_hold(tid, slot)
    assert r.take() == [ToolStarted(id="t1", name="Read", input=None), Output(chunk="after")]


def test_diff_content_rides_on_tool_started() -> None:
    # An edit announced with ACP `diff` content: the edits reach the event (the dashboard
    # renders them), with or without a rawInput; the result still renders them as text.
    r = Rig()
    r.mapper.begin_turn(0)
    diff = {"type": "diff", "path": "/w/a.py", "oldText": "x = 1\n", "newText": "x = 2\n"}
    new_file = {"type": "diff", "path": "/w/b.py", "newText": "print()\n"}
    r.mapper.update(tool("e1", "Edit a.py", kind="edit", status="pending", content=[diff]))
    r.mapper.update(tool_upd("e1", status="in_progress"))  # releases the held start
    r.mapper.update(
        tool("e2", "Write b.py", kind="edit", rawInput={"file_path": "/w/b.py"}, content=[new_file])
    )
    r.mapper.update(tool("r1", "Read", kind="read", rawInput={"path": "/w/a.py"}))
    r.mapper.update(tool_upd("e1", status="completed"))
    evs = r.take()
    assert evs[:3] == [
        ToolStarted(
            id="e1",
            name="Edit a.py",
            input=None,
            diffs=[FileDiff(path="/w/a.py", old_text="x = 1\n", new_text="x = 2\n")],
        ),
        ToolStarted(
            id="e2",
            name="Write b.py",
            input={"file_path": "/w/b.py"},
            diffs=[FileDiff(path="/w/b.py", old_text=None, new_text="print()\n")],
        ),
        ToolStarted(id="r1", name="Read", input={"path": "/w/a.py"}),
    ]
    # No `diffs` key at all on a call without (the JSON of every other tool_started is as it was).
    assert "diffs" not in kind_to_json(evs[2])
    assert kind_to_json(evs[0])["diffs"] == [
        {"path": "/w/a.py", "old_text": "x = 1\n", "new_text": "x = 2\n"}
    ]
    fin = evs[3]
    assert isinstance(fin, ToolFinished) and fin.result is not None
    assert "-x = 1\n+x = 2" in fin.result.text


def test_a_tool_call_id_reused_in_a_later_turn_is_a_new_call() -> None:
    r = Rig()
    m = r.mapper
    for turn in (0, 1):
        m.begin_turn(turn)
        m.update(tool("call_1", rawInput={"n": turn}))
        m.update(tool_upd("call_1", status="completed", rawOutput=f"r{turn}"))
        m.response({"stopReason": "end_turn"})
    kinds = [(e.kind, getattr(e, "id", None)) for e in r.take()]
    assert (
        kinds
        == [
            ("tool_started", "call_1"),
            ("tool_finished", "call_1"),
            ("turn_finished", None),
        ]
        * 2
    )
    # Within a turn, an update for a closed call is still ignored.
    m.begin_turn(2)
    m.update(tool("c", rawInput={}, status="completed"))
    m.update(tool_upd("c", status="failed"))
    assert [e.kind for e in r.take()] == ["tool_started", "tool_finished"]


def test_cancel_sent_makes_the_turn_cancelled_and_closes_open_calls() -> None:
    r = Rig()
    r.mapper.begin_turn(0)
    r.mapper.update(tool("t1", rawInput={"a": 1}))
    r.mapper.cancel_sent = True
    r.mapper.response({"stopReason": "end_turn"})
    fin, turn = r.take()[1:]
    assert isinstance(fin, ToolFinished) and not fin.ok and fin.result is not None
    assert fin.result.text.startswith("cancelled:")
    assert isinstance(turn, TurnFinished) and turn.stop_reason == "cancelled"


def test_a_lost_turn_closes_live_and_stored_open_calls_once() -> None:
    r = Rig()
    r.mapper.lose_turn(3, "prosperod stopped", [OpenTool(id="x", name="Bash")])
    evs = r.take()
    assert [e.kind for e in evs] == ["tool_finished", "turn_lost"]
    fin, lost = evs
    assert isinstance(fin, ToolFinished) and (fin.id, fin.name, fin.ok) == ("x", "Bash", False)
    assert isinstance(lost, TurnLost) and lost.turn == 3
    assert r.mapper.last_stop == "lost" and outcome_for(r.mapper.last_stop)[0] == "Error"


def test_unknown_updates_are_counted_ignored_ones_too_and_replay_is_suppressed() -> None:
    r = Rig()
    r.mapper.update(upd("notice", text="compacting"))
    r.mapper.update(upd("compaction_update", x=1))
    r.mapper.update(upd("tool_call"))  # a known variant without its required fields
    assert r.take() == [
        FramesSkipped(count=2, reason="unknown_type"),
        FramesSkipped(count=1, reason="malformed"),
    ]
    r.mapper.update(upd("plan", entries=[]))
    r.mapper.loading = True
    r.mapper.update(text("replayed"))
    r.mapper.response({})  # the session/load answer ends the replay
    r.mapper.update(text("live"))
    assert r.take() == [Output(chunk="live")]
    assert r.metrics.get(ACP_UNKNOWN_UPDATES) == 3 and r.metrics.get(ACP_IGNORED_UPDATES) == 1
    assert r.mapper.replayed_updates == 1
    assert r.mapper.unrecognized[0]["raw"]["sessionUpdate"] == "notice"


def test_thinking_off_and_permission_requests_announce_a_call() -> None:
    r = Rig(include_thinking=False)
    r.mapper.begin_turn(0)
    r.mapper.update(upd("agent_thought_chunk", content={"type": "text", "text": "hmm"}))
    r.mapper.permission_request(
        {
            "sessionId": "s1",
            "toolCall": {"toolCallId": "p1", "title": "rm -rf", "rawInput": {"cmd": "rm"}},
            "options": [{"optionId": "ok", "name": "OK", "kind": "allow_once"}],
        }
    )
    assert r.take() == [ToolStarted(id="p1", name="rm -rf", input={"cmd": "rm"})]


def test_state_versions() -> None:
    v1 = b'{"v": 1, "protocol": "acp", "session_id": "s", "turns": 2, "in_flight": 1}'
    st = AcpResumeState.load(v1)
    assert st is not None and st.v == 2 and st.initial_prompt_sent and st.in_flight == 1
    assert AcpResumeState.load(b'{"v": 1, "protocol": "ndjson"}') is None
    assert AcpResumeState.load(b'{"v": 9, "protocol": "acp"}') is None
    assert AcpResumeState.load(b"garbage") is None
    fresh = AcpResumeState(session_id="s", open_tools=[OpenTool(id="t", name="n")])
    again = AcpResumeState.load(fresh.dump())
    assert again == fresh
