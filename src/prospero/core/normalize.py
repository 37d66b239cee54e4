"""TurnEvent NDJSON lines -> normalised EventKinds (caliband-wire.md §6.2, filled in).

Upstream Prospero throws most of the payload away (tool input always null, finished tool name
empty, no result, no usage, cost 0). This normaliser keeps the same event order and kinds but
fills those fields from the frames that carry them:

- `ToolCallStart` is held back until its `ToolCallInputDelta` fragments are complete: when they
  form a JSON object (the model finished writing the input: the call starts then), else at any
  other frame or `flush()`. So `tool_started.input` is the real JSON input (the raw text when
  the fragments do not parse, null when there were none), and `tool_started` is stamped when
  the input was complete, not when the tool's `ToolCallEnd` arrived (which comes after the tool
  ran: waiting for it made every tool call last 0 ms).
- `ToolCallEnd` gets the tool name from its `ToolCallStart` and a `result` (the agent's capped
  `result_text`, else the flattened text of its content blocks).
- `TurnEnd` becomes `turn_finished` with that turn's usage and cost; `RunEnd` carries the total
  usage and a cost from the rate card (null when the model is unpriced or usage is unreported:
  never a fake 0).

It is stateful (one per agent), works on plain dicts parsed with orjson, and never raises on
bad input: non-JSON lines and unknown frames are counted in metrics, logged and skipped; the
skips are also tallied per reason for `take_skipped()`, which the driver turns into coalesced
`frames_skipped` events. `conclude()` ends a run that never reached its `RunEnd` (the worker
died): open tool calls are closed as failed and `agent_finished` carries the given outcome.
`state()` / `restore()` carry the state across a daemon restart (the NDJSON driver persists it
with its line cursor).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from prospero.core.metrics import MALFORMED_LINES, UNKNOWN_FRAMES, Metrics
from prospero.core.ratecard import RateCard
from prospero.core.wire.turnevents import stop_detail, stop_label
from prospero.types.events import (
    AgentFinished,
    CompactKind,
    EventKind,
    FramesSkipped,
    ToolFinished,
    ToolResult,
    ToolStarted,
    TurnFinished,
    Usage,
    compact_kind,
    output_event,
)

log = logging.getLogger(__name__)

# caliban caps `result_text` at 8192 chars; apply the same cap when flattening content ourselves.
RESULT_TEXT_CAP = 8192
# Bound on remembered tool names (id -> name) for ToolCallEnd lookups; a run never has this many
# tool calls open at once, this only protects against a stream that never ends them.
MAX_OPEN_TOOLS = 1024
# Bound on buffered input fragments of one held-back tool call (bytes of text).
MAX_INPUT_TEXT = 8 << 20


class NormalizerOptionsLike(Protocol):
    """The slice of DriverOptions the normaliser reads."""

    include_thinking: bool
    rate_card: RateCard


@dataclass
class NormalizerOptions:
    # Off by default so the fixture invariants hold; the daemon's DriverOptions turn it on.
    include_thinking: bool = False
    rate_card: RateCard = field(default_factory=RateCard)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


# Counters on the wire are u32; anything outside [0, 2^63) is garbage (and would not serialise).
_INT_LIMIT = 1 << 63


def _opt_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and 0 <= value < _INT_LIMIT:
        return value
    return None


def _int(value: Any, default: int = 0) -> int:
    v = _opt_int(value)
    return default if v is None else v


def parse_usage(value: Any) -> Usage | None:
    """A wire Usage object -> Usage; `{}`, absent or malformed -> None ("not reported")."""
    if not isinstance(value, dict) or not value:
        return None
    inp = _opt_int(value.get("input_tokens"))
    out = _opt_int(value.get("output_tokens"))
    if inp is None and out is None:
        return None
    return Usage(
        input_tokens=inp or 0,
        output_tokens=out or 0,
        cache_creation_input_tokens=_opt_int(value.get("cache_creation_input_tokens")),
        cache_read_input_tokens=_opt_int(value.get("cache_read_input_tokens")),
    )


def _flatten_blocks(blocks: Any, out: list[str], depth: int = 0) -> None:
    if not isinstance(blocks, list) or depth > 8:
        return
    for block in blocks:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if isinstance(text, str):
                out.append(text)
        elif kind == "tool_result":
            _flatten_blocks(block.get("content"), out, depth + 1)


def tool_result_of(frame: dict[str, Any]) -> ToolResult:
    """`result_text` when the agent sent it, else the text blocks of `content`, capped."""
    truncated = frame.get("truncated") is True
    result_text = frame.get("result_text")
    if isinstance(result_text, str):
        return ToolResult(text=result_text, truncated=truncated)
    parts: list[str] = []
    _flatten_blocks(frame.get("content"), parts)
    text = "\n".join(parts)
    if len(text) > RESULT_TEXT_CAP:
        text = text[:RESULT_TEXT_CAP]
        truncated = True
    return ToolResult(text=text, truncated=truncated)


def _parse_input(fragments: list[str]) -> Any:
    if not fragments:
        return None
    raw = "".join(fragments)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        # Not JSON (or not representable downstream, e.g. integers beyond 64 bits): keep the text.
        return raw


def _closes_object(frag: str, fragments: list[str]) -> bool:
    """Whether the fragments, ending with `frag`, now form a whole JSON object (the tool input
    is complete). Only tried when a fragment ends with `}`, so a long input streamed in many
    fragments is parsed a few times, not once per fragment."""
    if not frag.rstrip().endswith("}"):
        return False
    try:
        return type(orjson.loads("".join(fragments))) is dict
    except orjson.JSONDecodeError:
        return False


@dataclass
class _PendingTool:
    id: str
    name: str
    fragments: list[str] = field(default_factory=list)
    size: int = 0


class Normalizer:
    """Stateful TurnEvent -> EventKind mapper for one agent. `feed` never raises."""

    def __init__(
        self, options: NormalizerOptionsLike | None = None, metrics: Metrics | None = None
    ) -> None:
        opts = options if options is not None else NormalizerOptions()
        self.include_thinking = opts.include_thinking
        self.rate_card = opts.rate_card
        self.metrics = metrics if metrics is not None else Metrics()
        self._model: str | None = None  # model of the latest TurnStart (the run's model)
        self._pending: _PendingTool | None = None
        self._tool_names: dict[str, str] = {}
        self._turns = 0  # TurnEnd frames seen (for a run concluded without RunEnd)
        self._usage: Usage | None = None  # sum of the turns' usage
        self._skipped: dict[str, int] = {}  # reason -> lines skipped since take_skipped()

    # ---- public API -------------------------------------------------------------------------

    def feed_lines(self, lines: Iterable[bytes]) -> list[EventKind]:
        """`feed` every line in order; all their events, in order (the ingest hot path).

        Text and thinking deltas (the bulk of a stream) are handled inline; every other line
        takes exactly the `feed` path, so the result is always that of feeding line by line.
        """
        return self._feed_lines(lines, False)  # type: ignore[return-value]

    def feed_lines_compact(self, lines: Iterable[bytes]) -> list[CompactKind]:
        """`feed_lines`, with each `Output` as its (stream, chunk) pair (`CompactKind`): what
        the emitter queues anyway, without building models that would only be dropped."""
        return self._feed_lines(lines, True)

    def _feed_lines(self, lines: Iterable[bytes], compact: bool) -> list[CompactKind]:
        out: list[CompactKind] = []
        append = out.append
        loads = orjson.loads
        thinking = self.include_thinking
        for line in lines:
            try:
                frame = loads(line)
            except orjson.JSONDecodeError:
                out.extend(self._compacted(self.feed(line), compact))  # blank, or slow path
                continue
            if self._pending is None and type(frame) is dict:
                kind = frame.get("type")
                if kind == "AssistantTextDelta":
                    text = frame.get("text")
                    text = text if isinstance(text, str) else ""
                    append(("stdout", text) if compact else output_event("stdout", text))
                    continue
                if kind == "AssistantThinkingDelta":
                    if thinking:
                        text = frame.get("text")
                        text = text if isinstance(text, str) else ""
                        append(("thinking", text) if compact else output_event("thinking", text))
                    continue
            out.extend(self._compacted(self._feed_parsed(frame), compact))
        return out

    @staticmethod
    def _compacted(events: list[EventKind], compact: bool) -> list[CompactKind]:
        return [compact_kind(e) for e in events] if compact else events  # type: ignore[return-value]

    def feed(self, line: bytes) -> list[EventKind]:
        """Normalise one NDJSON line (without its newline) into zero or more events."""
        try:
            frame = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            if not line.strip():
                return []
            try:
                # orjson refuses some valid JSON (integers beyond 64 bits); give json a chance.
                frame = json.loads(line)
            except (ValueError, RecursionError):
                self.metrics.inc(MALFORMED_LINES)
                self.skipped("malformed")
                log.warning("skipping a non-JSON line (%d bytes): %s", len(line), e)
                return []
        return self._feed_parsed(frame)

    def _feed_parsed(self, frame: Any) -> list[EventKind]:
        try:
            return self.feed_frame(frame)
        except Exception:  # defensive: a normaliser bug must not kill the stream
            self.metrics.inc(MALFORMED_LINES)
            self.skipped("malformed")
            log.exception("normaliser failed on a frame; skipped")
            return []

    def feed_frame(self, frame: Any) -> list[EventKind]:
        """Normalise one already-parsed frame."""
        if not isinstance(frame, dict):
            out = self.flush()
            self.metrics.inc(UNKNOWN_FRAMES)
            self.skipped("malformed")
            log.debug("frame is not a JSON object (%s); skipped", type(frame).__name__)
            return out
        kind = frame.get("type")
        if kind == "ToolCallInputDelta":
            pending = self._pending
            if pending is not None and pending.id == _str(frame.get("tool_use_id")):
                frag = _str(frame.get("partial_json"))
                if pending.size + len(frag) <= MAX_INPUT_TEXT:
                    pending.fragments.append(frag)
                    pending.size += len(frag)
                    if _closes_object(frag, pending.fragments):
                        return self.flush()
                return []
            # A fragment for a tool call that is not the held-back one: nothing to attach it to.
            out = self.flush()
            log.debug(
                "input fragment for tool %r with no open ToolCallStart; dropped",
                frame.get("tool_use_id"),
            )
            return out

        out = self.flush() if self._pending is not None else []
        if kind == "AssistantTextDelta":
            out.append(output_event("stdout", _str(frame.get("text"))))
        elif kind == "AssistantThinkingDelta":
            if self.include_thinking:
                out.append(output_event("thinking", _str(frame.get("text"))))
        elif kind == "ToolCallStart":
            tool_id = _str(frame.get("tool_use_id"))
            name = _str(frame.get("name"))
            self._pending = _PendingTool(tool_id, name)
            self._remember_tool(tool_id, name)
        elif kind == "ToolCallEnd":
            tool_id = _str(frame.get("tool_use_id"))
            out.append(
                ToolFinished(
                    id=tool_id,
                    name=self._tool_names.pop(tool_id, ""),
                    ok=frame.get("is_error") is not True,
                    result=tool_result_of(frame),
                )
            )
        elif kind == "TurnStart":
            model = _str(frame.get("model"))
            if model:
                self._model = model
        elif kind == "TurnEnd":
            usage = parse_usage(frame.get("usage"))
            self._turns += 1
            if usage is not None:
                self._usage = usage if self._usage is None else self._usage.plus(usage)
            stop_reason = frame.get("stop_reason")
            out.append(
                TurnFinished(
                    turn=_int(frame.get("turn_index")),
                    stop_reason=stop_reason if isinstance(stop_reason, str) else None,
                    model=self._model,
                    usage=usage,
                    cost_usd=self.rate_card.cost(self._model, usage),
                )
            )
        elif kind == "RunEnd":
            usage = parse_usage(frame.get("total_usage"))
            stopped_for = frame.get("stopped_for")
            out.append(
                AgentFinished(
                    outcome=stop_label(stopped_for),
                    cost_usd=self.rate_card.cost(self._model, usage),
                    turns=_int(frame.get("turn_count")),
                    usage=usage,
                    model=self._model,
                    detail=stop_detail(stopped_for),
                )
            )
            self._tool_names.clear()
        else:
            self.metrics.inc(UNKNOWN_FRAMES)
            self.skipped("unknown_type")
            log.debug("unknown frame type %r skipped", kind)
        return out

    def flush(self) -> list[EventKind]:
        """Emit the held-back `tool_started`, if any (its input is as complete as it gets)."""
        pending = self._pending
        if pending is None:
            return []
        self._pending = None
        return [
            ToolStarted(id=pending.id, name=pending.name, input=_parse_input(pending.fragments))
        ]

    def skipped(self, reason: str, count: int = 1) -> None:
        """Tally `count` skipped source lines (see `take_skipped`)."""
        self._skipped[reason] = self._skipped.get(reason, 0) + count

    def take_skipped(self) -> list[FramesSkipped]:
        """One coalesced `frames_skipped` per reason tallied since the last call."""
        if not self._skipped:
            return []
        out = [FramesSkipped(count=n, reason=r) for r, n in self._skipped.items()]
        self._skipped = {}
        return out

    def conclude(self, outcome: str, detail: str) -> list[EventKind]:
        """End a run that never reached its `RunEnd`: the held-back `tool_started` (if any),
        `tool_finished{ok: false}` for every tool call still open, then `agent_finished` with
        `outcome` and `detail` and the usage of the turns that did end."""
        out = self.flush()
        for tool_id, name in self._tool_names.items():
            out.append(
                ToolFinished(
                    id=tool_id,
                    name=name,
                    ok=False,
                    result=ToolResult(text=f"the run ended before the tool finished: {detail}"),
                )
            )
        self._tool_names.clear()
        out.append(
            AgentFinished(
                outcome=outcome,
                cost_usd=self.rate_card.cost(self._model, self._usage),
                turns=self._turns,
                usage=self._usage,
                model=self._model,
                detail=detail,
            )
        )
        return out

    # ---- persistence ------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """JSON-able state needed to continue exactly where this normaliser stands."""
        pending = self._pending
        return {
            "model": self._model,
            "pending": None
            if pending is None
            else {"id": pending.id, "name": pending.name, "fragments": list(pending.fragments)},
            "tools": dict(self._tool_names),
            "turns": self._turns,
            "usage": None if self._usage is None else self._usage.model_dump(),
        }

    def restore(self, state: Any) -> None:
        """Inverse of `state()`; tolerant of missing or malformed entries."""
        if not isinstance(state, dict):
            return
        model = state.get("model")
        self._model = model if isinstance(model, str) and model else None
        pending = state.get("pending")
        self._pending = None
        if isinstance(pending, dict):
            frags = [f for f in pending.get("fragments") or [] if isinstance(f, str)]
            self._pending = _PendingTool(
                _str(pending.get("id")), _str(pending.get("name")), frags, sum(map(len, frags))
            )
        tools = state.get("tools")
        self._tool_names = (
            {k: v for k, v in tools.items() if isinstance(k, str) and isinstance(v, str)}
            if isinstance(tools, dict)
            else {}
        )
        self._turns = _int(state.get("turns"))
        self._usage = parse_usage(state.get("usage"))

    # ---- internals --------------------------------------------------------------------------

    def _remember_tool(self, tool_id: str, name: str) -> None:
        if len(self._tool_names) >= MAX_OPEN_TOOLS:
            self._tool_names.pop(next(iter(self._tool_names)))
        self._tool_names[tool_id] = name


def normalize_lines(
    lines: list[bytes], options: NormalizerOptionsLike | None = None, metrics: Metrics | None = None
) -> list[EventKind]:
    """Normalise a whole stream at once (tests, replaying `stdout.ndjson`)."""
    norm = Normalizer(options, metrics)
    out: list[EventKind] = []
    for line in lines:
        out.extend(norm.feed(line))
    out.extend(norm.flush())
    return out
