"""ACP → Prospero events: the pure mapping (docs/acp-mapping.md), the counterpart of
`prospero.core.normalize` for the ACP path.

`AcpMapper` is fed the raw JSON-RPC messages of one session in wire order (the driver calls it
from the SDK's synchronous raw stream observer, acp.md pitfall 1) plus the driver's own turn
boundaries (`begin_turn`, `end_turn`, `lose_turn`, `finish`), and puts events into an
`OutputQueue` in wire order. It does no I/O and never awaits: its tests feed messages and read
`queue.events_ready()`.

Tool calls are keyed per turn: a `toolCallId` closed in an earlier turn may be reused by a
later one (ids are only unique within a prompt turn for some agents), so the set of closed
ids is cleared when a turn begins. A `tool_started` whose input is not known yet is a *held*
slot; the mapper asks its host to expire the hold after `tool_input_hold` seconds
(`on_hold(tool_id, slot)`; the driver uses `loop.call_later`) and releases it itself when the
input arrives, the call progresses, a permission request names it, or the turn ends.
"""

from __future__ import annotations

import difflib
import json
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from acp import schema as s
from pydantic import ValidationError

from prospero.core import metrics as m
from prospero.core.drivers.acp.output import OutputQueue, Slot
from prospero.core.drivers.acp.resume import AcpResumeState, OpenTool
from prospero.core.metrics import Metrics
from prospero.core.normalize import RESULT_TEXT_CAP
from prospero.types.events import (
    AgentFinished,
    AgentInit,
    EventKind,
    FileDiff,
    Output,
    StreamGap,
    ToolFinished,
    ToolResult,
    ToolStarted,
    TurnFinished,
    TurnLost,
    Usage,
)

log = logging.getLogger(__name__)

MAX_UNRECOGNIZED = 64

# Metric names (counters) of the ACP path.
ACP_UNKNOWN_UPDATES = "acp_unknown_updates"
ACP_UNKNOWN_STOP_REASONS = "acp_unknown_stop_reasons"
ACP_IGNORED_UPDATES = "acp_ignored_updates"
ACP_TURNS_LOST = "acp_turns_lost"
ACP_LATE_TOOL_INPUT = "acp_late_tool_input"

KNOWN_STOP_REASONS = frozenset(
    {"end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"}
)
# ACP stop reason (plus Prospero's "error" / "lost") -> NDJSON RunEnd vocabulary.
STOP_OUTCOMES: dict[str, str] = {
    "end_turn": "EndOfTurn",
    "max_tokens": "MaxTokensExhausted",
    "max_turn_requests": "MaxTurnsReached",
    "refusal": "Refusal",
    "cancelled": "Cancelled",
    "error": "Error",
    "lost": "Error",
}
NOT_RESUMABLE = "NotResumable"
# `sessionUpdate` variants the pinned SDK parses (acp.md §5); another value is an unknown type,
# a known one that fails validation is malformed (`frames_skipped.reason`).
KNOWN_UPDATE_KINDS = frozenset(
    {
        "user_message_chunk",
        "agent_message_chunk",
        "agent_thought_chunk",
        "tool_call",
        "tool_call_update",
        "plan",
        "plan_update",
        "plan_removed",
        "available_commands_update",
        "current_mode_update",
        "config_option_update",
        "session_info_update",
        "usage_update",
    }
)
_TOOL_DONE = frozenset({"completed", "failed"})
_TOOL_PROGRESS = frozenset({"in_progress", "completed", "failed"})


def outcome_for(stop: str | None) -> tuple[str, str | None]:
    """agent_finished `outcome` (and a detail for unknown reasons) for the last stop reason."""
    if stop is None:
        return "EndOfTurn", None
    label = STOP_OUTCOMES.get(stop)
    if label is not None:
        return label, None
    return "Unknown", f"agent stop reason {stop!r}"


def cap(text: str, truncated: bool = False) -> ToolResult:
    if len(text) > RESULT_TEXT_CAP:
        return ToolResult(text=text[:RESULT_TEXT_CAP], truncated=True)
    return ToolResult(text=text, truncated=truncated)


def _json_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def block_text(block: Any) -> str | None:
    """Text of a ContentBlock (text, embedded text resource, resource link); None otherwise."""
    if isinstance(block, s.TextContentBlock):
        return block.text
    if isinstance(block, s.EmbeddedResourceContentBlock):
        res = block.resource
        if isinstance(res, s.TextResourceContents):
            return res.text
        return f"[resource {res.uri}]"
    if isinstance(block, s.ResourceContentBlock):
        return f"[{block.name}]({block.uri})"
    if isinstance(block, s.ImageContentBlock):
        return f"[image {block.mime_type}]"
    if isinstance(block, s.AudioContentBlock):
        return f"[audio {block.mime_type}]"
    return None


def render_content(content: Sequence[Any]) -> str:
    """Flatten ToolCallContent into text: text blocks, diffs (unified), terminal references."""
    parts: list[str] = []
    for item in content:
        if isinstance(item, s.ContentToolCallContent):
            text = block_text(item.content)
            if text:
                parts.append(text)
        elif isinstance(item, s.FileEditToolCallContent):
            old = (item.old_text or "").splitlines(keepends=True)
            new = item.new_text.splitlines(keepends=True)
            diff = "".join(
                difflib.unified_diff(
                    old,
                    new,
                    fromfile=item.path if item.old_text is not None else "/dev/null",
                    tofile=item.path,
                )
            )
            parts.append(diff or f"{item.path}: unchanged")
        elif isinstance(item, s.TerminalToolCallContent):
            parts.append(f"[terminal {item.terminal_id}]")
    return "\n".join(parts)


def diffs_of(content: Sequence[Any] | None) -> list[FileDiff] | None:
    """The `diff` items of a call's ToolCallContent (the edits it proposes); None without."""
    out = [
        FileDiff(path=item.path, old_text=item.old_text, new_text=item.new_text)
        for item in content or ()
        if isinstance(item, s.FileEditToolCallContent)
    ]
    return out or None


def usage_from(value: Any) -> Usage | None:
    """ACP (unstable) PromptResponse.usage → Usage; null when absent or malformed."""
    if value is None:
        return None
    if not isinstance(value, s.Usage):
        try:
            value = s.Usage.model_validate(value)
        except ValidationError:
            return None
    return Usage(
        input_tokens=value.input_tokens,
        output_tokens=value.output_tokens,
        cache_creation_input_tokens=value.cached_write_tokens,
        cache_read_input_tokens=value.cached_read_tokens,
    )


def model_from(options: Sequence[Any] | None) -> str | None:
    for opt in options or ():
        if isinstance(opt, s.SessionConfigOptionSelect) and opt.category == "model":
            return opt.current_value or None
    return None


def _name_hint(raw: Any) -> str | None:
    """A programmatic tool name: unstable `name`, else `_meta.claudeCode.toolName`."""
    if not isinstance(raw, dict):
        return None
    name = raw.get("name")
    if isinstance(name, str) and name:
        return name
    meta = raw.get("_meta")
    if isinstance(meta, dict):
        cc = meta.get("claudeCode")
        if isinstance(cc, dict):
            tn = cc.get("toolName")
            if isinstance(tn, str) and tn:
                return tn
    return None


@dataclass
class ToolState:
    id: str
    title: str = ""
    kind: str | None = None
    hint: str | None = None
    raw_input: Any = None
    raw_output: Any = None
    content: list[Any] | None = None
    status: str | None = None
    name: str = ""
    slot: Slot | None = None  # the held tool_started, until resolved

    def display_name(self) -> str:
        return self.hint or self.title or self.kind or "tool"

    def input_known(self) -> bool:
        return self.raw_input is not None and self.raw_input != {}


class AcpMapper:
    """One session's mapping state (see the module docstring)."""

    def __init__(
        self,
        out: OutputQueue,
        *,
        agent_id: str = "",
        include_thinking: bool = True,
        model: str | None = None,
        metrics: Metrics | None = None,
        on_hold: Callable[[str, Slot], None] | None = None,
        on_turn_cost: Callable[[float], Sequence[EventKind]] | None = None,
    ) -> None:
        self.out = out
        # Told the turn's cost so far at each cumulative `usage_update` (the agent's budget,
        # core/budgets.py): the events it answers go in the stream there, in order.
        self.on_turn_cost = on_turn_cost
        self.agent_id = agent_id
        self.include_thinking = include_thinking
        self.metrics = metrics if metrics is not None else Metrics()
        self.on_hold = on_hold
        self.model = model
        self.cost_total: float | None = None
        self.usage_total: Usage | None = None
        self.last_stop: str | None = None
        self.last_detail: str | None = None
        self.turn: int | None = None  # the turn in flight, as the mapping sees it
        self.cancel_sent = False
        self.loading = False  # session/load replay: updates are suppressed
        self.replayed_updates = 0
        self.tools: dict[str, ToolState] = {}
        self._closed: set[str] = set()  # tool ids closed in the current turn
        self._turn_cost_base: float | None = None
        self._turn_cost_seen = False
        self._warned_currency = False
        self.unrecognized: deque[dict[str, Any]] = deque(maxlen=MAX_UNRECOGNIZED)

    def restore(self, state: AcpResumeState) -> None:
        self.model = state.model or self.model
        self.cost_total = state.cost_total
        self.usage_total = state.usage_total
        self.last_stop = state.last_stop
        self.last_detail = state.last_detail

    # ---- session -----------------------------------------------------------------------------

    def session_started(self, session_id: str, config_options: Sequence[Any] | None) -> None:
        self.model = model_from(config_options) or self.model
        self.out.push(AgentInit(model=self.model or "", tools=[], session_id=session_id))

    def session_loaded(self, config_options: Sequence[Any] | None) -> None:
        self.model = model_from(config_options) or self.model

    # ---- incoming messages (wire order) ------------------------------------------------------

    def response(self, result: Any) -> None:
        """A response to one of our requests (only a prompt's result maps to an event)."""
        if self.loading:
            # The only request outstanding while loading is session/load: its answer ends
            # the replay, whatever follows is live.
            self.loading = False
            return
        turn = self.turn
        if turn is None or not isinstance(result, dict) or "stopReason" not in result:
            return
        stop = result.get("stopReason")
        usage = usage_from(result.get("usage"))
        if not isinstance(stop, str) or stop not in KNOWN_STOP_REASONS:
            self.metrics.inc(ACP_UNKNOWN_STOP_REASONS)
            self.unrecognized.append({"what": "stop_reason", "raw": {"stopReason": stop}})
            log.warning(
                "agent %s: unknown stop reason %r ending turn %d; recorded as is",
                self.agent_id,
                stop,
                turn,
            )
            stop = stop if isinstance(stop, str) and stop else "unknown"
        self.end_turn(turn, stop, usage)

    def update(self, params: Any) -> None:
        if self.loading:
            self.replayed_updates += 1
            return
        raw = params.get("update") if isinstance(params, dict) else None
        try:
            note = s.SessionNotification.model_validate(params)
        except ValidationError:
            kind = raw.get("sessionUpdate") if isinstance(raw, dict) else None
            self.metrics.inc(ACP_UNKNOWN_UPDATES)
            self.out.skip("malformed" if kind in KNOWN_UPDATE_KINDS else "unknown_type")
            self.unrecognized.append(
                {"what": "update", "raw": raw if isinstance(raw, dict) else {"raw": raw}}
            )
            log.warning(
                "agent %s: unknown or malformed ACP session update %r recorded and skipped",
                self.agent_id,
                kind,
            )
            return
        u = note.update
        if isinstance(u, s.AgentMessageChunk):
            text = block_text(u.content)
            if text:
                self.out.push(Output(stream="stdout", chunk=text))
        elif isinstance(u, s.AgentThoughtChunk):
            text = block_text(u.content)
            if text and self.include_thinking:
                self.out.push(Output(stream="thinking", chunk=text))
        elif isinstance(u, s.ToolCallStart | s.ToolCallProgress):
            self._on_tool(u, raw)
        elif isinstance(u, s.UsageUpdate):
            self._on_usage(u)
        elif isinstance(u, s.ConfigOptionUpdate):
            self.model = model_from(u.config_options) or self.model
            self.metrics.inc(ACP_IGNORED_UPDATES)
        else:
            # user_message_chunk (an echo outside session/load), plan, modes, commands,
            # session info: no event kind carries them (docs/adr/0005).
            self.metrics.inc(ACP_IGNORED_UPDATES)
            log.debug("agent %s: ACP %s not mapped", self.agent_id, u.session_update)

    def permission_request(self, params: Any) -> None:
        """Merge the request's `toolCall` into the call (announcing it if needed) and release
        its held `tool_started`: the request is about this input."""
        if self.loading:
            return
        try:
            req = s.RequestPermissionRequest.model_validate(params)
        except ValidationError:
            return  # the SDK answers invalid params
        tc = req.tool_call
        raw = params.get("toolCall") if isinstance(params, dict) else None
        st = self.tools.get(tc.tool_call_id)
        if st is None:
            if tc.tool_call_id in self._closed:
                return
            st = ToolState(
                id=tc.tool_call_id, title=tc.title or "", kind=tc.kind, hint=_name_hint(raw)
            )
            self._merge(st, tc)
            self.tools[st.id] = st
            self._start(st)
        else:
            self._merge(st, tc)
        self._resolve(st)
        if st.status in _TOOL_DONE:
            self._finish_tool(st, ok=st.status == "completed", result=self._result_of(st))

    def tool(self, tool_id: str) -> ToolState | None:
        return self.tools.get(tool_id)

    # ---- tools -------------------------------------------------------------------------------

    def _on_tool(self, u: s.ToolCallStart | s.ToolCallProgress, raw: Any) -> None:
        tid = u.tool_call_id
        st = self.tools.get(tid)
        if st is None:
            if tid in self._closed:
                log.debug("agent %s: update for closed tool call %s ignored", self.agent_id, tid)
                return
            st = ToolState(id=tid, title=u.title or "", kind=u.kind, hint=_name_hint(raw))
            self._merge(st, u)
            self.tools[tid] = st
            self._start(st)
        else:
            self._merge(st, u)
            st.hint = st.hint or _name_hint(raw)
        if st.slot is not None and (st.input_known() or st.status in _TOOL_PROGRESS):
            self._resolve(st)
        if st.status in _TOOL_DONE:
            self._finish_tool(st, ok=st.status == "completed", result=self._result_of(st))

    def _merge(
        self, st: ToolState, u: s.ToolCallStart | s.ToolCallProgress | s.ToolCallUpdate
    ) -> None:
        """Apply the fields present in `u` (ACP update semantics: absent = unchanged)."""
        fields = u.model_fields_set
        if u.title:
            st.title = u.title
        if u.kind is not None:
            st.kind = u.kind
        if u.status is not None:
            st.status = u.status
        if "raw_input" in fields and u.raw_input is not None:
            if st.slot is None and st.name and u.raw_input != st.raw_input:
                # tool_started already went out (hold expired): the new input is not re-sent.
                self.metrics.inc(ACP_LATE_TOOL_INPUT)
                log.info(
                    "agent %s: input of tool call %s arrived after its tool_started",
                    self.agent_id,
                    st.id,
                )
            st.raw_input = u.raw_input
        if "raw_output" in fields:
            st.raw_output = u.raw_output
        if u.content is not None:
            st.content = list(u.content)

    def _start(self, st: ToolState) -> None:
        st.slot = self.out.hold()
        if self.on_hold is not None:
            self.on_hold(st.id, st.slot)

    def expire_hold(self, tool_id: str, slot: Slot) -> None:
        """The hold of a `tool_started` ran out: it goes out with what is known."""
        st = self.tools.get(tool_id)
        if st is not None and st.slot is slot:
            log.debug(
                "agent %s: tool call %s input still unknown; started without it",
                self.agent_id,
                tool_id,
            )
            self._resolve(st)

    def resolve_all(self) -> None:
        for st in list(self.tools.values()):
            self._resolve(st)

    def _resolve(self, st: ToolState) -> None:
        slot = st.slot
        if slot is None:
            return
        st.slot = None
        st.name = st.display_name()
        self.out.fill(
            slot,
            ToolStarted(id=st.id, name=st.name, input=st.raw_input, diffs=diffs_of(st.content)),
        )

    def _result_of(self, st: ToolState) -> ToolResult:
        if st.raw_output is not None:
            return cap(_json_text(st.raw_output))
        if st.content:
            return cap(render_content(st.content))
        return ToolResult()

    def _finish_tool(self, st: ToolState, *, ok: bool, result: ToolResult) -> None:
        self._resolve(st)
        self.tools.pop(st.id, None)
        self._closed.add(st.id)
        self.out.push(ToolFinished(id=st.id, name=st.name, ok=ok, result=result))

    def close_open_tools(self, text: str) -> None:
        for st in list(self.tools.values()):
            self._finish_tool(st, ok=False, result=cap(text))

    def _on_usage(self, u: s.UsageUpdate) -> None:
        c = u.cost
        if c is None:
            return
        if c.currency.upper() != "USD":
            if not self._warned_currency:
                self._warned_currency = True
                log.warning(
                    "agent %s reports cost in %s; cost_usd stays null", self.agent_id, c.currency
                )
            return
        self.cost_total = float(c.amount)
        self._turn_cost_seen = True
        if self.on_turn_cost is not None and self.turn is not None and not self.loading:
            base = self._turn_cost_base or 0.0
            for kind in self.on_turn_cost(self.cost_total - base):
                self.out.push(kind)

    # ---- turns -------------------------------------------------------------------------------

    def begin_turn(self, turn: int) -> None:
        self.turn = turn
        self.cancel_sent = False
        self._closed.clear()  # tool ids are keyed per turn
        self._turn_cost_base = self.cost_total
        self._turn_cost_seen = False

    def end_turn(
        self, turn: int, stop: str, usage: Usage | None, detail: str | None = None
    ) -> None:
        if self.turn != turn:
            return
        if self.cancel_sent and stop != "cancelled":
            log.info(
                "agent %s: turn %d answered %r after session/cancel; recorded as cancelled",
                self.agent_id,
                turn,
                stop,
            )
            stop = "cancelled"
        self.close_open_tools(
            "cancelled: the turn was cancelled before the tool call completed"
            if stop == "cancelled"
            else f"abandoned: the turn ended ({stop}) before the tool call completed"
        )
        cost: float | None = None
        if self._turn_cost_seen and self.cost_total is not None:
            delta = self.cost_total - (self._turn_cost_base or 0.0)
            cost = round(delta, 12) if delta >= 0 else None
        self.out.push(
            TurnFinished(turn=turn, stop_reason=stop, model=self.model, usage=usage, cost_usd=cost)
        )
        total = self.cost_total
        self.out.mark(lambda st: setattr(st, "cost_total", total))
        if usage is not None:
            self.usage_total = usage if self.usage_total is None else self.usage_total.plus(usage)
        self.last_stop = stop
        self.last_detail = detail
        if detail is not None:
            self.out.mark(lambda st: setattr(st, "last_detail", detail))
        self.turn = None

    def lose_turn(self, turn: int, reason: str, stored_open: Sequence[OpenTool] = ()) -> None:
        """`turn_lost` for a turn whose end cannot be known; its open tool calls (live ones,
        or those the stored state lists after a hard stop) are closed first."""
        self.metrics.inc(ACP_TURNS_LOST)
        log.warning("agent %s: turn %d lost: %s", self.agent_id, turn, reason)
        for t in stored_open:
            if t.id not in self.tools:
                self.out.push(
                    ToolFinished(id=t.id, name=t.name, ok=False, result=cap(f"abandoned: {reason}"))
                )
        self.close_open_tools(f"abandoned: {reason}")
        self.out.push(TurnLost(turn=turn, reason=reason))
        self.last_stop = "lost"
        self.last_detail = f"turn {turn} was lost: {reason}"
        self.turn = None

    def finish(
        self,
        outcome: str,
        detail: str | None,
        turns: int,
        *,
        tool_text: str = "abandoned: the session ended",
        stored_open: Sequence[OpenTool] = (),
    ) -> None:
        for t in stored_open:
            if t.id not in self.tools:
                self.out.push(ToolFinished(id=t.id, name=t.name, ok=False, result=cap(tool_text)))
        self.close_open_tools(tool_text)
        total = self.cost_total
        self.out.mark(lambda st: setattr(st, "cost_total", total))
        self.out.push(
            AgentFinished(
                outcome=outcome,
                cost_usd=self.cost_total,
                turns=turns,
                usage=self.usage_total,
                model=self.model,
                detail=detail,
            )
        )
        self.turn = None

    def finish_not_resumable(self, detail: str, turns: int) -> None:
        self.metrics.inc(m.STREAM_GAPS)
        self.out.push(StreamGap(missing=None, detail=detail, reason="not_resumable"))
        self.finish(NOT_RESUMABLE, detail, turns)
