"""The ingest hot path's cheap forms (issue 11): the compact resume snapshot a cursor-taking
sink gets with every batch, the cursor's digest bytes kept in step with its digests, and the
live transcript tail read on the loop."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prospero.core.drivers.base import DriverOptions, DriverTarget
from prospero.core.drivers.line_cursor import LineCursor, line_digest, line_digests
from prospero.core.drivers.ndjson import NdjsonDriver
from prospero.core.drivers.ndjson_state import BASE_MAGIC, COMPACT_MAGIC, DELTA_MAX
from prospero.core.drivers.ndjson_transcript import INLINE_READ, _read_new
from prospero.core.drivers.transcript import Transcript
from prospero.core.metrics import Metrics
from prospero.core.transport import OversizedLine
from prospero.core.wire.control import UnixEndpoint
from prospero.testkit import scripts
from prospero.types.events import EventKind


def _digests(lines: list[bytes]) -> list[bytes]:
    return line_digests(lines)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["commit", "push", "connect", "rebase"]), st.integers(1, 90)),
        max_size=40,
    )
)
def test_held_blob_stays_in_step_with_the_held_digests(ops: list[tuple[str, int]]) -> None:
    cursor: LineCursor[bytes] = LineCursor(window=64, ring=32)
    n = 0
    for op, k in ops:
        lines = [b"line %d" % (n + i) for i in range(k)]
        if op == "commit" and not cursor.matching:
            cursor.commit_many(_digests(lines))
            n += k
        elif op == "push":
            cursor.push_many(_digests(lines), lines)
            n += k
        elif op == "connect":
            cursor.end_connection()
            cursor.begin_connection()
        elif op == "rebase":
            cursor.end_connection()
            cursor.rebase(cursor.seen + k, _digests(lines))
        assert cursor.held_blob() == b"".join(cursor.held_digests())
    restored: LineCursor[bytes] = LineCursor(window=64, ring=32)
    restored.restore_blob(cursor.seen, cursor.held_blob())
    assert restored.seen == cursor.seen
    assert restored.held_digests() == cursor.held_digests()


@pytest.mark.parametrize(
    ("seen", "blob"),
    [(-1, b""), (True, b""), ("3", b""), (1, b"\x00" * 7), (0, b"\x00" * 8)],
)
def test_restore_blob_rejects_malformed_states(seen: object, blob: bytes) -> None:
    with pytest.raises(ValueError):
        LineCursor().restore_blob(seen, blob)  # type: ignore[arg-type]


def _driver() -> NdjsonDriver:
    async def resolve() -> UnixEndpoint:  # pragma: no cover - never dialled
        return UnixEndpoint(path="/nonexistent")

    target = DriverTarget(agent_id="a1", workspace="r", resolve_endpoint=resolve)

    async def sink(kind: EventKind) -> None:  # pragma: no cover - never called
        raise AssertionError(kind)

    return NdjsonDriver(target, sink, DriverOptions(), Metrics())


def test_compact_and_json_snapshots_restore_the_same_state() -> None:
    d = _driver()
    lines = [orjson.dumps(scripts.turn_start(0))] + [
        orjson.dumps(scripts.text_delta(f"w{i} ", 0)) for i in range(3000)
    ]
    d.cursor.commit_many(line_digests(lines))
    d.normalizer.feed_lines(lines)
    compact = d._snapshot(compact=True)
    plain = d._snapshot()
    assert compact.startswith(COMPACT_MAGIC)
    assert len(compact) < len(plain)
    for data in (compact, plain):
        cursor: LineCursor[bytes | None] = LineCursor()
        rest = NdjsonDriver._parse_state(data, cursor)
        assert cursor.seen == d.cursor.seen == len(lines)
        assert cursor.held_digests() == d.cursor.held_digests()
        assert rest["normalizer"] == d.normalizer.state()
        assert rest["terminal"] is False
    with pytest.raises(ValueError):
        NdjsonDriver._parse_state(compact[:12], LineCursor())


def _restore(delta: bytes, base: bytes | None) -> LineCursor[bytes | None]:
    cursor: LineCursor[bytes | None] = LineCursor()
    NdjsonDriver._parse_state(delta, cursor, base)
    return cursor


def test_base_and_delta_snapshots_restore_the_cursor_at_every_step() -> None:
    """Base + delta (what the FleetManager's sink gets): a base row at the first snapshot,
    then only deltas until DELTA_MAX lines have passed or the cursor was re-based; every
    (latest delta, latest base) pair restores exactly the cursor it was taken from."""
    d = _driver()
    base: bytes | None = None
    bases = 0
    n = 0
    for step, k in enumerate([1, 5, 100, 150, 1, 300, 2, 2, 4000, 7, 0, 3]):
        lines = [orjson.dumps(scripts.text_delta(f"s{step} w{i} ", 0)) for i in range(k)]
        if step == 9:  # a slow-reader hole: re-based on the transcript (a new epoch)
            d.cursor.rebase(n + 50, line_digests(lines)[:5])
            n += 50
        d.cursor.commit_many(line_digests(lines))
        n += k
        delta, new_base = d._snapshot_marks()
        if new_base is not None:
            assert new_base.startswith(BASE_MAGIC)
            base, bases = new_base, bases + 1
        assert len(delta) < 200 + DELTA_MAX * 8  # never the whole window
        cursor = _restore(delta, base)
        assert cursor.seen == d.cursor.seen == n
        assert cursor.held_digests() == d.cursor.held_digests()
    # The first snapshot, the 300- and 4000-line steps (past DELTA_MAX), the re-base.
    assert bases == 4


def test_a_delta_that_does_not_fit_its_base_is_refused() -> None:
    d = _driver()
    d.cursor.commit_many(line_digests([b"a", b"b", b"c"]))
    delta1, base1 = d._snapshot_marks()
    assert base1 is not None
    d.cursor.commit_many(line_digests([b"d"]))
    delta2, base2 = d._snapshot_marks()
    assert base2 is None
    assert _restore(delta2, base1).seen == 4
    with pytest.raises(ValueError, match="base row is missing"):
        _restore(delta2, None)
    d.cursor.commit_many(line_digests([b"x%d" % i for i in range(DELTA_MAX + 1)]))
    delta3, base3 = d._snapshot_marks()
    assert base3 is not None
    with pytest.raises(ValueError, match="does not fit its base"):
        _restore(delta3, base1)  # an older base (its delta's base was never stored)
    with pytest.raises(ValueError, match="does not fit its base"):
        _restore(delta1, base3)


async def test_tail_reads_are_the_same_lines_inline_or_in_a_thread(tmp_path: Path) -> None:
    path = tmp_path / "stdout.ndjson"
    small = [b"x%d" % i for i in range(100)]
    big = b"y" * (INLINE_READ + 10)  # larger than an inline read: the thread read takes it
    oversized = b"z" * ((1 << 20) + 5)
    path.write_bytes(b"\n".join(small) + b"\n" + b"partial")
    tail = Transcript(path)
    tail.seek_line(0)
    got: list[bytes | OversizedLine] = list(await _read_new(tail))
    assert got == small
    assert await _read_new(tail) == []  # a partial line waits
    with path.open("ab") as f:
        f.write(b"\n" + big + b"\n" + oversized + b"\nlast\n")
    while True:
        batch = await _read_new(tail)
        if not batch:
            break
        got += batch
    assert got[: len(small)] == small
    rest = got[len(small) :]
    assert rest[0] == b"partial" and rest[1] == big
    assert isinstance(rest[2], OversizedLine) and rest[2].digest == line_digest(oversized)
    assert rest[3:] == [b"last"]
    tail.close()
