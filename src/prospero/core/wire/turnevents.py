"""Mirror of caliban's TurnEvent frames on the per-agent attach stream (caliband-wire.md §5.1).

The normaliser works on parsed dicts for speed; these models pin the shapes (golden tests) and
are what the fake caliband and tests build frames with. Unknown keys are tolerated.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Frame(BaseModel):
    model_config = ConfigDict(extra="ignore")


class WireUsage(_Frame):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class Duration(_Frame):
    secs: int = 0
    nanos: int = 0


class ContentBlock(_Frame):
    """Any content block (text, thinking, tool_use, tool_result, image); kept loose."""

    model_config = ConfigDict(extra="allow")
    type: str


class Message(_Frame):
    role: str
    content: list[ContentBlock] = Field(default_factory=list)


class TurnStart(_Frame):
    type: Literal["TurnStart"] = "TurnStart"
    turn_index: int = 0
    message_id: str = ""
    model: str = ""


class AssistantTextDelta(_Frame):
    type: Literal["AssistantTextDelta"] = "AssistantTextDelta"
    turn_index: int = 0
    content_block_index: int = 0
    text: str = ""


class AssistantThinkingDelta(_Frame):
    type: Literal["AssistantThinkingDelta"] = "AssistantThinkingDelta"
    turn_index: int = 0
    content_block_index: int = 0
    text: str = ""


class ToolCallStart(_Frame):
    type: Literal["ToolCallStart"] = "ToolCallStart"
    turn_index: int = 0
    tool_use_id: str = ""
    name: str = ""


class ToolCallInputDelta(_Frame):
    type: Literal["ToolCallInputDelta"] = "ToolCallInputDelta"
    turn_index: int = 0
    tool_use_id: str = ""
    partial_json: str = ""


class ToolCallEnd(_Frame):
    type: Literal["ToolCallEnd"] = "ToolCallEnd"
    turn_index: int = 0
    tool_use_id: str = ""
    is_error: bool = False
    content: list[ContentBlock] = Field(default_factory=list)
    result_text: str | None = None
    truncated: bool = False


class TurnEnd(_Frame):
    type: Literal["TurnEnd"] = "TurnEnd"
    turn_index: int = 0
    assistant_message: Message | None = None
    tool_results: list[Message] = Field(default_factory=list)
    stop_reason: str | None = None
    usage: WireUsage | None = None
    ttft: Duration | None = None
    tbt: Duration | None = None


class RunEnd(_Frame):
    type: Literal["RunEnd"] = "RunEnd"
    final_messages: list[Message] = Field(default_factory=list)
    # `{}` (abbreviated fakes) is tolerated; the normaliser treats it as "not reported".
    total_usage: dict[str, Any] = Field(default_factory=dict)
    turn_count: int = 0
    stopped_for: Any = "EndOfTurn"
    turns_without_edit: int = 0
    no_edit_nudge_emitted: bool = False


TurnEvent = Annotated[
    TurnStart
    | AssistantTextDelta
    | AssistantThinkingDelta
    | ToolCallStart
    | ToolCallInputDelta
    | ToolCallEnd
    | TurnEnd
    | RunEnd,
    Field(discriminator="type"),
]
TURN_EVENT_ADAPTER: TypeAdapter[TurnEvent] = TypeAdapter(TurnEvent)

KNOWN_FRAME_TYPES = frozenset(
    {
        "TurnStart",
        "AssistantTextDelta",
        "AssistantThinkingDelta",
        "ToolCallStart",
        "ToolCallInputDelta",
        "ToolCallEnd",
        "TurnEnd",
        "RunEnd",
    }
)

# Worker exit codes per stop condition (caliband-wire.md §5.1): 0 => done, else failed.
EXIT_CODE_BY_STOP = {"EndOfTurn": 0, "MaxTurnsReached": 75, "Cancelled": 124}


def stop_label(stopped_for: Any) -> str:
    """`"EndOfTurn"` -> itself; `{"MaxTurnsReached": 10}` -> its first key; else ``""``."""
    if isinstance(stopped_for, str):
        return stopped_for
    if isinstance(stopped_for, dict) and stopped_for:
        return str(next(iter(stopped_for)))
    return ""


def stop_detail(stopped_for: Any) -> str | None:
    """The payload of a data-carrying stop condition, rendered as text."""
    if isinstance(stopped_for, dict) and stopped_for:
        value = next(iter(stopped_for.values()))
        if value is None:
            return None
        if isinstance(value, str):
            return value
        if isinstance(value, dict) and set(value) <= {"secs", "nanos"}:
            return f"{value.get('secs', 0) + value.get('nanos', 0) / 1e9:g}s"
        return str(value)
    return None
