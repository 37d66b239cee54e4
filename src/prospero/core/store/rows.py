"""Dialect-neutral encoding of the `events` rows and the usage folding (both stores share it).

Writing: `event_rows` turns a batch (events, `EventRun`s; `CursorMark`s are skipped) into
rows `(stream_key, seq, ts, repo, agent_id, kind_tag, kind)`, the kind as its JSON (by alias,
as `model_dump_json` writes it) and `kind_tag` its discriminator, so reads can filter on the tag
before any JSON is decoded. A poison kind (one that cannot be serialised, or a free-form value
JSON cannot carry as it is) is written in its reduced form (`core.store.reduce`) and replaced
by it in the batch, never failing its neighbours (docs/adr/0004). On the way, `account` folds
the usage-relevant events into per-workspace, per-UTC-day deltas (`UsageAcc`, one
`usage_rows` row each): tokens, cost and turns from each `turn_finished` (counted as the turn
ends, whatever the agent's state), one run and its outcome from each `agent_finished` (see
`types.events.run_result`). Null sums stay null until an event reports a value.

Reading: `row_to_event` decodes a stored row into a `FleetEvent`; `raw_events` splices the
stored kind JSON into the event's JSON bytes (`FleetEvent.to_json()`), never decoding it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from prospero.core.store.base import CursorMark, RawEvent
from prospero.core.store.reduce import free_form_safe, needs_check, reduce_compact, reduce_kind
from prospero.types.events import (
    BUDGET_EXCEEDED,
    EVENT_KIND_ADAPTER,
    EVENT_KIND_NAMES,
    AgentFinished,
    EventRun,
    FleetEvent,
    TurnFinished,
    run_result,
    stream_key_for,
)

log = logging.getLogger(__name__)

# The run outcomes `usage_daily` counts, in its column order.
OUTCOMES = ("done", "failed", "killed", "crashed", "budget_exceeded")

USAGE_TAGS = frozenset({"turn_finished", "agent_finished"})


@dataclass(slots=True)
class UsageAcc:
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    turns: int = 0
    runs: int = 0
    done: int = 0
    failed: int = 0
    killed: int = 0
    crashed: int = 0
    budget_exceeded: int = 0

    def row(self, workspace: str, day: str) -> tuple[Any, ...]:
        return (
            workspace,
            day,
            self.input_tokens,
            self.output_tokens,
            self.cost_usd,
            self.turns,
            self.runs,
            self.done,
            self.failed,
            self.killed,
            self.crashed,
            self.budget_exceeded,
        )


def _nadd(a: Any, b: Any) -> Any:
    if b is None:
        return a
    if a is None:
        return b
    return a + b


def event_rows(
    entries: Sequence[FleetEvent | EventRun | CursorMark],
    usage: dict[tuple[str, str], UsageAcc],
) -> Iterator[tuple[Any, ...]]:
    """The events' rows, in order (cursor marks skipped); folds usage-relevant events into
    `usage` on the way. A poison kind is replaced by its reduced form (`core.store.reduce`): in the
    run's kinds, or in `entries` itself when it is a list, so what is published is what is
    stored."""
    for i, entry in enumerate(entries):
        t = type(entry)
        if t is EventRun:
            run: EventRun = entry  # type: ignore[assignment]
            repo, agent_id, ts, seq = run.repo, run.agent_id, run.ts, run.first_seq
            first = seq
            key = agent_id or stream_key_for(repo, agent_id)
            kinds = run.kinds
            for kind in kinds:
                if type(kind) is tuple:  # an Output as (stream, chunk): see CompactKind
                    try:
                        body = output_json(kind[0], kind[1])
                    except TypeError:  # a lone surrogate
                        kinds[seq - first] = reduced = reduce_compact(kind)
                        _log_reduced(key, seq, "output")
                        body = output_json(reduced[0], reduced[1])  # type: ignore[index]
                    yield (key, seq, ts, repo, agent_id, "output", body)
                    seq += 1
                    continue
                tag = kind.kind  # type: ignore[union-attr]
                try:
                    # == kind.model_dump_json(by_alias=True), minus the Python-level wrapper.
                    body = kind.__pydantic_serializer__.to_json(kind, by_alias=True).decode()  # type: ignore[union-attr]
                    if needs_check(kind) and not free_form_safe(kind):
                        raise ValueError("free-form value JSON cannot carry as it is")
                except ValueError:
                    kinds[seq - first] = kind = reduce_kind(kind)  # type: ignore[arg-type]
                    _log_reduced(key, seq, tag)
                    body = kind.__pydantic_serializer__.to_json(kind, by_alias=True).decode()
                yield (key, seq, ts, repo, agent_id, tag, body)
                if tag in USAGE_TAGS:
                    account(usage, kind, repo, ts)
                seq += 1
            continue
        if t is CursorMark:
            continue
        ev: FleetEvent = entry  # type: ignore[assignment]
        kind = ev.kind
        tag = kind.kind
        repo, agent_id, ts = ev.repo, ev.agent_id, ev.ts
        key = agent_id or stream_key_for(repo, agent_id)
        try:
            body = kind.__pydantic_serializer__.to_json(kind, by_alias=True).decode()
            if needs_check(kind) and not free_form_safe(kind):
                raise ValueError("free-form value JSON cannot carry as it is")
        except ValueError:
            kind = reduce_kind(kind)
            _log_reduced(key, ev.seq, tag)
            body = kind.__pydantic_serializer__.to_json(kind, by_alias=True).decode()
            if isinstance(entries, list):
                entries[i] = ev.model_copy(update={"kind": kind})
        yield (key, ev.seq, ts, repo, agent_id, tag, body)
        if tag in USAGE_TAGS:
            account(usage, kind, repo, ts)


def _log_reduced(key: str, seq: int, tag: str) -> None:
    log.warning(
        "agent %r seq %d: the %s event cannot be serialised as it is; stored in its reduced "
        "form (docs/adr/0004)",
        key,
        seq,
        tag,
    )


def output_json(stream: str, chunk: str) -> str:
    """`Output(stream=stream, chunk=chunk).model_dump_json()`, without building the model:
    orjson and pydantic write the same JSON for these (plain strings; tested)."""
    return orjson.dumps({"kind": "output", "stream": stream, "chunk": chunk}).decode()


def usage_rows(usage: dict[tuple[str, str], UsageAcc]) -> list[tuple[Any, ...]]:
    return [acc.row(ws, day) for (ws, day), acc in usage.items()]


def encode_batch(
    entries: Sequence[FleetEvent | EventRun | CursorMark],
) -> tuple[list[Any], list[Any]]:
    """The batch's event rows (`event_rows`) and its usage rows (`usage_rows`)."""
    usage: dict[tuple[str, str], UsageAcc] = {}
    rows = list(event_rows(entries, usage))  # tuples of atoms: the GC untracks them, never promotes
    return rows, usage_rows(usage)


def account(usage: dict[tuple[str, str], UsageAcc], kind: Any, repo: str, ts: str) -> None:
    """Fold a usage-relevant event into the per-workspace, per-UTC-day deltas: tokens, cost
    and turns from each `turn_finished` (as it happens, whatever the agent's state), the run
    and its outcome from `agent_finished` (once per run; its own totals are not counted, they
    would count the turns twice)."""
    if isinstance(kind, TurnFinished):
        acc = usage.setdefault((repo, ts[:10]), UsageAcc())
        acc.turns += 1
        acc.cost_usd = _nadd(acc.cost_usd, kind.cost_usd)
        if kind.usage is not None:
            acc.input_tokens = _nadd(acc.input_tokens, kind.usage.input_tokens)
            acc.output_tokens = _nadd(acc.output_tokens, kind.usage.output_tokens)
    elif isinstance(kind, AgentFinished):
        acc = usage.setdefault((repo, ts[:10]), UsageAcc())
        acc.runs += 1
        # A run stopped at its budget reads `killed` but is counted on its own.
        name = kind.outcome if kind.outcome == BUDGET_EXCEEDED else run_result(kind.outcome)
        setattr(acc, name, getattr(acc, name) + 1)


# A kind's stored JSON begins with its tag (the discriminator is every kind model's first
# field): checked instead of decoding, so a row the model would not read back is skipped, as
# `row_to_event` skips it.
KIND_PREFIX: dict[str, tuple[bytes, bytes]] = {
    tag: (b'{"kind":' + orjson.dumps(tag) + b",", b'{"kind":' + orjson.dumps(tag) + b"}")
    for tag in EVENT_KIND_NAMES
}


def raw_events(rows: list[tuple[Any, ...]], by_ordinal: bool) -> list[RawEvent]:
    """The rows' events as `FleetEvent.to_json()` JSON bytes (orjson's), spliced from the
    stored columns: `{"seq":…,"ts":…,"repo":…,"agent_id":…,"kind":<stored JSON>}`."""
    dumps = orjson.dumps
    prefix = KIND_PREFIX
    heads: dict[tuple[str, str], bytes] = {}
    out: list[RawEvent] = []
    append = out.append
    for row in rows:
        if by_ordinal:
            cursor, seq, ts, repo, agent_id, tag, kind = row
        else:
            seq, ts, repo, agent_id, tag, kind = row
            cursor = seq
        p = prefix.get(tag)
        if p is None or not kind.startswith(p) or type(seq) is not int:
            log.warning("skipping unreadable stored event (%r, seq %s)", agent_id or repo, seq)
            continue
        head = heads.get((repo, agent_id))
        if head is None:
            head = heads[(repo, agent_id)] = (
                b',"repo":' + dumps(repo) + b',"agent_id":' + dumps(agent_id) + b',"kind":'
            )
        append(RawEvent(cursor, seq, tag, b'{"seq":%d,"ts":%b%b%b}' % (seq, dumps(ts), head, kind)))
    return out


def row_to_event(row: tuple[Any, ...]) -> FleetEvent | None:
    seq, ts, repo, agent_id, kind = row
    try:
        return FleetEvent(
            seq=seq,
            ts=ts,
            repo=repo,
            agent_id=agent_id,
            kind=EVENT_KIND_ADAPTER.validate_json(kind),
        )
    except ValueError as e:
        log.warning("skipping unreadable stored event (%r, seq %s): %s", agent_id or repo, seq, e)
        return None
