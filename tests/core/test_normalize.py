"""Golden and fuzz tests for the TurnEvent normaliser."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prospero.core.metrics import MALFORMED_LINES, UNKNOWN_FRAMES, Metrics
from prospero.core.normalize import (
    RESULT_TEXT_CAP,
    Normalizer,
    NormalizerOptions,
    normalize_lines,
    parse_usage,
)
from prospero.core.ratecard import RateCard
from prospero.types.events import (
    AgentFinished,
    EventKind,
    Output,
    ToolFinished,
    ToolResult,
    ToolStarted,
    TurnFinished,
    Usage,
    kind_to_json,
)
from tests.support import fixture_lines

SONNET = RateCard().rate_for("claude-sonnet-4-6")
assert SONNET is not None


def _cost(inp: int, out: int) -> float:
    return round((inp * SONNET.input_per_mtok + out * SONNET.output_per_mtok) / 1_000_000, 10)


def _norm(name: str, metrics: Metrics | None = None, **opts: Any) -> list[EventKind]:
    lines = [ln.encode() for ln in fixture_lines(name)]
    return normalize_lines(lines, NormalizerOptions(**opts), metrics)


def test_tool_run_golden() -> None:
    metrics = Metrics()
    events = _norm("turnevents-tool-run.ndjson", metrics)
    assert events == [
        Output(stream="stdout", chunk="Let me read the README."),
        ToolStarted(id="toolu_01", name="Read", input={"path": "README.md"}),
        ToolFinished(
            id="toolu_01",
            name="Read",
            ok=True,
            result=ToolResult(text="# demo\nA tiny project.\n", truncated=False),
        ),
        TurnFinished(
            turn=0,
            stop_reason="tool_use",
            model="claude-sonnet-4-6",
            usage=Usage(input_tokens=812, output_tokens=64),
            cost_usd=_cost(812, 64),
        ),
        Output(stream="stdout", chunk="The README says this is a tiny project."),
        TurnFinished(
            turn=1,
            stop_reason="end_turn",
            model="claude-sonnet-4-6",
            usage=Usage(input_tokens=901, output_tokens=12),
            cost_usd=_cost(901, 12),
        ),
        AgentFinished(
            outcome="EndOfTurn",
            cost_usd=_cost(1713, 76),
            turns=2,
            usage=Usage(input_tokens=1713, output_tokens=76),
            model="claude-sonnet-4-6",
            detail=None,
        ),
    ]
    fin = events[-1]
    assert isinstance(fin, AgentFinished) and fin.cost_usd == pytest.approx(0.006279)
    assert metrics.get(UNKNOWN_FRAMES) == 0 and metrics.get(MALFORMED_LINES) == 0


def test_tool_run_with_thinking() -> None:
    events = _norm("turnevents-tool-run.ndjson", include_thinking=True)
    assert events[0] == Output(stream="thinking", chunk="Check the README first.")
    assert [e.kind for e in events] == [
        "output",
        "output",
        "tool_started",
        "tool_finished",
        "turn_finished",
        "output",
        "turn_finished",
        "agent_finished",
    ]


def test_edge_cases_golden() -> None:
    metrics = Metrics()
    events = _norm("turnevents-edge-cases.ndjson", metrics)
    denied = (
        "Tool call denied: permission denied: 'Bash' requires interactive approval (no TTY); "
        "re-run with `--allow 'Bash(<glob>)'` to allow specific commands, or `--auto-allow` to "
        "allow all Ask-rule tools (dangerous)"
    )
    assert events == [
        ToolFinished(id="tu_1", name="", ok=False, result=ToolResult(text="", truncated=False)),
        ToolFinished(id="toolu_02", name="", ok=False, result=ToolResult(text=denied)),
        AgentFinished(outcome="MaxTurnsReached", turns=10, detail="10", usage=None, cost_usd=None),
        AgentFinished(
            outcome="EndOfTurn",
            turns=1,
            usage=Usage(input_tokens=0, output_tokens=0),
            cost_usd=None,  # no TurnStart => no model => not priced
        ),
        AgentFinished(
            outcome="ProviderError",
            turns=0,
            detail="ANTHROPIC_API_KEY is not set",
            usage=Usage(input_tokens=0, output_tokens=0),
        ),
    ]
    assert metrics.get(UNKNOWN_FRAMES) == 1
    assert metrics.get(MALFORMED_LINES) == 0


def test_minimal_golden() -> None:
    events = _norm("turnevents-minimal.ndjson")
    assert events == [
        Output(stream="stdout", chunk="hello"),
        AgentFinished(outcome="EndOfTurn", turns=2, usage=None, cost_usd=None, model="m"),
    ]


def test_events_serialise_like_the_wire() -> None:
    events = _norm("turnevents-tool-run.ndjson")
    started = kind_to_json(events[1])
    assert started == {
        "kind": "tool_started",
        "id": "toolu_01",
        "name": "Read",
        "input": {"path": "README.md"},
    }
    assert kind_to_json(events[0]) == {
        "kind": "output",
        "stream": "stdout",
        "chunk": "Let me read the README.",
    }


def _f(**kw: Any) -> bytes:
    return orjson.dumps(kw)


def test_tool_started_held_until_input_complete() -> None:
    # Out as soon as the fragments form the whole input object: the call starts then, not
    # when its ToolCallEnd (sent after the tool ran) arrives, so its duration is real.
    n = Normalizer()
    assert n.feed(_f(type="ToolCallStart", tool_use_id="a", name="Bash")) == []
    assert n.feed(_f(type="ToolCallInputDelta", tool_use_id="a", partial_json='{"cmd":')) == []
    assert n.feed(_f(type="ToolCallInputDelta", tool_use_id="a", partial_json='"a}')) == []
    out = n.feed(_f(type="ToolCallInputDelta", tool_use_id="a", partial_json=' b"}'))
    assert out == [ToolStarted(id="a", name="Bash", input={"cmd": "a} b"})]
    assert n.feed(_f(type="AssistantTextDelta", text="x")) == [Output(chunk="x")]
    end = n.feed(_f(type="ToolCallEnd", tool_use_id="a", result_text="ok"))
    assert end == [ToolFinished(id="a", name="Bash", ok=True, result=ToolResult(text="ok"))]


def test_tool_started_out_before_its_end_in_a_stream() -> None:
    # The wire's order: the input streamed, the model stops, the tool runs, then ToolCallEnd.
    n = Normalizer()
    lines = [
        _f(type="ToolCallStart", tool_use_id="a", name="Edit"),
        _f(type="ToolCallInputDelta", tool_use_id="a", partial_json='{"file_path": "x.py", '),
        _f(type="ToolCallInputDelta", tool_use_id="a", partial_json='"old_string": "}", '),
        _f(type="ToolCallInputDelta", tool_use_id="a", partial_json='"new_string": "]"}'),
    ]
    started = n.feed_lines(lines)
    assert started == [
        ToolStarted(
            id="a", name="Edit", input={"file_path": "x.py", "old_string": "}", "new_string": "]"}
        )
    ]
    end = n.feed_lines([_f(type="ToolCallEnd", tool_use_id="a", result_text="done")])
    assert [e.kind for e in end] == ["tool_finished"]


def test_tool_input_variants() -> None:
    # No fragments -> null; invalid JSON -> raw string; flushed by the next ToolCallStart.
    n = Normalizer()
    assert n.feed(_f(type="ToolCallStart", tool_use_id="a", name="A")) == []
    out = n.feed(_f(type="ToolCallStart", tool_use_id="b", name="B"))
    assert out == [ToolStarted(id="a", name="A", input=None)]
    n.feed(_f(type="ToolCallInputDelta", tool_use_id="b", partial_json='{"x": 1'))
    # A fragment of another id flushes the held one; the stray fragment itself is dropped.
    out = n.feed(_f(type="ToolCallInputDelta", tool_use_id="zzz", partial_json="1"))
    assert out == [ToolStarted(id="b", name="B", input='{"x": 1')]
    assert n.flush() == []


def test_tool_started_flushed_before_tool_finished_and_at_flush() -> None:
    n = Normalizer()
    n.feed(_f(type="ToolCallStart", tool_use_id="a", name="Read"))
    n.feed(_f(type="ToolCallInputDelta", tool_use_id="a", partial_json="[1,2]"))
    out = n.feed(_f(type="ToolCallEnd", tool_use_id="a", content=[{"type": "text", "text": "ok"}]))
    assert out == [
        ToolStarted(id="a", name="Read", input=[1, 2]),
        ToolFinished(id="a", name="Read", ok=True, result=ToolResult(text="ok")),
    ]
    n.feed(_f(type="ToolCallStart", tool_use_id="b", name="Write"))
    assert n.flush() == [ToolStarted(id="b", name="Write", input=None)]


def test_flattened_result_is_capped() -> None:
    n = Normalizer()
    big = "y" * (RESULT_TEXT_CAP + 10)
    out = n.feed(
        _f(
            type="ToolCallEnd",
            tool_use_id="a",
            is_error=False,
            content=[
                {"type": "text", "text": "a"},
                {"type": "image", "source": {"type": "url", "url": "u"}},
                {"type": "text", "text": big},
            ],
        )
    )
    assert len(out) == 1 and isinstance(out[0], ToolFinished)
    assert out[0].result is not None
    assert out[0].result.truncated is True and len(out[0].result.text) == RESULT_TEXT_CAP
    assert out[0].result.text.startswith("a\nyyy")


def test_turn_end_without_usage_and_unpriced_model() -> None:
    n = Normalizer()
    n.feed(_f(type="TurnStart", turn_index=3, model="mystery-model"))
    out = n.feed(_f(type="TurnEnd", turn_index=3, stop_reason="end_turn"))
    assert out == [TurnFinished(turn=3, stop_reason="end_turn", model="mystery-model")]
    out = n.feed(_f(type="TurnEnd", turn_index=4, usage={"input_tokens": 5, "output_tokens": 1}))
    assert out == [
        TurnFinished(turn=4, model="mystery-model", usage=Usage(input_tokens=5, output_tokens=1))
    ]


def test_cost_includes_cache_tokens_and_provider_prefix() -> None:
    n = Normalizer()
    n.feed(_f(type="TurnStart", turn_index=0, model="anthropic/claude-sonnet-4-6"))
    usage = {
        "input_tokens": 1000,
        "output_tokens": 100,
        "cache_read_input_tokens": 10000,
        "cache_creation_input_tokens": 2000,
    }
    out = n.feed(_f(type="RunEnd", total_usage=usage, turn_count=1, stopped_for="EndOfTurn"))
    fin = out[0]
    assert isinstance(fin, AgentFinished)
    expected = (1000 * 3.0 + 100 * 15.0 + 10000 * 0.3 + 2000 * 3.75) / 1e6
    assert fin.cost_usd == pytest.approx(expected)
    assert fin.usage is not None and fin.usage.cache_read_input_tokens == 10000


def test_run_end_defaults() -> None:
    # Missing fields default as §6.2 says: "" outcome, 0 turns; no usage -> null cost.
    out = Normalizer().feed(b'{"type":"RunEnd"}')
    assert out == [AgentFinished(outcome="", turns=0, cost_usd=None, usage=None, detail=None)]
    out = Normalizer().feed(
        _f(type="RunEnd", stopped_for={"StreamIdle": {"secs": 30, "nanos": 500000000}})
    )
    assert isinstance(out[0], AgentFinished)
    assert out[0].outcome == "StreamIdle" and out[0].detail == "30.5s"


def test_malformed_and_unknown_are_counted_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    n = Normalizer(metrics=metrics)
    assert n.feed(b"{not json") == []
    assert n.feed(b"\xff\xfe") == []
    assert n.feed(b"[1,2]") == []
    assert n.feed(b'{"no_type":1}') == []
    assert n.feed(b'{"type":5}') == []
    assert n.feed(b"   ") == []
    assert metrics.get(MALFORMED_LINES) == 2
    assert metrics.get(UNKNOWN_FRAMES) == 3
    assert "non-JSON" in caplog.text
    # Wrong field types never raise; they default.
    out = n.feed(b'{"type":"AssistantTextDelta","text":5}')
    assert out == [Output(chunk="")]
    out = n.feed(
        b'{"type":"TurnEnd","turn_index":"x","usage":{"input_tokens":"a"},"stop_reason":1}'
    )
    assert out == [TurnFinished(turn=0)]


def test_big_integers_are_accepted_and_clamped() -> None:
    out = Normalizer().feed(
        b'{"type":"AssistantTextDelta","text":"a","n":123456789012345678901234567890}'
    )
    assert out == [Output(chunk="a")]
    out = Normalizer().feed(b'{"type":"RunEnd","turn_count":123456789012345678901234567890}')
    assert out == [AgentFinished(turns=0)]
    orjson.dumps(kind_to_json(out[0]))


def test_state_roundtrip_continues_exactly() -> None:
    lines = [ln.encode() for ln in fixture_lines("turnevents-tool-run.ndjson")]
    whole = normalize_lines(lines)
    for cut in range(len(lines) + 1):
        a = Normalizer()
        got: list[EventKind] = []
        for ln in lines[:cut]:
            got.extend(a.feed(ln))
        state = json.loads(json.dumps(a.state()))
        b = Normalizer()
        b.restore(state)
        for ln in lines[cut:]:
            got.extend(b.feed(ln))
        got.extend(b.flush())
        assert got == whole, cut


def test_restore_tolerates_garbage() -> None:
    n = Normalizer()
    n.restore({"model": 5, "pending": {"fragments": [1, "x"]}, "tools": {"a": 1, "b": "B"}})
    assert n.state() == {
        "model": None,
        "pending": {"id": "", "name": "", "fragments": ["x"]},
        "tools": {"b": "B"},
        "turns": 0,
        "usage": None,
    }
    n.restore("nonsense")


def test_skips_are_tallied_per_reason_for_frames_skipped() -> None:
    n = Normalizer()
    for line in [b"not json", b"[1]", b'{"type":"FromTheFuture"}', b"", b"{nope", b"   "]:
        n.feed(line)
    n.skipped("oversized")
    got = {e.reason: e.count for e in n.take_skipped()}
    assert got == {"malformed": 3, "unknown_type": 1, "oversized": 1}
    assert n.take_skipped() == []  # taken


def test_conclude_closes_open_tools_and_survives_a_restart() -> None:
    lines = [
        b'{"type":"TurnStart","turn_index":0,"model":"claude-sonnet-4-6"}',
        b'{"type":"TurnEnd","turn_index":0,"usage":{"input_tokens":10,"output_tokens":4}}',
        b'{"type":"TurnStart","turn_index":1,"model":"claude-sonnet-4-6"}',
        b'{"type":"ToolCallStart","turn_index":1,"tool_use_id":"t1","name":"Read"}',
        b'{"type":"ToolCallStart","turn_index":1,"tool_use_id":"t2","name":"Bash"}',
        b'{"type":"ToolCallInputDelta","turn_index":1,"tool_use_id":"t2","partial_json":"{}"}',
    ]
    a = Normalizer()
    for ln in lines:
        a.feed(ln)
    b = Normalizer()
    b.restore(json.loads(json.dumps(a.state())))
    out = b.conclude("crashed", "the worker exited (failed) without ending its run")
    # Both tool_started went out before the restart (t1 at t2's start, t2 once its `{}` input
    # was complete): nothing is held, both calls are open.
    assert [e.kind for e in out] == ["tool_finished", "tool_finished", "agent_finished"]
    assert {(e.id, e.ok) for e in out if isinstance(e, ToolFinished)} == {
        ("t1", False),
        ("t2", False),
    }
    end = out[-1]
    assert isinstance(end, AgentFinished)
    assert (end.outcome, end.turns, end.model) == ("crashed", 1, "claude-sonnet-4-6")
    assert end.usage == Usage(input_tokens=10, output_tokens=4)
    assert end.detail and "failed" in end.detail
    assert b.conclude("crashed", "again")[-1].kind == "agent_finished"  # the caller guards


def test_parse_usage() -> None:
    assert parse_usage({}) is None
    assert parse_usage(None) is None
    assert parse_usage({"input_tokens": -1, "output_tokens": True}) is None
    assert parse_usage({"input_tokens": 3}) == Usage(input_tokens=3)


# ---- fuzz ---------------------------------------------------------------------------------------

FRAME_TYPES = [
    "TurnStart",
    "AssistantTextDelta",
    "AssistantThinkingDelta",
    "ToolCallStart",
    "ToolCallInputDelta",
    "ToolCallEnd",
    "TurnEnd",
    "RunEnd",
    "Other",
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)

FIELDS = [
    "turn_index",
    "text",
    "tool_use_id",
    "name",
    "partial_json",
    "is_error",
    "content",
    "result_text",
    "truncated",
    "usage",
    "total_usage",
    "turn_count",
    "stopped_for",
    "model",
    "stop_reason",
]

frames = st.builds(
    lambda t, extra: {"type": t, **extra},
    st.sampled_from(FRAME_TYPES),
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=20))
def test_fuzz_arbitrary_bytes_never_raise(lines: list[bytes]) -> None:
    n = Normalizer(NormalizerOptions(include_thinking=True))
    for ln in lines:
        n.feed(ln)
    n.flush()


# 200 examples (was 300: ~5.5 s, the slowest unit test; the cost is hypothesis generating the
# nested JSON, not the normaliser): each run still feeds ~2,000 random frames and values.
@settings(max_examples=200, deadline=None)
@given(st.lists(frames | json_values, max_size=20))
def test_fuzz_frames_never_raise_and_serialise(items: list[Any]) -> None:
    metrics = Metrics()
    n = Normalizer(NormalizerOptions(include_thinking=True), metrics)
    out: list[EventKind] = []
    for item in items:
        out.extend(n.feed(json.dumps(item).encode()))
    out.extend(n.flush())
    for ev in out:
        orjson.dumps(kind_to_json(ev))
    # Normalising never raised through the defensive catch-all either.
    assert metrics.get(MALFORMED_LINES) == 0
    # State is always JSON-able and restorable.
    Normalizer().restore(orjson.loads(orjson.dumps(n.state())))
