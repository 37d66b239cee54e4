"""Scripts for the scripted ACP peer (`prospero.testkit.fake_acp.FakeAcpAgent`).

This module is data only (no `acp` import), so it is cheap to import from demo code.

Script format
-------------

`AcpScript(turns, default_turn=None, model=None)`: the agent's i-th `session/prompt` (counted over the
whole agent, 0-based, across sessions and reconnects) plays `turns[i]`; prompts past the end
play `default_turn`; when that is `None` they play `echo_turn(prompt_text)`: one
`agent_message_chunk` `"echo: <prompt text>"`, then `end_turn`.

A turn is a list of steps, each a dict with one of these keys. `model` (optional) is the model the agent reports in `session/new`'s
`configOptions` (`category: "model"`) when the spawn spec names none.

Steps (snake_case in the script, camelCase on the wire):

- `{"text": str, "message_id"?: str}` -> `agent_message_chunk` with a text block
- `{"thought": str, "message_id"?: str}` -> `agent_thought_chunk`
- `{"tool_call": {"id", "title"?, "kind"?, "raw_input"?, "status"?, "content"?, "locations"?}}`
  -> `tool_call` (`title` defaults to the id; keys left out are left out on the wire, so omit
  `raw_input` to make the input arrive late in a `tool_update`)
- `{"tool_update": {"id", "raw_input"?, "status"?, "raw_output"?, "content"?, "title"?,
  "kind"?, "locations"?}}` -> `tool_call_update` (only the given fields)
  `content` is a str (-> one `{"type":"content","content":{"type":"text",...}}` item) or a
  list of raw ToolCallContent dicts; `locations` is a list of `{"path", "line"?}`.
- `{"permission": {"tool_call_id", "title"?, "kind"?, "raw_input"?, "status"?, "options"?},
  "on_allow": [steps], "on_reject": [steps]}` -> `session/request_permission`. `options`
  default to `DEFAULT_PERMISSION_OPTIONS` (ids `allow-once`, `allow-always`, `reject-once`,
  `reject-always`); each option is `{"option_id" | "optionId", "name", "kind"}`. The agent
  branches on the selected option's kind (`allow_*` -> `on_allow`, `reject_*` or an unknown
  option id -> `on_reject`), then continues with the steps after the permission step. A
  `cancelled` outcome ends the turn with `stopReason: cancelled`.
- `{"plan": [{"content", "priority"?: "medium", "status"?: "pending"}]}` -> `plan`
- `{"usage": {"used": int, "size": int, "cost"?: {"amount": float, "currency": "USD"}}}`
  -> `usage_update` (cost is cumulative for the session, as in ACP)
- `{"unknown_update": {...}}` -> a raw `session/update` notification whose `update` is the
  given object (`sessionUpdate` defaults to `UNKNOWN_UPDATE_KIND`), written on the transport
  without the SDK's validation
- `{"sleep": secs}` -> pause (a `session/cancel` interrupts it)
- `{"crash": true}` -> drop this connection mid-turn (no prompt response); the agent and a
  listener keep running, so a client may reconnect and `session/load`
- `{"exit": code}` -> the agent exits with `code`: a listener stops listening, reports the
  code (FakeCaliband: 0 -> `done`, else `failed`) and drops every connection; no response
- `{"stop": reason, "prompt_usage"?: {"inputTokens", "outputTokens", "totalTokens", ...}}` -> end
  the turn now with `stopReason: reason` (any string, so `"bogus_reason"` tests unknown stop
  reasons) and, when given, the (unstable) `PromptResponse.usage` of the turn as is; a turn
  without a `stop` step ends `end_turn`

Steps after a `stop` are ignored. Unknown steps are skipped with a warning.

Builders for every step are below, plus `default_acp_script()` (the realistic session the fake
caliband serves by default) and JSON (de)serialization (`AcpScript.load(path)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

Step = dict[str, Any]
Turn = list[Step]

UNKNOWN_UPDATE_KIND = "x_prospero_unknown_update"
STOP_REASONS = ("end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled")

DEFAULT_PERMISSION_OPTIONS: tuple[dict[str, str], ...] = (
    {"option_id": "allow-once", "name": "Allow once", "kind": "allow_once"},
    {"option_id": "allow-always", "name": "Allow always", "kind": "allow_always"},
    {"option_id": "reject-once", "name": "Reject once", "kind": "reject_once"},
    {"option_id": "reject-always", "name": "Reject always", "kind": "reject_always"},
)


@dataclass
class AcpScript:
    """What a FakeAcpAgent plays: `turns[i]` for its i-th prompt, then `default_turn`
    (`None` = echo the prompt and end the turn)."""

    turns: list[Turn] = field(default_factory=list)
    default_turn: Turn | None = None
    model: str | None = None

    def steps_for(self, index: int, prompt_text: str) -> Turn:
        if 0 <= index < len(self.turns):
            return list(self.turns[index])
        if self.default_turn is not None:
            return list(self.default_turn)
        return echo_turn(prompt_text)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {"turns": self.turns, "default_turn": self.default_turn, "model": self.model}
        )

    @classmethod
    def from_obj(cls, obj: Any) -> AcpScript:
        """From `{"turns": [...], "default_turn"?: [...], "model"?: str}` or a list of turns."""
        if isinstance(obj, list):
            return cls(turns=[list(t) for t in obj])
        if not isinstance(obj, dict) or not isinstance(obj.get("turns", []), list):
            raise ValueError("an ACP script is {'turns': [[step, ...], ...], 'default_turn'?}")
        default = obj.get("default_turn")
        model = obj.get("model")
        return cls(
            turns=[list(t) for t in obj.get("turns", [])],
            default_turn=list(default) if default is not None else None,
            model=str(model) if model is not None else None,
        )

    @classmethod
    def from_json(cls, data: str | bytes) -> AcpScript:
        return cls.from_obj(orjson.loads(data))

    @classmethod
    def load(cls, path: str | Path) -> AcpScript:
        return cls.from_json(Path(path).read_bytes())

    def dump(self, path: str | Path) -> None:
        Path(path).write_bytes(self.to_json())


# --- steps ------------------------------------------------------------------------------------


def text(s: str, *, message_id: str | None = None) -> Step:
    step: Step = {"text": s}
    if message_id is not None:
        step["message_id"] = message_id
    return step


def thought(s: str, *, message_id: str | None = None) -> Step:
    step: Step = {"thought": s}
    if message_id is not None:
        step["message_id"] = message_id
    return step


def _opt(d: dict[str, Any], **kw: Any) -> dict[str, Any]:
    d.update({k: v for k, v in kw.items() if v is not None})
    return d


def tool_call(
    id: str,
    title: str | None = None,
    kind: str | None = "other",
    *,
    raw_input: Any = None,
    status: str | None = None,
    content: str | list[dict[str, Any]] | None = None,
    locations: list[dict[str, Any]] | None = None,
) -> Step:
    """`raw_input=None` leaves `rawInput` off the wire (late input)."""
    return {
        "tool_call": _opt(
            {"id": id, "title": title or id},
            kind=kind,
            raw_input=raw_input,
            status=status,
            content=content,
            locations=locations,
        )
    }


def tool_update(
    id: str,
    *,
    status: str | None = None,
    raw_input: Any = None,
    raw_output: Any = None,
    content: str | list[dict[str, Any]] | None = None,
    title: str | None = None,
    kind: str | None = None,
    locations: list[dict[str, Any]] | None = None,
) -> Step:
    return {
        "tool_update": _opt(
            {"id": id},
            status=status,
            raw_input=raw_input,
            raw_output=raw_output,
            content=content,
            title=title,
            kind=kind,
            locations=locations,
        )
    }


def permission(
    tool_call_id: str,
    *,
    title: str | None = None,
    kind: str | None = None,
    raw_input: Any = None,
    options: Sequence[dict[str, Any]] | None = None,
    on_allow: Sequence[Step] = (),
    on_reject: Sequence[Step] = (),
) -> Step:
    req = _opt({"tool_call_id": tool_call_id}, title=title, kind=kind, raw_input=raw_input)
    if options is not None:
        req["options"] = [dict(o) for o in options]
    return {"permission": req, "on_allow": list(on_allow), "on_reject": list(on_reject)}


def plan(*entries: dict[str, Any] | str) -> Step:
    """Entries are dicts (`content`, `priority`, `status`) or plain strings (pending, medium)."""
    out = []
    for e in entries:
        if isinstance(e, str):
            out.append({"content": e, "priority": "medium", "status": "pending"})
        else:
            out.append(
                {
                    "content": e["content"],
                    "priority": e.get("priority", "medium"),
                    "status": e.get("status", "pending"),
                }
            )
    return {"plan": out}


def usage(used: int, size: int, *, cost: float | None = None, currency: str = "USD") -> Step:
    u: dict[str, Any] = {"used": used, "size": size}
    if cost is not None:
        u["cost"] = {"amount": cost, "currency": currency}
    return {"usage": u}


def unknown_update(kind: str = UNKNOWN_UPDATE_KIND, **fields: Any) -> Step:
    return {"unknown_update": {"sessionUpdate": kind, **fields}}


def sleep(secs: float) -> Step:
    return {"sleep": secs}


def crash() -> Step:
    return {"crash": True}


def exit_(code: int) -> Step:
    return {"exit": code}


def stop(
    reason: str = "end_turn",
    *,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    cached_read_tokens: int | None = None,
) -> Step:
    """End the turn; with token counts, the prompt response reports them as its `usage`."""
    step: Step = {"stop": reason}
    if input_tokens is not None or output_tokens is not None:
        i, o = input_tokens or 0, output_tokens or 0
        usage: dict[str, Any] = {"inputTokens": i, "outputTokens": o, "totalTokens": i + o}
        if cached_read_tokens is not None:
            usage["cachedReadTokens"] = cached_read_tokens
        step["prompt_usage"] = usage
    return step


def echo_turn(prompt_text: str) -> Turn:
    return [text(f"echo: {prompt_text}"), stop("end_turn")]


# --- whole scripts ----------------------------------------------------------------------------


def realistic_turn(
    *,
    pace: float = 0.0,
    read_path: str = "README.md",
    read_result: str = "# demo\nA tiny project.\n",
    edit_path: str = "CHANGELOG.md",
    cost: float = 0.0123,
) -> Turn:
    """One realistic ACP turn: thinking, text, a plan, a read tool call whose rawInput
    arrives late (in an update) and completes with rawOutput + content, an edit that asks
    permission (allowed -> completed, rejected -> failed), a usage_update with a USD cost,
    then end_turn. `pace` inserts sleeps between steps."""
    gap = [sleep(pace)] if pace > 0 else []
    return [
        thought("Check the README before changing anything."),
        *gap,
        text("Let me read the README first."),
        plan(
            {"content": "Read the README", "priority": "high", "status": "in_progress"},
            {"content": "Update the changelog", "priority": "medium", "status": "pending"},
        ),
        *gap,
        tool_call("call_read", f"Read {read_path}", "read", status="pending"),
        tool_update("call_read", status="in_progress", raw_input={"path": read_path}),
        *gap,
        tool_update(
            "call_read",
            status="completed",
            raw_output={"content": read_result},
            content=read_result,
        ),
        *gap,
        text(" The README describes a tiny project."),
        tool_call(
            "call_edit",
            f"Edit {edit_path}",
            "edit",
            raw_input={"path": edit_path, "content": "## Unreleased\n- docs\n"},
            status="pending",
        ),
        permission(
            "call_edit",
            title=f"Edit {edit_path}",
            kind="edit",
            raw_input={"path": edit_path, "content": "## Unreleased\n- docs\n"},
            on_allow=[
                *gap,
                tool_update("call_edit", status="completed", raw_output={"success": True}),
                text(" Updated the changelog."),
            ],
            on_reject=[
                tool_update("call_edit", status="failed", raw_output="User refused permission"),
                text(" Skipped the changelog edit."),
            ],
        ),
        plan(
            {"content": "Read the README", "priority": "high", "status": "completed"},
            {"content": "Update the changelog", "priority": "medium", "status": "completed"},
        ),
        usage(4200, 200_000, cost=cost),
        stop("end_turn"),
    ]


def default_acp_script(*, pace: float = 0.0) -> AcpScript:
    """The fake caliband's default ACP session: one `realistic_turn`, later prompts echo."""
    return AcpScript(turns=[realistic_turn(pace=pace)])


def simple_script(*texts: str, stop_reason: str = "end_turn") -> AcpScript:
    """One turn of text chunks then `stop_reason`; later prompts echo."""
    return AcpScript(turns=[[*(text(t) for t in texts), stop(stop_reason)]])
