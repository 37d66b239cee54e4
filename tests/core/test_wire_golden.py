"""Golden wire tests: the fixtures parse into the mirror models and re-serialise stably."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from prospero.core.wire.control import (
    AGENT_RECORD_FIELDS,
    ATTACH_INBOUND_ADAPTER,
    CALIBAND_SPEC_FIELDS,
    CTL_REPLY_ADAPTER,
    CTL_REQUEST_ADAPTER,
    AgentRecord,
    BearerPreamble,
    EndInput,
    ErrorReply,
    InternalErr,
    InvalidStateErr,
    ListedReply,
    NotFoundErr,
    RmReq,
    SpawnReq,
    SpawnSpec,
    StatusReply,
    TcpEndpoint,
    UnixEndpoint,
    UserMessage,
    encode_reply,
    encode_request,
)
from prospero.core.wire.turnevents import (
    KNOWN_FRAME_TYPES,
    TURN_EVENT_ADAPTER,
    RunEnd,
    ToolCallEnd,
    TurnEnd,
    stop_label,
)
from tests.support import fixture_lines

REPLY_KINDS = {
    "listed",
    "spawned",
    "attach_ack",
    "killed",
    "respawned",
    "removed",
    "status",
    "shutdown_ack",
    "status_reported",
    "error",
}
REQUEST_KINDS = {
    "list",
    "spawn",
    "attach",
    "kill",
    "respawn",
    "rm",
    "status",
    "shutdown",
    "report_status",
}
GOLDEN_NINE = (
    "label",
    "frontmatter_path",
    "initial_prompt",
    "model",
    "provider",
    "tool_allowlist",
    "isolation_worktree",
    "inherit_hooks",
    "interactive",
)


def _with_extra(line: str) -> bytes:
    obj = orjson.loads(line)
    obj["zz_future_key"] = {"nested": [1, 2]}
    return orjson.dumps(obj)


# --- control requests -------------------------------------------------------------------------


@pytest.mark.parametrize("line", fixture_lines("control-requests.ndjson"))
def test_control_requests_parse_and_roundtrip(line: str) -> None:
    req = CTL_REQUEST_ADAPTER.validate_json(line)
    assert req.kind in REQUEST_KINDS
    wire = encode_request(req)
    assert wire.endswith(b"\n") and wire.count(b"\n") == 1
    again = CTL_REQUEST_ADAPTER.validate_json(wire)
    assert again == req
    assert encode_request(again) == wire  # stable
    # every key of the golden line survives (rm's default `force` is added explicitly)
    original = orjson.loads(line)
    out = orjson.loads(wire)
    assert {k: out[k] for k in original} == original
    # unknown keys are tolerated
    assert CTL_REQUEST_ADAPTER.validate_json(_with_extra(line)) == req


def test_control_requests_cover_every_kind() -> None:
    kinds = {orjson.loads(ln)["kind"] for ln in fixture_lines("control-requests.ndjson")}
    assert kinds == REQUEST_KINDS


def test_rm_force_defaults_false() -> None:
    lines = fixture_lines("control-requests.ndjson")
    rm = CTL_REQUEST_ADAPTER.validate_json(lines[5])
    assert isinstance(rm, RmReq) and rm.force is False and rm.id == "a1"
    assert encode_request(rm) == b'{"kind":"rm","id":"a1","force":false}\n'


def test_spawn_request_is_byte_identical_to_golden() -> None:
    line = fixture_lines("control-requests.ndjson")[1]
    req = CTL_REQUEST_ADAPTER.validate_json(line)
    assert isinstance(req, SpawnReq)
    assert encode_request(req) == line.encode() + b"\n"
    assert (
        encode_request(SpawnReq(spec=SpawnSpec(initial_prompt="hi", interactive=True)))
        == line.encode() + b"\n"
    )


# --- control replies --------------------------------------------------------------------------


@pytest.mark.parametrize("line", fixture_lines("control-replies.ndjson"))
def test_control_replies_parse_and_roundtrip(line: str) -> None:
    reply = CTL_REPLY_ADAPTER.validate_json(line)
    assert reply.kind in REPLY_KINDS
    wire = encode_reply(reply)
    again = CTL_REPLY_ADAPTER.validate_json(wire)
    assert again == reply
    assert encode_reply(again) == wire
    assert CTL_REPLY_ADAPTER.validate_json(_with_extra(line)) == reply
    original = orjson.loads(line)
    if original["kind"] != "listed":
        assert wire == line.encode() + b"\n"  # byte-identical, key order included
    if original["kind"] == "error":
        assert "kind" in original["error"]


def test_control_replies_cover_every_kind_and_error() -> None:
    replies = [
        CTL_REPLY_ADAPTER.validate_json(ln) for ln in fixture_lines("control-replies.ndjson")
    ]
    assert {r.kind for r in replies} == REPLY_KINDS
    errors = [r.error for r in replies if isinstance(r, ErrorReply)]
    assert [type(e) for e in errors] == [NotFoundErr, InvalidStateErr, InternalErr]
    nf, inv, internal = errors
    assert isinstance(nf, NotFoundErr) and nf.id == "nope"
    assert isinstance(inv, InvalidStateErr) and (inv.op, inv.status) == ("rm", "running")
    assert isinstance(internal, InternalErr) and internal.message.startswith("bad request:")


def test_endpoints_of_both_schemes() -> None:
    a, b = (
        CTL_REPLY_ADAPTER.validate_json(ln) for ln in fixture_lines("control-replies.ndjson")[:2]
    )
    assert a.endpoint == UnixEndpoint(path="/tmp/a1.sock")  # type: ignore[union-attr]
    assert b.endpoint == TcpEndpoint(addr="pod.ns.svc:9443")  # type: ignore[union-attr]
    assert b.endpoint.host_port() == ("pod.ns.svc", 9443)  # type: ignore[union-attr]


def test_listed_record_with_caliban_only_keys() -> None:
    line = fixture_lines("control-replies.ndjson")[2]
    reply = CTL_REPLY_ADAPTER.validate_json(line)
    assert isinstance(reply, ListedReply)
    (rec,) = reply.agents
    assert isinstance(rec, AgentRecord)
    assert rec.id == "7c1d2e3f4a5b" and len(rec.id) == 12
    assert rec.working_dir.endswith("0d6e5c4b3a29481f9e8d7c6b5a493827")
    assert rec.spec.source is None and rec.spec.tool_allowlist == [
        "Read",
        "Grep",
        "Glob",
        "Edit",
        "Bash",
    ]
    out = orjson.loads(encode_reply(reply))["agents"][0]
    original = orjson.loads(line)["agents"][0]
    # the mirror re-emits the record and the nine golden spec fields; `source: null` is optional
    assert {k: v for k, v in original.items() if k != "spec"} == {
        k: v for k, v in out.items() if k != "spec"
    }
    assert tuple(out["spec"]) == GOLDEN_NINE
    assert {k: original["spec"][k] for k in GOLDEN_NINE} == out["spec"]


def test_status_reply_fields_flattened() -> None:
    line = fixture_lines("control-replies.ndjson")[7]
    reply = CTL_REPLY_ADAPTER.validate_json(line)
    assert isinstance(reply, StatusReply)
    assert (reply.pid, reply.agents, reply.uptime_secs) == (4242, 1, 37)


def test_unknown_reply_kind_is_rejected() -> None:
    with pytest.raises(ValidationError):
        CTL_REPLY_ADAPTER.validate_json('{"kind":"drained"}')


# --- spawn specs ------------------------------------------------------------------------------


@pytest.mark.parametrize("line", fixture_lines("spawn-specs.ndjson"))
def test_spawn_specs_parse_and_roundtrip(line: str) -> None:
    spec = SpawnSpec.model_validate_json(line)
    wire = spec.to_wire()
    again = SpawnSpec.model_validate(wire)
    assert again == spec
    assert orjson.dumps(again.to_wire()) == orjson.dumps(wire)
    assert tuple(wire)[:9] == GOLDEN_NINE
    assert SpawnSpec.model_validate_json(_with_extra(line)) == spec
    original = orjson.loads(line)
    assert {k: wire[k] for k in original if k in wire} == {
        k: v for k, v in original.items() if k in wire
    }


def test_golden_nine_field_form_byte_identical() -> None:
    l1, l2, l3 = fixture_lines("spawn-specs.ndjson")[:3]
    assert orjson.dumps(SpawnSpec(initial_prompt="hi", interactive=True).to_wire()) == l1.encode()
    assert orjson.dumps(SpawnSpec(initial_prompt="hi", provider="ollama").to_wire()) == l2.encode()
    assert orjson.dumps(SpawnSpec.model_validate_json(l1).to_wire()) == l1.encode()
    minimal = SpawnSpec.model_validate_json(l3)
    assert minimal.inherit_hooks is True and minimal.isolation_worktree is False
    assert minimal.interactive is False and minimal.label is None


def test_caliban_full_spec_keeps_hooks_config_and_source() -> None:
    line = fixture_lines("spawn-specs.ndjson")[4]
    spec = SpawnSpec.model_validate_json(line)
    assert spec.source == "gonzalo"
    assert spec.inherited_hooks_config is not None
    hooks = orjson.loads(spec.inherited_hooks_config)  # an opaque JSON *string*
    assert hooks["mode"] == "acceptEdits"
    assert orjson.loads(orjson.dumps(spec.to_wire())) == orjson.loads(line)


def test_drive_protocol_only_when_acp_and_nothing_else_of_prosperos() -> None:
    base = SpawnSpec(initial_prompt="x").to_wire()
    assert "drive_protocol" not in base
    extra = SpawnSpec(initial_prompt="x", drive_protocol="acp").to_wire()
    assert extra["drive_protocol"] == "acp"
    # Everything a spec serialises is a key caliband knows (§3.1 + `drive_protocol`): the
    # posture and the rest of Prospero's own metadata live in its store (AgentMeta).
    assert set(extra) <= CALIBAND_SPEC_FIELDS
    echoed = SpawnSpec.model_validate(extra | {"permission_posture": "supervised", "zz": 1})
    assert echoed == SpawnSpec.model_validate(extra)
    assert "permission_posture" not in echoed.to_wire()


def test_listed_fixture_record_has_exactly_the_record_fields() -> None:
    listed = next(
        orjson.loads(ln)
        for ln in fixture_lines("control-replies.ndjson")
        if orjson.loads(ln)["kind"] == "listed"
    )
    (rec,) = listed["agents"]
    assert set(rec) == AGENT_RECORD_FIELDS
    assert set(rec["spec"]) <= CALIBAND_SPEC_FIELDS


# --- attach inbound, preamble -------------------------------------------------------------------


def test_attach_inbound_frames() -> None:
    um, end = (
        ATTACH_INBOUND_ADAPTER.validate_json(ln) for ln in fixture_lines("attach-inbound.ndjson")
    )
    assert isinstance(um, UserMessage) and um.text == "hi there"
    assert isinstance(end, EndInput)
    for line, frame in zip(fixture_lines("attach-inbound.ndjson"), (um, end), strict=True):
        assert orjson.dumps(frame.model_dump()) == line.encode()
        assert ATTACH_INBOUND_ADAPTER.validate_json(_with_extra(line)) == frame
    with pytest.raises(ValidationError):  # snake_case is the drive-core spelling, not caliband's
        ATTACH_INBOUND_ADAPTER.validate_json('{"type":"user_message","text":"x"}')


def test_transport_preamble() -> None:
    (line,) = fixture_lines("transport-preamble.ndjson")
    pre = BearerPreamble.model_validate_json(line)
    assert pre.bearer == "s3cr3t"
    assert orjson.dumps(pre.model_dump()) == line.encode()


# --- turn events ------------------------------------------------------------------------------

TURNEVENT_FILES = [
    "turnevents-minimal.ndjson",
    "turnevents-tool-run.ndjson",
    "turnevents-edge-cases.ndjson",
]


@pytest.mark.parametrize(
    "line",
    [ln for f in TURNEVENT_FILES for ln in fixture_lines(f)],
)
def test_turnevents_parse(line: str) -> None:
    obj = orjson.loads(line)
    if obj.get("type") not in KNOWN_FRAME_TYPES:
        with pytest.raises(ValidationError):
            TURN_EVENT_ADAPTER.validate_json(line)
        return
    frame = TURN_EVENT_ADAPTER.validate_json(line)
    assert frame.type == obj["type"]
    dumped = frame.model_dump(mode="json")
    assert TURN_EVENT_ADAPTER.validate_python(dumped) == frame  # stable
    assert TURN_EVENT_ADAPTER.validate_json(_with_extra(line)) == frame
    for key, value in obj.items():  # every field the fixture carries is mirrored
        if key in dumped and not isinstance(value, dict | list):
            assert dumped[key] == value, key


def test_tool_run_shapes() -> None:
    frames = [
        TURN_EVENT_ADAPTER.validate_json(ln) for ln in fixture_lines("turnevents-tool-run.ndjson")
    ]
    assert [f.type for f in frames][:4] == [
        "TurnStart",
        "AssistantThinkingDelta",
        "AssistantTextDelta",
        "ToolCallStart",
    ]
    end = next(f for f in frames if isinstance(f, ToolCallEnd))
    assert end.result_text == "# demo\nA tiny project.\n" and end.truncated is False
    turn_end = next(f for f in frames if isinstance(f, TurnEnd))
    assert turn_end.usage is not None and turn_end.usage.input_tokens == 812
    assert turn_end.ttft is not None and turn_end.ttft.nanos == 412000000
    assert turn_end.assistant_message is not None
    assert [b.type for b in turn_end.assistant_message.content] == ["thinking", "text", "tool_use"]
    run_end = frames[-1]
    assert (
        isinstance(run_end, RunEnd) and run_end.turn_count == 2 and run_end.turns_without_edit == 2
    )
    assert stop_label(run_end.stopped_for) == "EndOfTurn"


def test_edge_case_stop_conditions() -> None:
    frames = [orjson.loads(ln) for ln in fixture_lines("turnevents-edge-cases.ndjson")]
    labels = [stop_label(f["stopped_for"]) for f in frames if f.get("type") == "RunEnd"]
    assert labels == ["MaxTurnsReached", "EndOfTurn", "ProviderError"]
    abbreviated = RunEnd.model_validate(frames[4])
    assert abbreviated.total_usage == {}  # abbreviated fake frame tolerated
