"""Pure unit tests for LineCursor: exact re-attach over a replay-the-last-N-lines stream."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from prospero.core.drivers.line_cursor import Gap, LineCursor, NewLine, line_digest

RING = 1024
GAP = b"<GAP>"


@dataclass
class Worker:
    """Model of a caliban worker's attach socket: ring replay + live lines, no markers."""

    history: list[bytes]
    ring: int = RING
    progress: int = 0  # lines produced so far

    def connection(self, advance: int, live: int, cut_after: int | None) -> tuple[int, list[bytes]]:
        """The worker produces `advance` lines while we are away, then serves a connection that
        carries its replay plus `live` lines, cut after `cut_after` lines (None = not cut)."""
        self.progress = min(len(self.history), self.progress + advance)
        start = max(0, self.progress - self.ring)
        end = min(len(self.history), self.progress + live)
        self.progress = end
        delivered = self.history[start:end]
        if cut_after is not None:
            delivered = delivered[:cut_after]
        return start, delivered


@dataclass
class Consumer:
    cursor: LineCursor[bytes] = field(default_factory=LineCursor)
    out: list[bytes] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)

    def connect(self, lines: list[bytes]) -> int:
        self.cursor.begin_connection()
        for ln in lines:
            for item in self.cursor.push(line_digest(ln), ln):
                if isinstance(item, NewLine):
                    self.out.append(item.payload)
                else:
                    self.gaps.append(item)
                    self.out.append(GAP)
        return self.cursor.end_connection()


def lines(n: int, prefix: str = "L") -> list[bytes]:
    return [f'{{"type":"AssistantTextDelta","text":"{prefix}{k}"}}'.encode() for k in range(n)]


# ---- examples ---------------------------------------------------------------------------------


def test_first_connection_everything_is_new() -> None:
    hist = lines(3000)
    c = Consumer()
    assert c.connect(hist) == 0
    assert c.out == hist and c.cursor.seen == 3000 and not c.gaps


def test_short_run_replayed_from_line_one() -> None:
    hist = lines(10)
    c = Consumer()
    c.connect(hist[:4])
    c.connect(hist[:4])  # nothing new: all old
    assert c.out == hist[:4]
    c.connect(hist)  # replay 1..10: 5..10 are new
    assert c.out == hist and not c.gaps


def test_long_run_reconnects_after_1024_lines_exactly() -> None:
    hist = lines(3000)
    w = Worker(hist)
    c = Consumer()
    c.connect(w.connection(0, 1500, None)[1])
    assert c.out == hist[:1500]
    # Reconnect: the replay is lines 477..1500 (upstream's line counting would skip 1024 new lines).
    c.connect(w.connection(100, 700, None)[1])
    c.connect(w.connection(0, 10_000, None)[1])
    assert c.out == hist and not c.gaps


def test_gap_when_replay_does_not_overlap() -> None:
    hist = lines(3000)
    w = Worker(hist)
    c = Consumer()
    c.connect(w.connection(0, 100, None)[1])
    c.connect(w.connection(1500, 10_000, None)[1])  # 1500 lines produced while away
    assert len(c.gaps) == 1 and c.gaps[0].missing is None
    assert "lost" in c.gaps[0].detail
    lost_until = 1600 - RING
    assert c.out == [*hist[:100], GAP, *hist[lost_until:]]


def test_boundary_exactly_ring_lines_away_is_reported_as_possible_gap() -> None:
    hist = lines(2000)
    w = Worker(hist)
    c = Consumer()
    c.connect(w.connection(0, 100, None)[1])
    c.connect(w.connection(RING, 10_000, None)[1])
    # Nothing was lost, but the replay shares no line with what we hold: indistinguishable.
    assert c.out == [*hist[:100], GAP, *hist[100:]]


def test_cut_during_replay_discards_undecided_lines_then_recovers() -> None:
    hist = lines(1500)
    w = Worker(hist)
    c = Consumer()
    c.connect(w.connection(0, 1200, None)[1])
    # Replay of 1024 lines cut after 300: all of them are old, the overlap is still unverified.
    _start, delivered = w.connection(0, 0, 300)
    assert c.connect(delivered) == 300
    assert c.out == hist[:1200]
    c.connect(w.connection(0, 10_000, None)[1])
    assert c.out == hist and not c.gaps


def test_no_lines_at_all_on_a_connection() -> None:
    c = Consumer()
    c.connect(lines(5))
    assert c.connect([]) == 0
    assert c.out == lines(5)


def test_identical_lines_never_duplicate() -> None:
    # The pathological periodic case: every line is the same. Longest overlap wins.
    same = [b'{"type":"AssistantTextDelta","text":" "}'] * 50
    c = Consumer()
    c.connect(same[:20])
    c.connect(same[:30])  # replay from 1, 10 new... indistinguishable: taken as old + 10 new
    assert len(c.out) <= 30
    assert all(x == same[0] for x in c.out) and not c.gaps


def test_state_roundtrip_mid_run() -> None:
    hist = lines(2500)
    w = Worker(hist)
    a = Consumer()
    a.connect(w.connection(0, 1800, None)[1])
    b = Consumer(cursor=LineCursor())
    b.cursor.restore(a.cursor.state())
    b.out = list(a.out)
    assert b.cursor.seen == 1800
    b.connect(w.connection(50, 10_000, None)[1])
    assert b.out == hist and not b.gaps


@pytest.mark.parametrize(
    "state",
    [
        None,
        {},
        {"seen": -1, "held": ""},
        {"seen": True, "held": ""},
        {"seen": 1, "held": "!!"},
        {"seen": 1, "held": "AAAA"},  # 3 bytes: not a whole digest
        {"seen": 0, "held": "AAAAAAAAAAA="},  # one digest but nothing seen
    ],
)
def test_restore_rejects_garbage(state: object) -> None:
    with pytest.raises(ValueError):
        LineCursor[bytes]().restore(state)


def test_window_must_cover_something() -> None:
    with pytest.raises(ValueError):
        LineCursor[bytes](0)


def test_digest_is_stable_and_matches_oversized_convention() -> None:
    import hashlib

    assert line_digest(b"abc") == hashlib.blake2b(b"abc\n", digest_size=8).digest()
    assert len(line_digest(b"")) == 8


def test_held_window_is_bounded() -> None:
    c = Consumer(cursor=LineCursor(window=1024))
    c.connect(lines(5000))
    c.cursor.begin_connection()
    assert len(c.cursor.state()["held"]) <= (1024 * 8 * 4) // 3 + 4


# ---- property: exact reconstruction ---------------------------------------------------------

connection_plans = st.lists(
    st.tuples(
        st.integers(0, 1300),  # lines produced while detached (may exceed the ring: real loss)
        st.integers(0, 2500),  # live lines on this connection
        st.none() | st.integers(0, 1500),  # cut after this many delivered lines
    ),
    min_size=0,
    max_size=6,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(total=st.integers(1, 5000), plan=connection_plans, first=st.integers(0, 5000))
@example(total=1025, plan=[(1025, 0, None)], first=0)  # head lost before anything was held
@example(total=3000, plan=[(1024, 0, None)], first=100)  # the indistinguishable boundary
@example(total=3000, plan=[(1025, 0, None)], first=100)  # one line really lost
def test_reconstruction_is_exact(
    total: int, plan: list[tuple[int, int, int | None]], first: int
) -> None:
    hist = lines(total)
    w = Worker(hist)
    c = Consumer()
    expected: list[bytes] = []
    pos = 0  # the oracle: absolute lines held in order
    connections = [(0, first, None), *plan, (0, 10_000_000, None)]
    really_lost = 0
    boundary = 0
    unseen_head = 0
    for advance, live, cut in connections:
        start, delivered = w.connection(advance, live, cut)
        c.connect(delivered)
        count = len(delivered)
        if count == 0:
            continue
        if pos == 0:
            # Nothing held yet: lines older than the first replay are undetectable (the
            # driver attaches right after spawn, well inside the first 1024 lines).
            unseen_head = start
            expected.extend(delivered)
            pos = start + count
        elif start < pos:  # overlap: only lines beyond what we hold are new
            overlap = pos - start
            if count >= overlap:
                expected.extend(delivered[overlap:])
                pos = start + count
        else:
            expected.append(GAP)
            really_lost += start - pos
            boundary += start == pos
            expected.extend(delivered)
            pos = start + count
    assert c.out == expected
    n_gaps = c.out.count(GAP)
    # A gap is reported iff lines were really lost (or the indistinguishable boundary case).
    assert n_gaps == expected.count(GAP)
    assert (really_lost > 0) <= (n_gaps > 0)
    if n_gaps == 0:
        assert c.out == hist[unseen_head:]
    if really_lost == 0 and boundary == 0:
        assert c.out == hist[unseen_head:]
    assert c.cursor.seen == len([x for x in c.out if x is not GAP])


@settings(max_examples=150, deadline=None)
@given(
    data=st.lists(st.sampled_from([b"a", b"b", b"c"]), min_size=1, max_size=400),
    cuts=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 100)), max_size=6),
)
def test_repetitive_streams_never_duplicate_without_loss(
    data: list[bytes], cuts: list[tuple[int, int]]
) -> None:
    """With heavy repetition and no real loss the cursor may drop (ambiguous) repeats but never
    repeats a line: what it delivers is a subsequence of the original."""
    ring = 64
    w = Worker(data, ring=ring)
    c = Consumer(cursor=LineCursor(window=128))
    c.connect(w.connection(0, 0, None)[1])
    for advance, live in cuts:
        c.connect(w.connection(min(advance, ring - 1), live, None)[1])
    c.connect(w.connection(0, 10_000, None)[1])
    out = [x for x in c.out if x is not GAP]
    it = iter(data)
    assert all(any(x == y for y in it) for x in out), "output is not a subsequence"
