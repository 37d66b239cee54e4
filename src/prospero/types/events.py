"""Normalised fleet events: the one stream every Prospero surface consumes.

The envelope and the upstream kinds keep caliband-wire.md §6.1 names and JSON shapes. Fields
that upstream throws away (tool input, finished tool name, results, usage, cost) are filled here;
kinds added by Prospero are listed in docs/adr/0002-event-kinds.md. Every kind is
protocol-neutral: the NDJSON and ACP drivers both emit them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, get_args

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
            cache_read_input_tokens=add(
                self.cache_read_input_tokens, other.cache_read_input_tokens
            ),
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


class FileDiff(BaseModel):
    """A file edit a tool call carries (ACP `ToolCallContent` of type `diff`): the file's text
    before (null: a new file) and after."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    path: str = ""
    old_text: str | None = None
    new_text: str = ""


class ToolStarted(_Kind):
    kind: Literal["tool_started"] = "tool_started"
    id: str = ""
    name: str = ""
    # The real tool input (assembled from ToolCallInputDelta fragments); a string when the
    # fragments did not form valid JSON, null when the agent sent none.
    input: Any = None
    # ACP: the `diff` content the call was announced with (the edits it proposes). Absent from
    # the JSON when there is none (an NDJSON call's edit is in its `input`).
    diffs: list[FileDiff] | None = Field(default=None, exclude_if=lambda v: v is None)


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
    # The StopCondition name of the run's `RunEnd` (e.g. "EndOfTurn"), or, for a run that
    # never ended on the wire, "crashed" (the worker died without RunEnd; `detail` says how)
    # or "killed".
    outcome: str = ""
    # null = not reported / not priced (no rate for the model); never a fake 0.
    cost_usd: float | None = None
    turns: int = 0
    usage: Usage | None = None
    model: str | None = None
    # Payload of a data-carrying stop condition, e.g. the ProviderError message.
    detail: str | None = None


RunResult = Literal["done", "failed", "killed", "crashed"]

# The outcome of a run Prospero stopped because it crossed its budget (`budget_exceeded`):
# the agent reads `killed` (it was stopped), /api/usage counts the outcome on its own.
BUDGET_EXCEEDED = "budget_exceeded"


def run_result(outcome: str) -> RunResult:
    """What an `agent_finished` outcome means for the run, as caliband reads a worker's exit:
    only a clean end (`EndOfTurn`, `done`) is done (exit 0); `killed` and `crashed` are
    themselves; every other stop (MaxTurnsReached, Cancelled, Refusal, ProviderError,
    NotResumable, auth_required, ...) exits non-zero, so failed. The one mapping the usage
    outcomes and the agent's status both use."""
    if outcome in ("EndOfTurn", "done"):
        return "done"
    if outcome in ("killed", "crashed", "failed"):
        return outcome  # type: ignore[return-value]
    if outcome == BUDGET_EXCEEDED:
        return "killed"
    return "failed"


BudgetLimit = Literal["usd", "tokens"]
# Whose cap: the agent's own (spawned with it), or its workspace's daily cap (config
# `daily_budget_usd` / `daily_budget_tokens`, per UTC day, all the workspace's agents).
BudgetScope = Literal["agent", "workspace_day"]


class BudgetWarning(_Kind):
    """Prospero addition: the agent has spent `threshold` (0.8) or more of a cap it was
    spawned with (once per cap and agent). `spent` and `cap` in dollars or in tokens (input
    plus output) as `limit` says."""

    kind: Literal["budget_warning"] = "budget_warning"
    limit: BudgetLimit = "usd"
    spent: float = 0.0
    cap: float = 0.0
    threshold: float = 0.8
    scope: BudgetScope = "agent"


class BudgetExceeded(_Kind):
    """Prospero addition: the agent's spend crossed a cap (`limit`): Prospero stops it now
    (ACP: session/cancel, then kill; NDJSON: kill); its run ends with the outcome
    `budget_exceeded`."""

    kind: Literal["budget_exceeded"] = "budget_exceeded"
    limit: BudgetLimit = "usd"
    spent: float = 0.0
    cap: float = 0.0
    scope: BudgetScope = "agent"


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
    # Number of lost source lines when known (an upper bound when `reason` says so, e.g.
    # "ambiguous_overlap"), else null.
    missing: int | None = None
    detail: str = ""
    # Why continuity could not be proven: "no_overlap" (lines produced while detached left
    # the worker's replay), "ambiguous_overlap" (several replay alignments verified; `missing`
    # bounds the lines possibly lost), "slow_reader" (the worker dropped lines for a slow
    # reader), "transcript_mismatch", "worker_exited" ...; null in rows stored before it.
    reason: str | None = None


class FramesSkipped(_Kind):
    """Prospero addition: `count` source lines were skipped for `reason` ("malformed": not a
    JSON object; "oversized": over the 1 MiB line limit; "unknown_type": a frame type this
    Prospero does not know). Coalesced: one event per reason per read of the stream."""

    kind: Literal["frames_skipped"] = "frames_skipped"
    count: int = 0
    reason: str = ""


class TurnLost(_Kind):
    """Prospero addition: a turn in flight was lost (its driver's connection dropped, the agent
    crashed, or prosperod stopped mid-turn); its outcome is unknown. Open tool calls of the
    turn are closed (`tool_finished{ok: false}`) before it. See docs/adr/0005-acp-driver.md."""

    kind: Literal["turn_lost"] = "turn_lost"
    turn: int = 0
    reason: str = ""


class DecisionToolCall(BaseModel):
    """The tool call a permission decision is about (as the agent described it when asking)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str = ""
    title: str = ""
    kind: str | None = None
    input: Any = None


class DecisionOption(BaseModel):
    """One answer the agent offered: `kind` is allow_once | allow_always | reject_once |
    reject_always (an unknown kind is kept as is)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    label: str = ""
    kind: str = ""


class DecisionPending(_Kind):
    """Prospero addition: an agent asks permission and a human is to decide (a supervised
    agent's request that no policy or session rule answered). See
    docs/adr/0006-permission-decisions.md."""

    kind: Literal["decision_pending"] = "decision_pending"
    id: str = ""
    tool_call: DecisionToolCall = Field(default_factory=DecisionToolCall)
    options: list[DecisionOption] = Field(default_factory=list)
    created_at: str = ""
    # RFC 3339; null = waits indefinitely.
    deadline: str | None = None
    posture: str | None = None


class DecisionResolved(_Kind):
    """Prospero addition: a permission decision ended. `state` is decided | expired |
    cancelled; `by` names who answered (an API token name or "anonymous", "policy", "rule",
    "timeout", "cancel", "restart", "takeover"); `rule` names the policy or session rule of an
    automatic answer."""

    kind: Literal["decision_resolved"] = "decision_resolved"
    id: str = ""
    tool_call: DecisionToolCall = Field(default_factory=DecisionToolCall)
    state: str = ""
    option_id: str | None = None
    option_kind: str | None = None
    option_label: str | None = None
    by: str | None = None
    note: str | None = None
    rule: str | None = None
    decided_at: str | None = None


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
    | StreamGap
    | FramesSkipped
    | TurnLost
    | DecisionPending
    | DecisionResolved
    | BudgetWarning
    | BudgetExceeded,
    Field(discriminator="kind"),
]

EVENT_KIND_ADAPTER: TypeAdapter[EventKind] = TypeAdapter(EventKind)

# Every kind model and kind name of the EventKind union (trusted construction checks the
# former; a client's kind filter is validated against the latter).
EVENT_KIND_TYPES: frozenset[type[BaseModel]] = frozenset(get_args(get_args(EventKind)[0]))
EVENT_KIND_NAMES: frozenset[str] = frozenset(
    m.model_fields["kind"].default for m in EVENT_KIND_TYPES
)

TERMINAL_EVENT_KINDS = frozenset({"agent_finished"})


# Trusted construction (the ingest hot path): build a frozen model the way `model_construct`
# does, minus its generic per-field loop. The result is indistinguishable from the validated
# model (same `__dict__`, fields-set, equality, hash and JSON). The fields-set object is shared
# by every instance built here: pydantic never mutates a frozen model's fields-set in place
# (`__setattr__`/`__delattr__` raise first; `model_copy` copies it before updating), and not
# allocating one set per event matters at ingest rates (fewer GC-tracked objects).
_object_setattr = object.__setattr__
_object_new = object.__new__
_OUTPUT_FIELDS_SET = {"stream", "chunk"}


def output_event(stream: Literal["stdout", "thinking"], chunk: str) -> Output:
    """`Output(stream=stream, chunk=chunk)` for trusted arguments, without validation."""
    ev: Output = _object_new(Output)
    _object_setattr(ev, "__dict__", {"kind": "output", "stream": stream, "chunk": chunk})
    _object_setattr(ev, "__pydantic_fields_set__", _OUTPUT_FIELDS_SET)
    _object_setattr(ev, "__pydantic_extra__", None)
    _object_setattr(ev, "__pydantic_private__", None)
    return ev


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

    @classmethod
    def trusted(cls, seq: int, ts: str, repo: str, agent_id: str, kind: EventKind) -> FleetEvent:
        """`FleetEvent(seq=..., ts=..., repo=..., agent_id=..., kind=...)` without validation
        when the arguments are already of the right types (the emitter's hot path); anything
        else goes through normal validation (and fails the same way)."""
        if (
            type(kind) in EVENT_KIND_TYPES
            and type(seq) is int
            and type(ts) is str
            and type(repo) is str
            and type(agent_id) is str
            and cls is FleetEvent
        ):
            ev: FleetEvent = _object_new(FleetEvent)
            _object_setattr(
                ev,
                "__dict__",
                {"seq": seq, "ts": ts, "repo": repo, "agent_id": agent_id, "kind": kind},
            )
            _object_setattr(ev, "__pydantic_fields_set__", _FLEET_EVENT_FIELDS_SET)
            _object_setattr(ev, "__pydantic_extra__", None)
            _object_setattr(ev, "__pydantic_private__", None)
            return ev
        return cls(seq=seq, ts=ts, repo=repo, agent_id=agent_id, kind=kind)

    @classmethod
    def trusted_batch(
        cls, first_seq: int, ts: str, repo: str, agent_id: str, kinds: Sequence[EventKind]
    ) -> list[FleetEvent]:
        """`trusted` for consecutive seqs from `first_seq`, one event per kind, in order."""
        if not (
            type(first_seq) is int
            and type(ts) is str
            and type(repo) is str
            and type(agent_id) is str
            and cls is FleetEvent
        ):
            return [
                cls(seq=first_seq + i, ts=ts, repo=repo, agent_id=agent_id, kind=kind)
                for i, kind in enumerate(kinds)
            ]
        new = _object_new
        setattr_ = _object_setattr
        kind_types = EVENT_KIND_TYPES
        fields_set = _FLEET_EVENT_FIELDS_SET
        out: list[FleetEvent] = []
        append = out.append
        seq = first_seq
        for kind in kinds:
            if type(kind) in kind_types:
                ev: FleetEvent = new(FleetEvent)
                setattr_(
                    ev,
                    "__dict__",
                    {"seq": seq, "ts": ts, "repo": repo, "agent_id": agent_id, "kind": kind},
                )
                setattr_(ev, "__pydantic_fields_set__", fields_set)
                setattr_(ev, "__pydantic_extra__", None)
                setattr_(ev, "__pydantic_private__", None)
            else:
                ev = FleetEvent(seq=seq, ts=ts, repo=repo, agent_id=agent_id, kind=kind)
            append(ev)
            seq += 1
        return out


_FLEET_EVENT_FIELDS_SET = {"seq", "ts", "repo", "agent_id", "kind"}


# How an `EventRun` holds a kind: an `Output` (nearly every event of a busy stream) as its
# (stream, chunk) pair, any other kind as itself. A tuple of two strings is not followed by the
# cyclic GC, so a backlog of queued output costs the GC nothing; the model is rebuilt to publish.
CompactKind = EventKind | tuple[str, str]


def compact_kind(kind: EventKind) -> CompactKind:
    if type(kind) is Output:
        d = kind.__dict__
        return (d["stream"], d["chunk"])
    return kind


def expand_kind(kind: CompactKind) -> EventKind:
    if type(kind) is tuple:
        return output_event(kind[0], kind[1])  # type: ignore[arg-type]
    return kind  # type: ignore[return-value]


class EventRun:
    """Consecutive events of one stream stamped with one `ts`: seqs `first_seq`,
    `first_seq + 1`, ... for `kinds` (`CompactKind`s) in order. The compact, not yet
    materialised form of those `FleetEvent`s: the emitter queues runs and the store writes them,
    and `events()` builds the models only when they are published."""

    __slots__ = ("agent_id", "first_seq", "kinds", "repo", "ts")

    def __init__(
        self, repo: str, agent_id: str, ts: str, first_seq: int, kinds: list[CompactKind]
    ) -> None:
        self.repo = repo
        self.agent_id = agent_id
        self.ts = ts
        self.first_seq = first_seq
        self.kinds = kinds

    def __len__(self) -> int:
        return len(self.kinds)

    def __repr__(self) -> str:
        last = self.first_seq + len(self) - 1
        return f"EventRun({self.stream_key!r}, seq {self.first_seq}..{last})"

    @property
    def stream_key(self) -> str:
        return stream_key_for(self.repo, self.agent_id)

    def events(self) -> list[FleetEvent]:
        return list(self.iter_events())

    def iter_events(self) -> Iterator[FleetEvent]:
        """The run's events, built one at a time (`FleetEvent.trusted`, minus its checks: a
        run only ever holds kinds that passed them when it was queued)."""
        new = _object_new
        setattr_ = _object_setattr
        fields_set = _FLEET_EVENT_FIELDS_SET
        output_fields_set = _OUTPUT_FIELDS_SET
        repo, agent_id, ts = self.repo, self.agent_id, self.ts
        seq = self.first_seq
        for k in self.kinds:
            if type(k) is tuple:  # == expand_kind(k), inlined
                kind: Any = new(Output)
                setattr_(kind, "__dict__", {"kind": "output", "stream": k[0], "chunk": k[1]})
                setattr_(kind, "__pydantic_fields_set__", output_fields_set)
                setattr_(kind, "__pydantic_extra__", None)
                setattr_(kind, "__pydantic_private__", None)
            else:
                kind = k
            ev: FleetEvent = new(FleetEvent)
            setattr_(
                ev,
                "__dict__",
                {"seq": seq, "ts": ts, "repo": repo, "agent_id": agent_id, "kind": kind},
            )
            setattr_(ev, "__pydantic_fields_set__", fields_set)
            setattr_(ev, "__pydantic_extra__", None)
            setattr_(ev, "__pydantic_private__", None)
            yield ev
            seq += 1

    def split(self, n: int) -> tuple[EventRun, EventRun]:
        """The first `n` events and the rest."""
        return (
            EventRun(self.repo, self.agent_id, self.ts, self.first_seq, self.kinds[:n]),
            EventRun(self.repo, self.agent_id, self.ts, self.first_seq + n, self.kinds[n:]),
        )

    def renumbered(self, first_seq: int) -> EventRun:
        return EventRun(self.repo, self.agent_id, self.ts, first_seq, self.kinds)


def kind_to_json(kind: EventKind) -> dict[str, Any]:
    return kind.model_dump(mode="json", by_alias=True)


def parse_kind(data: Any) -> EventKind:
    return EVENT_KIND_ADAPTER.validate_python(data)
