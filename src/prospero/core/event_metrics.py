"""What the emitter counts of each batch it commits and publishes: events by workspace and kind,
and from the usage-relevant kinds the runs by result, the turns, tokens and cost by workspace
and model, the decisions by state (the same events the store's usage folding reads:
`core.store.rows.account`), plus the ingest-to-publish latency.

Counted into the live dicts of `Metrics.series` (plain numbers: see `core.metrics` for why),
exported at scrape time. The output events of a run (nearly every event of a busy stream, held
compact as `(stream, chunk)` pairs) are counted at C speed and added at once; each other event
costs a few dict updates. Measured on 2 cores at load 8-14: ~0.1-0.2 µs per published event,
while bench/ingest.py ran at 9-18k events/s (55-110 µs an event end to end) on that machine.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from prospero.core import metrics as m
from prospero.core.metrics import Histogram, Labels, Metrics
from prospero.core.store.base import CursorMark
from prospero.types.events import EventRun, FleetEvent, run_result

_USAGE_TYPES = (
    ("input", "input_tokens"),
    ("output", "output_tokens"),
    ("cache_read", "cache_read_input_tokens"),
    ("cache_write", "cache_creation_input_tokens"),
)


class EventCounter:
    """Counts published batches into `metrics` (one per emitter)."""

    __slots__ = (
        "_agents",
        "_cost",
        "_decisions",
        "_events",
        "_latency",
        "_tokens",
        "_turns",
        "metrics",
    )

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._events = metrics.series(m.EVENTS_APPENDED)
        self._agents = metrics.series(m.AGENTS_FINISHED)
        self._turns = metrics.series(m.TURNS)
        self._tokens = metrics.series(m.TOKENS)
        self._cost = metrics.series(m.COST_USD)
        self._decisions = metrics.series(m.DECISIONS_RESOLVED)
        self._latency: dict[str, Histogram] = {}

    def count(self, entries: Iterable[FleetEvent | EventRun | CursorMark]) -> None:
        """Count a committed batch (cursor marks skipped)."""
        events = self._events
        for e in entries:
            t = type(e)
            if t is EventRun:
                run: EventRun = e  # type: ignore[assignment]
                repo = run.repo
                kinds = run.kinds
                outputs = list(map(type, kinds)).count(tuple)  # (at C speed: most of a run)
                if outputs != len(kinds):
                    for k in kinds:
                        if type(k) is not tuple:
                            self._kind(repo, k)
                if outputs:
                    key = (repo, "output")
                    events[key] = events.get(key, 0) + outputs
            elif t is not CursorMark:
                ev: FleetEvent = e  # type: ignore[assignment]
                self._kind(ev.repo, ev.kind)

    def _kind(self, repo: str, kind: Any) -> None:
        tag: str = kind.kind
        key: Labels = (repo, tag)
        events = self._events
        events[key] = events.get(key, 0) + 1
        if tag == "output":
            return
        if tag == "turn_finished":
            model = kind.model or ""
            wm = (repo, model)
            self._turns[wm] = self._turns.get(wm, 0) + 1
            if kind.cost_usd is not None:
                self._cost[wm] = self._cost.get(wm, 0) + kind.cost_usd
            usage = kind.usage
            if usage is not None:
                tokens = self._tokens
                for name, attr in _USAGE_TYPES:
                    n = getattr(usage, attr)
                    if n:
                        tk = (repo, model, name)
                        tokens[tk] = tokens.get(tk, 0) + n
        elif tag == "agent_finished":
            ok = (repo, run_result(kind.outcome))
            self._agents[ok] = self._agents.get(ok, 0) + 1
        elif tag == "decision_resolved":
            dk = (repo, kind.state or "", kind.option_kind or "")
            self._decisions[dk] = self._decisions.get(dk, 0) + 1

    def latency(self, repo: str) -> Histogram:
        h = self._latency.get(repo)
        if h is None:
            h = self._latency[repo] = self.metrics.histogram(m.INGEST_PUBLISH_SECONDS, (repo,))
        return h


class PublishClock:
    """When each emit call's events were handed over: (position in the emitter's count of
    queued units once they are queued, monotonic time, workspace, events). `done(position)`
    observes the latency of every stamp at or below what has been published."""

    __slots__ = ("_counter", "_stamps")

    def __init__(self, counter: EventCounter) -> None:
        self._counter = counter
        self._stamps: deque[tuple[int, float, str, int]] = deque()

    def stamp(self, position: int, repo: str, n: int) -> None:
        self._stamps.append((position, time.monotonic(), repo, n))

    def done(self, position: int) -> None:
        stamps = self._stamps
        if not stamps or stamps[0][0] > position:
            return
        now = time.monotonic()
        latency = self._counter.latency
        while stamps and stamps[0][0] <= position:
            _, t, repo, n = stamps.popleft()
            latency(repo).observe(now - t, n)
