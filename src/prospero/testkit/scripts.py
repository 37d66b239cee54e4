"""Builders for fake agent scripts (what a FakeAgentWorker plays, caliband-wire.md §5.1).

A script is a list of entries. A dict with a `type` is a TurnEvent, written as one compact JSON
line; a str is written verbatim as a line; a dict whose only key starts with `$` is a
directive, never written on the wire:

- `{"$sleep": secs}`      pause playback
- `{"$wait_input": true}` interactive boundary: report idle, serve inbound frames (§4.3)
- `{"$exit": code}`       exit without RunEnd (a crashed worker)
- `{"$raw": "text"}`      write `text` as a raw line (malformed JSON etc.)

Frames built here use the full shapes a real worker emits (Usage objects, Duration, Message),
so strict parsers accept them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

ScriptEntry = dict[str, Any] | str
Script = list[ScriptEntry]

DEFAULT_MODEL = "fake-model"


# --- directives -----------------------------------------------------------------------------


def sleep(secs: float) -> dict[str, Any]:
    return {"$sleep": secs}


def wait_input() -> dict[str, Any]:
    return {"$wait_input": True}


def exit_(code: int) -> dict[str, Any]:
    return {"$exit": code}


def raw(text: str) -> dict[str, Any]:
    return {"$raw": text}


def is_directive(entry: ScriptEntry) -> bool:
    return isinstance(entry, dict) and any(k.startswith("$") for k in entry)


def wire_line_count(script: Iterable[ScriptEntry]) -> int:
    """How many lines a non-interactive playthrough writes (raw entries count, directives not)."""
    return sum(1 for e in script if not is_directive(e) or (isinstance(e, dict) and "$raw" in e))


# --- frames ---------------------------------------------------------------------------------


def usage(input_tokens: int = 0, output_tokens: int = 0) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def message(role: str, *blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": role, "content": list(blocks)}


def turn_start(
    turn_index: int = 0, *, message_id: str | None = None, model: str = DEFAULT_MODEL
) -> dict[str, Any]:
    return {
        "type": "TurnStart",
        "turn_index": turn_index,
        "message_id": message_id if message_id is not None else f"msg_fake_{turn_index:04d}",
        "model": model,
    }


def text_delta(text: str, turn_index: int = 0, content_block_index: int = 0) -> dict[str, Any]:
    return {
        "type": "AssistantTextDelta",
        "turn_index": turn_index,
        "content_block_index": content_block_index,
        "text": text,
    }


def thinking_delta(text: str, turn_index: int = 0, content_block_index: int = 0) -> dict[str, Any]:
    return {
        "type": "AssistantThinkingDelta",
        "turn_index": turn_index,
        "content_block_index": content_block_index,
        "text": text,
    }


def tool_call_start(tool_use_id: str, name: str, turn_index: int = 0) -> dict[str, Any]:
    return {
        "type": "ToolCallStart",
        "turn_index": turn_index,
        "tool_use_id": tool_use_id,
        "name": name,
    }


def tool_call_input_delta(
    tool_use_id: str, partial_json: str, turn_index: int = 0
) -> dict[str, Any]:
    return {
        "type": "ToolCallInputDelta",
        "turn_index": turn_index,
        "tool_use_id": tool_use_id,
        "partial_json": partial_json,
    }


def tool_call_end(
    tool_use_id: str,
    result_text: str,
    *,
    is_error: bool = False,
    turn_index: int = 0,
    cap: int = 8192,
) -> dict[str, Any]:
    return {
        "type": "ToolCallEnd",
        "turn_index": turn_index,
        "tool_use_id": tool_use_id,
        "is_error": is_error,
        "content": [text_block(result_text)],
        "result_text": result_text[:cap],
        "truncated": len(result_text) > cap,
    }


def turn_end(
    turn_index: int = 0,
    *,
    content: Sequence[dict[str, Any]] = (),
    tool_results: Sequence[dict[str, Any]] = (),
    stop_reason: str = "end_turn",
    input_tokens: int = 10,
    output_tokens: int = 5,
) -> dict[str, Any]:
    return {
        "type": "TurnEnd",
        "turn_index": turn_index,
        "assistant_message": message("assistant", *content),
        "tool_results": list(tool_results),
        "stop_reason": stop_reason,
        "usage": usage(input_tokens, output_tokens),
        "ttft": {"secs": 0, "nanos": 100_000_000},
        "tbt": None,
    }


def run_end(
    stopped_for: Any = "EndOfTurn",
    *,
    turn_count: int = 1,
    final_messages: Sequence[dict[str, Any]] = (),
    input_tokens: int = 0,
    output_tokens: int = 0,
    turns_without_edit: int = 0,
) -> dict[str, Any]:
    return {
        "type": "RunEnd",
        "final_messages": list(final_messages),
        "total_usage": usage(input_tokens, output_tokens),
        "turn_count": turn_count,
        "stopped_for": stopped_for,
        "turns_without_edit": turns_without_edit,
        "no_edit_nudge_emitted": False,
    }


# --- whole scripts --------------------------------------------------------------------------


def default_script() -> Script:
    """caliband-wire.md §10 item 5: TurnStart then RunEnd(EndOfTurn)."""
    return [turn_start(0), run_end("EndOfTurn", turn_count=1)]


def text_script(
    n_lines: int,
    *,
    prefix: str = "line",
    stopped_for: Any = "EndOfTurn",
    prompt: str = "hi",
    final: bool = True,
) -> Script:
    """TurnStart, `n_lines` text deltas with distinct texts (`"<prefix> 0001\\n"`...), TurnEnd and
    (if `final`) RunEnd — `n_lines + 3` lines in all (`+ 2` without the RunEnd)."""
    texts = [f"{prefix} {i:04d}\n" for i in range(1, n_lines + 1)]
    whole = "".join(texts)
    script: Script = [turn_start(0)]
    script += [text_delta(t, 0, 0) for t in texts]
    script.append(turn_end(0, content=[text_block(whole)], output_tokens=max(1, n_lines)))
    if final:
        script.append(
            run_end(
                stopped_for,
                turn_count=1,
                final_messages=[
                    message("user", text_block(prompt)),
                    message("assistant", text_block(whole)),
                ],
                input_tokens=10,
                output_tokens=max(1, n_lines),
            )
        )
    return script


def long_script(n: int, *, per_turn: int = 100, stopped_for: Any = "EndOfTurn") -> Script:
    """About `n` text deltas split into turns of `per_turn`, every line distinct, then RunEnd.

    Each text is `"t<turn>-<seq>"` with a global sequence number, so a reader can detect gaps
    and duplicates. Use `wire_line_count()` for the exact number of lines."""
    script: Script = []
    seq = 0
    turn = 0
    while seq < n or turn == 0:
        script.append(turn_start(turn))
        chunk = min(per_turn, n - seq)
        for _ in range(chunk):
            seq += 1
            script.append(text_delta(f"t{turn}-{seq:06d}\n", turn, 0))
        script.append(
            turn_end(turn, content=[text_block(f"turn {turn}")], output_tokens=max(1, chunk))
        )
        turn += 1
        if n <= 0:
            break
    script.append(run_end(stopped_for, turn_count=turn))
    return script


def tool_run_script(
    *,
    prompt: str = "Summarise the README",
    tool: str = "Read",
    tool_input: dict[str, Any] | None = None,
    tool_use_id: str = "toolu_01",
    result_text: str = "# demo\nA tiny project.\n",
    is_error: bool = False,
    thinking: str | None = "Check the README first.",
    text_before: str = "Let me read the README.",
    text_after: str = "The README says this is a tiny project.",
    stopped_for: Any = "EndOfTurn",
    model: str = DEFAULT_MODEL,
) -> Script:
    """A realistic two-turn run (like turnevents-tool-run.ndjson): thinking, text, one tool
    call with streamed input, its result, a closing text turn, RunEnd."""
    args = tool_input if tool_input is not None else {"path": "README.md"}
    args_json = json.dumps(args, separators=(",", ":"))
    half = max(1, len(args_json) // 2)
    script: Script = [turn_start(0, model=model)]
    blocks: list[dict[str, Any]] = []
    block = 0
    if thinking is not None:
        script.append(thinking_delta(thinking, 0, block))
        blocks.append({"type": "thinking", "thinking": thinking})
        block += 1
    script.append(text_delta(text_before, 0, block))
    blocks.append(text_block(text_before))
    script += [
        tool_call_start(tool_use_id, tool, 0),
        tool_call_input_delta(tool_use_id, args_json[:half], 0),
        tool_call_input_delta(tool_use_id, args_json[half:], 0),
        tool_call_end(tool_use_id, result_text, is_error=is_error, turn_index=0),
    ]
    blocks.append({"type": "tool_use", "id": tool_use_id, "name": tool, "input": args})
    tool_result = message(
        "user",
        {
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": [text_block(result_text)],
            "is_error": is_error,
        },
    )
    script.append(
        turn_end(
            0,
            content=blocks,
            tool_results=[tool_result],
            stop_reason="tool_use",
            input_tokens=812,
            output_tokens=64,
        )
    )
    script += [
        turn_start(1, model=model),
        text_delta(text_after, 1, 0),
        turn_end(1, content=[text_block(text_after)], input_tokens=901, output_tokens=12),
        run_end(
            stopped_for,
            turn_count=2,
            final_messages=[
                message("user", text_block(prompt)),
                message("assistant", *blocks),
                tool_result,
                message("assistant", text_block(text_after)),
            ],
            input_tokens=1713,
            output_tokens=76,
            turns_without_edit=2,
        ),
    ]
    return script


def interactive_script(first_reply: str = "What next?") -> Script:
    """One turn, an input boundary (replies echo each UserMessage), then RunEnd on EndInput."""
    return [
        turn_start(0),
        text_delta(first_reply, 0, 0),
        turn_end(0, content=[text_block(first_reply)]),
        wait_input(),
        run_end("EndOfTurn", turn_count=1),
    ]


def crash_script(n_lines: int = 1, code: int = 1) -> Script:
    """Some output, then the worker dies without RunEnd (exit `code`)."""
    return [*text_script(n_lines, final=False), exit_(code)]


# --- files ----------------------------------------------------------------------------------


def parse_script_lines(lines: Iterable[str]) -> Script:
    """NDJSON script: JSON objects become entries; any other non-blank line is kept verbatim."""
    out: Script = []
    for line in lines:
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            out.append(text)
            continue
        out.append(value if isinstance(value, dict) else text)
    return out


def load_script(path: str | Path) -> Script:
    return parse_script_lines(Path(path).read_text().splitlines())


def dump_script(script: Iterable[ScriptEntry], path: str | Path) -> None:
    with open(path, "wb") as fh:
        for e in script:
            fh.write((e.encode() if isinstance(e, str) else orjson.dumps(e)) + b"\n")
