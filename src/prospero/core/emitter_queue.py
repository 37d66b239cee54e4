"""The emitter's queue: what it holds (events, runs of one stream, cursor marks), how a batch
is taken from it for the store, and what a finished store future means. Pure helpers of
`core.emitter`, no I/O."""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future as ConcurrentFuture
from dataclasses import dataclass

from prospero.core.errors import StoreError
from prospero.core.store.base import CursorMark
from prospero.core.store.base import InlineAppend as StoreInlineAppend
from prospero.core.store.base import Submit as StoreSubmit
from prospero.core.store.reduce import free_form_safe, needs_check, reduce_kind
from prospero.types.events import EventKind, EventRun, FleetEvent, Output

# A queued entry: one event, a run of consecutive events of one stream (`emit_many`), or a
# driver's resume state to commit with the events queued before it (`emit_many(cursor=)`).
Entry = FleetEvent | EventRun | CursorMark


@dataclass(slots=True)
class InFlight:
    """The batch the store is committing on the submit path."""

    entries: list[Entry]
    size: int  # events
    units: int  # events and cursor marks (what `Emitter._advance` counts)
    future: ConcurrentFuture[list[int]]


Submit = StoreSubmit  # (the names the emitter modules use)
InlineAppend = StoreInlineAppend


def expand_any(kind: object) -> EventKind:
    """A kind for validation: a (stream, chunk) pair becomes the Output it stands for."""
    if type(kind) is tuple and len(kind) == 2:
        return Output(stream=kind[0], chunk=kind[1])
    # Anything else goes to validation as it is (which reports it).
    return kind  # type: ignore[return-value]


def materialise(entries: list[Entry]) -> tuple[list[FleetEvent], dict[str, bytes]]:
    """The entries' events, and their cursor marks (the last of each key)."""
    out: list[FleetEvent] = []
    cursors: dict[str, bytes] = {}
    for e in entries:
        t = type(e)
        if t is EventRun:
            out.extend(e.events())  # type: ignore[union-attr]
        elif t is CursorMark:
            cursors[e.key] = e.data  # type: ignore[union-attr]
        else:
            out.append(e)  # type: ignore[arg-type]
    return out, cursors


def failure(future: ConcurrentFuture[list[int]], size: int) -> BaseException | None:
    """The error of a finished store future (None when it succeeded)."""
    if future.cancelled():
        return StoreError("append cancelled")
    error = future.exception()
    if error is None and len(future.result()) != size:
        return StoreError(f"store returned {len(future.result())} ordinals for {size} events")
    return error


def encodable(ev: FleetEvent) -> FleetEvent:
    """The event, or its reduced form if it is poison (what the store would have stored): the
    live view of events that were not stored must still be encodable (SSE)."""
    kind = ev.kind
    try:
        kind.__pydantic_serializer__.to_json(kind, by_alias=True)
        if not needs_check(kind) or free_form_safe(kind):
            return ev
    except ValueError:
        pass
    return ev.model_copy(update={"kind": reduce_kind(kind)})


def take(pending: deque[Entry], limit: int) -> tuple[list[Entry], int, int]:
    """Dequeue up to `limit` events (splitting a run if needed), in order, with the cursor
    marks among and right after them; returns the entries, their event count and their
    units (events + marks). A run followed by its cursor is never split: it goes whole
    (alone if it is larger than `limit`) or waits for the next batch."""
    out: list[Entry] = []
    n = 0
    units = 0
    while pending:
        e = pending[0]
        t = type(e)
        if t is CursorMark:
            pending.popleft()
            out.append(e)
            units += 1
            continue
        if n >= limit:
            break
        size = len(e) if t is EventRun else 1  # type: ignore[arg-type]
        if n + size > limit:
            assert isinstance(e, EventRun)
            if len(pending) > 1 and type(pending[1]) is CursorMark:
                if n:
                    break  # the next batch takes it whole, with its cursor
            else:
                head, pending[0] = e.split(limit - n)
                out.append(head)
                units += limit - n
                n = limit
                break
        pending.popleft()
        out.append(e)
        n += size
        units += size
    return out, n, units
