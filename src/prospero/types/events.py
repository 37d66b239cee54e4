"""Normalised fleet events: the one stream every Prospero surface consumes.

The envelope and the upstream kinds keep caliband-wire.md §6.1 names and JSON shapes. Fields
that upstream throws away (tool input, finished tool name, results, usage, cost) are filled here;
kinds added by Prospero are listed in docs/adr/0002-event-kinds.md. Every kind is
protocol-neutral: the NDJSON and ACP drivers both emit them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from prospero.types.model import AgentStatus, WorkspaceHealth


class _Kind(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Usage(BaseModel):
    """Token usage as the agent reported it. A missing object means "not reported"."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None

    def plus(self, other: Usage) -> Usage:
        def add(a: int | None, b: int | None) -> int | None:
            if a is None and b is None:
                return None
            return (a or 0) + (b or 0)

        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_creation_input_tokens=add(
                self.cache_creation_input_tokens, other.cache_creation_input_tokens
            ),
            cache_read_input_tokens=add(self.cache_read_input_tokens, other.cache_read_input_tokens),
        )


class ToolResult(BaseModel):
    """What a tool returned: flattened text (capped by the agent) and whether it was cut."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    text: str = ""
    truncated: bool = False


class AgentSpawned(_Kind):
    kind: Literal["agent_spawned"] = "agent_spawned"


class AgentDiscovered(_Kind):
    kind: Literal["agent_discovered"] = "agent_discovered"


class AgentInit(_Kind):
    """Legacy upstream kind (never produced by the NDJSON path); kept so stored rows parse."""

    kind: Literal["agent_init"] = "agent_init"
    model: str = ""
    tools: list[str] = Field(default_factory=list)
    session_id: str = ""


class StatusChanged(_Kind):
    kind: Literal["status_changed"] = "status_changed"
    from_: AgentStatus = Field(alias="from")
    to: AgentStatus

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class Output(_Kind):
    kind: Literal["output"] = "output"
    stream: Literal["stdout", "thinking"] = "stdout"
    chunk: str = ""


class ToolStarted(_Kind):
    kind: Literal["tool_started"] = "tool_started"
    id: str = ""
    name: str = ""
    # The real tool input (assembled from ToolCallInputDelta fragments); a string when the
    # fragments did not form valid JSON, null when the agent sent none.
    input: Any = None


class ToolFinished(_Kind):
    kind: Literal["tool_finished"] = "tool_finished"
    id: str = ""
    name: str = ""
    ok: bool = True
    result: ToolResult | None = None


class TurnFinished(_Kind):
    """Prospero addition: one model turn ended; carries that turn's usage (null = not reported)."""

    kind: Literal["turn_finished"] = "turn_finished"
    turn: int = 0
    stop_reason: str | None = None
    model: str | None = None
    usage: Usage | None = None
    cost_usd: float | None = None


class AgentFinished(_Kind):
    kind: Literal["agent_finished"] = "agent_finished"
    outcome: str = ""
    # null = not reported / not priced (no rate for the model); never a fake 0.
    cost_usd: float | None = None
    turns: int = 0
    usage: Usage | None = None
    model: str | None = None
    # Payload of a data-carrying stop condition, e.g. the ProviderError message.
    detail: str | None = None


class AgentGone(_Kind):
    kind: Literal["agent_gone"] = "agent_gone"


class StorePersistFailed(_Kind):
    kind: Literal["store_persist_failed"] = "store_persist_failed"
    lost_seq: int
    detail: str = ""


class RepoHealth(_Kind):
    kind: Literal["repo_health"] = "repo_health"
    state: WorkspaceHealth


class StreamGap(_Kind):
    """Prospero addition: the driver could not prove continuity; data may have been lost."""

    kind: Literal["stream_gap"] = "stream_gap"
    # Number of lost source lines when known, else null.
    missing: int | None = None
    detail: str = ""


EventKind = Annotated[
    AgentSpawned
    | AgentDiscovered
    | AgentInit
    | StatusChanged
    | Output
    | ToolStarted
    | ToolFinished
    | TurnFinished
    | AgentFinished
    | AgentGone
    | StorePersistFailed
    | RepoHealth
    | StreamGap,
    Field(discriminator="kind"),
]

EVENT_KIND_ADAPTER: TypeAdapter[EventKind] = TypeAdapter(EventKind)

TERMINAL_EVENT_KINDS = frozenset({"agent_finished"})


def now_ts() -> str:
    """RFC 3339 UTC with a `+00:00` offset and microseconds (string-comparable)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def stream_key_for(repo: str, agent_id: str) -> str:
    if agent_id:
        return agent_id
    if repo:
        return f"repo:{repo}"
    return "fleet"


class FleetEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    seq: int
    ts: str
    repo: str = ""
    agent_id: str = ""
    kind: EventKind

    @property
    def stream_key(self) -> str:
        return stream_key_for(self.repo, self.agent_id)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def kind_to_json(kind: EventKind) -> dict[str, Any]:
    return kind.model_dump(mode="json", by_alias=True)


def parse_kind(data: Any) -> EventKind:
    return EVENT_KIND_ADAPTER.validate_python(data)
