"""Judging a stored history against the uncut normalisation of what the worker wrote.

`judge(stored, expected)` splits the stored stream events at its `stream_gap`s. Correct means
either the stream equals the expected events exactly, or: the part before the first gap is a
prefix of the expected events, the part after the last gap a suffix, each middle part appears
in order in between, and every gap covers exactly the events skipped at its place (its
`missing` line count must fit the skipped lines; an upper bound when its reason says so;
`None` = unknown). Counted as well, for the summary: duplicated events and silent losses
(events missing where no gap stands), from a prefix/suffix comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prospero.core.normalize import Normalizer, NormalizerOptions
from prospero.core.transport import MAX_LINE
from prospero.types.events import AgentFinished, EventKind, FleetEvent, StreamGap

# Kinds derived from the agent's stream (what the normaliser produces, plus what a driver
# concludes for a run that never ended). Everything else (agent_spawned, status_changed, ...)
# is the manager's and not compared.
STREAM_KINDS = frozenset(
    {"output", "tool_started", "tool_finished", "turn_finished", "agent_finished"}
)
UPPER_BOUND_REASONS = frozenset({"ambiguous_overlap", "slow_reader"})
OPTS = NormalizerOptions(include_thinking=False)
SUMMARY: list[str] = []  # one line per fault-suite test, shown in pytest's terminal summary


def report(line: str) -> None:
    """Print a count line now (`-s`) and in the terminal summary."""
    print(line)
    SUMMARY.append(line)


@dataclass
class Expected:
    events: list[dict[str, Any]]
    line_of: list[int]  # index of the line that produced each event
    lines: int


def expected_of(lines: Sequence[bytes], include_thinking: bool = False) -> Expected:
    """The uncut normalisation, each event tagged with the line that produced it."""
    norm = Normalizer(NormalizerOptions(include_thinking=include_thinking))
    events: list[dict[str, Any]] = []
    line_of: list[int] = []
    for i, line in enumerate(lines):
        if len(line) > MAX_LINE:  # over the line limit: skipped (and counted) by every reader
            continue
        for ev in norm.feed(line):
            events.append(ev.model_dump(mode="json"))
            line_of.append(i)
    for ev in norm.flush():
        events.append(ev.model_dump(mode="json"))
        line_of.append(len(lines) - 1)
    return Expected(events, line_of, len(lines))


@dataclass
class Verdict:
    ok: bool
    exact: bool
    duplicates: int = 0
    silent_loss: int = 0
    gaps: int = 0
    covered: int = 0  # expected events skipped under a gap
    frames_skipped: dict[str, int] = field(default_factory=dict)
    detail: str = ""
    seq_ok: bool = True


def stream_of(history: Sequence[FleetEvent | EventKind]) -> list[EventKind]:
    kinds = [h.kind if isinstance(h, FleetEvent) else h for h in history]
    return [k for k in kinds if k.kind in STREAM_KINDS or k.kind == "stream_gap"]


def _lcp(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _lcs_suffix(a: Sequence[Any], b: Sequence[Any], limit: int) -> int:
    i = 0
    while i < limit and a[len(a) - 1 - i] == b[len(b) - 1 - i]:
        i += 1
    return i


def _find(hay: Sequence[Any], needle: Sequence[Any], start: int) -> int:
    if not needle:
        return start
    for s in range(start, len(hay) - len(needle) + 1):
        if hay[s] == needle[0] and list(hay[s : s + len(needle)]) == list(needle):
            return s
    return -1


def judge(
    history: Sequence[FleetEvent | EventKind],
    exp: Expected,
    *,
    concluded_outcomes: frozenset[str] = frozenset(),
) -> Verdict:
    """See the module doc. `concluded_outcomes`: the run's tail was lost for good (the worker
    exited while detached and its transcript is not readable here); a final `agent_finished`
    with one of these outcomes right after a gap is then the driver's own conclusion."""
    kinds = [h.kind if isinstance(h, FleetEvent) else h for h in history]
    skipped: dict[str, int] = {}
    for k in kinds:
        if k.kind == "frames_skipped":
            reason = str(getattr(k, "reason", ""))
            skipped[reason] = skipped.get(reason, 0) + int(getattr(k, "count", 0))
    stream = stream_of(history)
    seq_ok = True
    if history and isinstance(history[0], FleetEvent):
        seqs = [h.seq for h in history if isinstance(h, FleetEvent)]
        seq_ok = seqs == list(range(1, len(seqs) + 1))
    segs: list[list[dict[str, Any]]] = [[]]
    gaps: list[StreamGap] = []
    for k in stream:
        if isinstance(k, StreamGap):
            gaps.append(k)
            segs.append([])
        else:
            segs[-1].append(k.model_dump(mode="json"))
    concluded = False
    if gaps and concluded_outcomes and segs[-1]:
        # The driver's own end of a run whose tail is gone: the held-back tool call flushed,
        # open tool calls closed (ok: false), agent_finished with a concluded outcome.
        tail = segs[-1]
        last = tail[-1]
        if last.get("kind") == "agent_finished" and last.get("outcome") in concluded_outcomes:
            cut = len(tail) - 1
            while cut > 0 and (
                tail[cut - 1].get("kind") == "tool_started"
                or (
                    tail[cut - 1].get("kind") == "tool_finished"
                    and tail[cut - 1].get("ok") is False
                )
            ):
                cut -= 1
            segs[-1] = tail[:cut]
            concluded = True
    E = exp.events
    n = len(E)
    flat = [e for s in segs for e in s]
    p = _lcp(flat, E)
    q = _lcs_suffix(flat, E, min(len(flat), n) - p)
    dup = len(flat) - p - q
    missing_flat = n - p - q
    v = Verdict(ok=False, exact=False, gaps=len(gaps), frames_skipped=skipped, seq_ok=seq_ok)
    if not gaps:
        v.exact = v.ok = flat == E
        v.duplicates, v.silent_loss = dup, missing_flat
        if not v.ok:
            v.detail = f"no gap; first difference at event {p} of {n} (stored {len(flat)})"
        return v
    # Structural check: prefix, in-order middles, suffix; each gap covers its skipped events.
    pos = len(segs[0])
    problems: list[str] = []
    silent_hole = 0
    if E[:pos] != segs[0]:
        hole = _hole(segs[0], E)
        problems.append(
            "events before the first gap are not a prefix of the uncut run"
            + (f" ({hole} events silently missing before it)" if hole > 0 else "")
        )
        silent_hole = max(0, hole)
    covered = 0
    for i, gap in enumerate(gaps):
        seg = segs[i + 1]
        if i + 1 == len(gaps):
            start = n - len(seg)
            if start < pos:
                problems.append(f"{pos - start} events after the last gap repeat earlier ones")
                dup = max(dup, pos - start)
            elif E[start:] != seg:
                problems.append("events after the last gap are not a suffix of the uncut run")
        else:
            start = _place(E, exp, seg, pos, gap, n - sum(len(x) for x in segs[i + 2 :]))
            if start < 0:
                problems.append(f"events between gaps {i + 1} and {i + 2} are not in the run")
                break
        if start < pos:
            break
        covered += start - pos
        problems += _check_gap(gap, exp, pos, start, concluded and i + 1 == len(gaps))
        pos = start + len(seg)
    v.covered = covered
    v.ok = not problems
    if v.ok:
        v.duplicates = v.silent_loss = 0
    else:
        v.duplicates = dup
        v.silent_loss = max(silent_hole, missing_flat - covered)
        v.detail = "; ".join(problems)
    return v


def _hole(seg: Sequence[Any], E: Sequence[Any]) -> int:
    """`seg` is E's prefix with one block of d events cut out: the smallest such d, or -1."""
    p = _lcp(seg, E)
    rest = seg[p:]
    for d in range(1, len(E) - p - len(rest) + 1):
        if list(E[p + d : p + d + len(rest)]) == list(rest):
            return d
    return -1


def _place(
    E: Sequence[Any], exp: Expected, seg: Sequence[Any], pos: int, gap: StreamGap, end: int
) -> int:
    """Where a segment between two gaps sits in the uncut run: the latest start >= `pos` it
    matches at that leaves room for the rest (`end`) and that `gap` covers (periodic runs
    match in many places; any placement that every gap accounts for is a correct history)."""
    best = -1
    s = _find(E, seg, pos)
    while 0 <= s and s + len(seg) <= end:
        if not _check_gap(gap, exp, pos, s, False):
            best = s
        s = _find(E, seg, s + 1)
    return best


def _check_gap(gap: StreamGap, exp: Expected, pos: int, start: int, open_end: bool) -> list[str]:
    """Does `gap` (placed after expected event `pos - 1`) cover exactly events pos..start-1?"""
    missing = gap.missing
    if missing is None:
        return []
    lo = exp.line_of[start - 1] - exp.line_of[pos] + 1 if start > pos else 0
    before = exp.line_of[pos - 1] if pos > 0 else -1
    after = exp.line_of[start] if start < len(exp.line_of) else exp.lines
    hi = after - before - 1
    if open_end:
        hi = exp.lines
    reason = getattr(gap, "reason", None)
    if reason in UPPER_BOUND_REASONS:
        return [] if missing >= lo else [f"gap bound {missing} < {lo} lines skipped ({reason})"]
    if lo <= missing <= hi:
        return []
    return [f"gap says {missing} lines missing, {lo}..{hi} were skipped"]


def agent_finished_count(history: Sequence[FleetEvent | EventKind]) -> int:
    kinds = [h.kind if isinstance(h, FleetEvent) else h for h in history]
    return sum(1 for k in kinds if isinstance(k, AgentFinished))


@dataclass
class RunCheck:
    """One agent's stored history against its transcript (the SIGKILL suites' per-agent
    verdict): `problem` is None when the history is exact (or every loss is a covering gap),
    its seqs run 1..N with no hole or repeat, and the run ended exactly once."""

    events: int
    duplicates: int
    silent_loss: int
    seq_holes: int
    gaps: int
    finished: int
    problem: str | None


def check_run(label: str, history: Sequence[FleetEvent], lines: Sequence[bytes]) -> RunCheck:
    v = judge(history, expected_of(lines, include_thinking=True))
    seqs = [e.seq for e in history]
    holes = len(set(range(1, max(seqs, default=0) + 1)) - set(seqs)) + len(seqs) - len(set(seqs))
    n_fin = sum(1 for e in history if e.kind.kind == "agent_finished")
    problem = None
    if not (v.ok and v.seq_ok) or holes or n_fin != 1:
        problem = (
            f"{label}: ok={v.ok} exact={v.exact} dup={v.duplicates} loss={v.silent_loss} "
            f"gaps={v.gaps} seq_holes={holes} agent_finished={n_fin} {v.detail}"
        )
    return RunCheck(len(history), v.duplicates, v.silent_loss, holes, v.gaps, n_fin, problem)
