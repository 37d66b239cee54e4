"""The EventStore and ConfigStore seams. SQLite is the embedded default; PostgreSQL later."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

from prospero.types.events import EventRun, FleetEvent
from prospero.types.model import AgentMeta, RegisteredWorkspace


@dataclass(frozen=True)
class StoredEvent:
    """An event with its store-wide insertion ordinal (the fleet stream's resume cursor)."""

    ordinal: int
    event: FleetEvent


class RawEvent(NamedTuple):
    """A stored event as it leaves the store: its full JSON bytes, never decoded into models.

    `data` is byte-identical to `orjson.dumps(event.to_json())` for the stored event (the
    kind's JSON as serialised once at write time, spliced after `seq`, `ts`, `repo`,
    `agent_id`); `cursor` is the event's `seq` from `replay_raw` and its store ordinal from
    `replay_fleet_raw`; `kind` is the kind tag (for filters and the end of a stream)."""

    cursor: int
    seq: int
    kind: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Fence:
    """A write guard: the lease `key` must still be held by `owner` with this `epoch` when the
    append commits (checked in its transaction), else nothing is written (`FenceLost`). An
    epoch of 0 is never held: it fences out a write by a replica that holds no lease at all."""

    key: str
    owner: str
    epoch: int


@dataclass(frozen=True, slots=True)
class CursorMark:
    """A driver's resume state queued in order with the events it covers (the emitter's
    `emit_many(..., cursor=...)`): the store writes it as the `cursors` row `key` (the agent
    id) in the same transaction as the events queued before it, or not at all."""

    key: str
    data: bytes


# What an append takes: events, runs of one stream's events, and the cursor marks they cover.
AppendEntry = FleetEvent | EventRun | CursorMark
# A store's pipelined append (`PipelinedAppends.batch_submitter()`): queued to its writer at
# once, the future resolves to the ordinals (or fails as `append_batch` would); `after`: an
# earlier append that must have succeeded first, else this one writes nothing.
Submit = Callable[[Sequence[AppendEntry], Future[list[int]] | None], Future[list[int]]]
# A store's synchronous append (`PipelinedAppends.inline_appender()`): the ordinals, or None
# when it cannot take the batch right now (nothing written); raises as the submit path's
# future would fail.
InlineAppend = Callable[[Sequence[AppendEntry]], list[int] | None]


@dataclass(frozen=True)
class StoreCapabilities:
    """What an event store declares beyond the EventStore seam, so that nobody probes for it.

    `pipelined_appends`: it implements `PipelinedAppends.batch_submitter` (SQLite's writer
    thread); `inline_appends`: also `PipelinedAppends.inline_appender` (SQLite's append on the
    loop's thread). `shared`: several prosperods may use the same store at once (PostgreSQL),
    so the rows can change under this process (another replica's appends)."""

    pipelined_appends: bool = False
    inline_appends: bool = False
    shared: bool = False
    # `append_batch(fences=...)` is checked in the append's transaction (PostgreSQL); a store
    # without it has one writer and ignores fences.
    fenced_appends: bool = False


@dataclass(frozen=True)
class KindScan:
    """What `EventStore.scan_kinds` read, all of it in one consistent snapshot of the store.

    `last_ordinal`: the store's last ordinal at the read (everything up to it is covered).
    `heads`: stream -> `high_water` at that point, for the streams the scan says may have
    changed (see `scan_kinds`). `rows`: (stream_key, seq, the kind's JSON as stored, UTF-8) of
    the matching events, ascending by ordinal."""

    last_ordinal: int
    heads: dict[str, int]
    rows: list[tuple[str, int, bytes]]


@dataclass
class UsageDay:
    """Aggregates for one workspace and one UTC day, maintained at ingest.

    Token and cost sums are null when no event in the bucket reported them ("not reported"),
    never a fake 0.
    """

    workspace: str
    day: str  # YYYY-MM-DD (UTC)
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    turns: int = 0
    runs: int = 0
    outcomes: dict[str, int] = field(
        default_factory=lambda: {"done": 0, "failed": 0, "killed": 0, "crashed": 0}
    )


@runtime_checkable
class EventStore(Protocol):
    capabilities: StoreCapabilities

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def append_batch(
        self,
        events: Sequence[FleetEvent],
        *,
        cursors: Mapping[str, bytes] | None = None,
        fences: Collection[Fence] | None = None,
    ) -> list[int]:
        """Atomically append events; returns their ordinals. Raises SeqConflict when a
        (stream_key, seq) already exists (nothing of the batch is written then), StoreError
        on any other failure. Updates usage aggregates in the same transaction.

        `cursors`: driver resume states (key -> data, as `save_cursor`) written in the SAME
        transaction: all of them with the events, or none when the append fails. With no
        events, the cursors alone are written.

        `fences`: leases the batch is written under. A store with `fenced_appends` checks each
        in the same transaction and raises `FenceLost` (nothing written) when one is not held
        with that owner and epoch; the others ignore them (one writer).

        Poison events: a kind that cannot be serialised (nesting too deep, a lone surrogate,
        a value JSON cannot carry) is stored in its reduced form (`core.store.reduce`), never
        failing the batch; when `events` is a list, the event is replaced in it by the reduced
        one, so that what the caller publishes is what was stored."""
        ...

    async def replay(
        self,
        stream_key: str,
        from_seq: int = 0,
        limit: int | None = None,
        *,
        kinds: Collection[str] | None = None,
    ) -> list[FleetEvent]:
        """Events of one stream with seq >= from_seq, ascending; with `kinds`, only events of
        those kinds (`limit` then counts the matching events)."""
        ...

    async def replay_fleet(
        self, after_ordinal: int = 0, limit: int | None = None
    ) -> list[StoredEvent]:
        """All streams' events with ordinal > after_ordinal, in insertion order."""
        ...

    async def replay_raw(
        self,
        stream_key: str,
        from_seq: int = 0,
        limit: int | None = None,
        *,
        kinds: Collection[str] | None = None,
    ) -> list[RawEvent]:
        """`replay`, as JSON bytes (`RawEvent`, cursor = seq): the same events, in the same
        order, each `data` equal to `orjson.dumps(event.to_json())`."""
        ...

    async def replay_fleet_raw(
        self,
        after_ordinal: int = 0,
        limit: int | None = None,
        *,
        kinds: Collection[str] | None = None,
    ) -> list[RawEvent]:
        """`replay_fleet`, as JSON bytes (`RawEvent`, cursor = ordinal); with `kinds`, only
        events of those kinds (`limit` then counts the matching events)."""
        ...

    async def high_water(self, stream_key: str) -> int:
        """Highest seq stored for the stream, 0 when none."""
        ...

    async def scan_kinds(
        self,
        streams: Collection[str],
        kinds: Collection[str],
        *,
        after_ordinal: int = 0,
        known: Collection[str] = (),
    ) -> KindScan:
        """One read for an incremental fold over many streams (the dashboard's totals), in one
        consistent snapshot whose last ordinal is L (`last_ordinal`; never below
        `after_ordinal`).

        `known` (a subset of `streams`): streams whose events up to `after_ordinal` the caller
        has already folded. `rows`: the events of `kinds` of every stream in `streams` with
        ordinal in (after_ordinal, L], and those with ordinal <= after_ordinal of each stream
        not in `known`, so every stream is complete up to L, ascending by ordinal. `heads`:
        `high_water` at L of each stream not in `known`, and of each `known` stream that has
        an event (of any kind) in (after_ordinal, L]; a known stream left out is unchanged
        since after_ordinal. Costs what is new, not one round trip per stream."""
        ...

    async def last_ordinal(self) -> int: ...

    async def writable(self) -> bool: ...

    async def prune(self, before_ts: str) -> int:
        """Delete events with ts < before_ts (string compare); returns how many."""
        ...

    async def usage(self, since_day: str, until_day: str) -> list[UsageDay]:
        """Aggregates for days in [since_day, until_day] inclusive, by workspace then day."""
        ...

    async def save_cursor(self, key: str, data: bytes) -> None:
        """Opaque driver resume state (e.g. NDJSON line cursor), keyed by agent id, on its
        own (for sinks without a batch path; see `append_batch(cursors=)`)."""
        ...

    async def load_cursor(self, key: str) -> bytes | None: ...


class PipelinedAppends(Protocol):
    """The faster ways into a store that declares them in its `capabilities` (the emitter's
    live path). Each is asked again for every batch: None means "not now, use `append_batch`"
    (e.g. the store is closing, or `append_batch` is customised and must see every append)."""

    def batch_submitter(self) -> Submit | None: ...

    def inline_appender(self) -> InlineAppend | None: ...


@runtime_checkable
class ConfigStore(Protocol):
    async def list_workspaces(self) -> list[RegisteredWorkspace]:
        """In name order."""
        ...

    async def upsert_workspace(self, ws: RegisteredWorkspace) -> None: ...

    async def delete_workspace(self, name: str) -> bool: ...


@runtime_checkable
class AgentMetaStore(Protocol):
    """Prospero's own per-agent metadata (AgentMeta), keyed by agent id (issue 9 contract 3)."""

    async def get_meta(self, agent_id: str) -> AgentMeta | None: ...

    async def put_meta(self, meta: AgentMeta) -> None:
        """Insert or replace the agent's metadata."""
        ...

    async def list_meta(self) -> list[AgentMeta]:
        """Every stored agent's metadata, in agent-id order."""
        ...

    async def delete_meta(self, agent_id: str) -> bool: ...

    async def close(self) -> None:
        """Release what it holds (connections); the manager closes a store it made itself."""
        ...
