"""The ingest fast paths give exactly the results of the simple paths they shortcut.

- LineReader (chunked reads, own line splitting) == read_line, line for line, for any chunking,
  oversized lines and a cut-off tail included.
- LineCursor.push_many == push, across reconnects, replays and gaps.
- Normalizer.feed_lines == feed, line by line.
- output_event / FleetEvent.trusted(_batch) == the validated models.
- SqliteEventStore: the one-statement JSON insert and the bound-parameter fallback store the
  same rows (also for text JSON cannot carry, a NUL).
- Emitter submit pipeline (two batches in flight): a failed or conflicting batch requeues the
  one queued after it, order and seqs stay exact, nothing is lost or duplicated.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

import orjson
import pytest

from prospero.core.bus import InProcessBus
from prospero.core.drivers.line_cursor import Gap, LineCursor, NewLine, line_digest, line_digests
from prospero.core.emitter import Emitter
from prospero.core.errors import SeqConflict
from prospero.core.metrics import APPEND_FAILURES, EVENTS_APPENDED, Metrics
from prospero.core.normalize import Normalizer
from prospero.core.store.sqlite import events as sqlite_mod
from prospero.core.store.sqlite.events import SqliteEventStore
from prospero.core.transport import MAX_LINE, LineReader, OversizedLine, read_line
from prospero.testkit import scripts
from prospero.types.events import (
    AgentFinished,
    EventRun,
    FleetEvent,
    Output,
    StreamGap,
    ToolResult,
    ToolStarted,
    TurnFinished,
    Usage,
    compact_kind,
    expand_kind,
    output_event,
)
from tests.support import CollectingBus, fixture_lines

# --- LineReader ----------------------------------------------------------------------------


def _stream(data: bytes, cuts: list[int]) -> asyncio.StreamReader:
    r = asyncio.StreamReader(limit=MAX_LINE + 2)
    last = 0
    for c in [*cuts, len(data)]:
        if c > last:
            r.feed_data(data[last:c])
            last = c
    r.feed_eof()
    return r


async def _via_read_line(data: bytes) -> list[bytes | tuple[int, bytes]]:
    r = _stream(data, [])
    out: list[bytes | tuple[int, bytes]] = []
    while True:
        try:
            line = await read_line(r)
        except OversizedLine as e:
            out.append((e.size, e.digest))
            continue
        if line is None:
            return out
        out.append(line)


async def _via_line_reader(
    data: bytes, cuts: list[int], chunk: int
) -> list[bytes | tuple[int, bytes]]:
    lr = LineReader(_stream(data, cuts), chunk)
    out: list[bytes | tuple[int, bytes]] = []
    while (batch := await lr.read_lines()) is not None:
        assert batch, "read_lines returns None or a non-empty batch"
        for x in batch:
            out.append((x.size, x.digest) if isinstance(x, OversizedLine) else x)
    return out


async def test_line_reader_matches_read_line_for_any_chunking() -> None:
    rng = random.Random(7)
    big = b"x" * (MAX_LINE + 10)
    exact = b"y" * MAX_LINE
    pieces = [
        b'{"a":1}\n',
        b"\n",
        b"\r\n",
        big + b"\n",
        b"ok\n",
        exact + b"\n",
        b"z" * (MAX_LINE + 1) + b"\n",
        b"after\n",
        b"".join(orjson.dumps(f) + b"\n" for f in scripts.default_script() if isinstance(f, dict)),
        b"tail-without-newline",
    ]
    data = b"".join(pieces)
    want = await _via_read_line(data)
    assert (MAX_LINE + 10, line_digest(big)) in want and exact in want
    assert want[-1] != b"tail-without-newline"  # a cut-off tail is never a line
    for _ in range(12):
        cuts = sorted(rng.sample(range(1, len(data)), 40))
        chunk = rng.choice([1, 7, 4096, 65536, 256 * 1024, 4 << 20])
        assert await _via_line_reader(data, cuts, chunk) == want
    # An oversized line cut off by EOF is dropped like any partial line.
    assert await _via_line_reader(b"ok\n" + big, [5, 70000], 65536) == [b"ok"]


# --- LineCursor.push_many ----------------------------------------------------------------------


def _push_one_by_one(c: LineCursor[bytes], lines: list[bytes]) -> list[object]:
    out: list[object] = []
    for ln in lines:
        for item in c.push(line_digest(ln), ln):
            out.append(item.detail if isinstance(item, Gap) else item.payload)  # type: ignore[union-attr]
    return out


def _push_in_batches(c: LineCursor[bytes], lines: list[bytes], rng: random.Random) -> list[object]:
    out: list[object] = []
    i = 0
    while i < len(lines):
        n = rng.randint(1, 300)
        part = lines[i : i + n]
        i += n
        gap, new = c.push_many(line_digests(part), part)
        if gap is not None:
            out.append(gap.detail)
        out.extend(new)
    return out


def test_push_many_matches_push_across_reconnects() -> None:
    rng = random.Random(3)
    history = [f'{{"n":{i}}}'.encode() for i in range(4000)]
    # Connections: replay of the last <= 1024 lines, then live lines; one with a loss.
    plan: list[list[bytes]] = [history[:700]]
    seen = 700
    for end in (1500, 2600):
        plan.append(history[max(0, seen - 1024) : end])
        seen = end
    # 1400 lines produced while detached, the worker replays its last 1024: lines 2600..2975
    # were lost, a gap (a real worker past 1024 lines always replays a full ring)
    plan.append(history[4000 - 1024 : 4000])
    a: LineCursor[bytes] = LineCursor()
    b: LineCursor[bytes] = LineCursor()
    outs = []
    for conn in plan:
        a.begin_connection()
        b.begin_connection()
        out = _push_one_by_one(a, conn)
        assert _push_in_batches(b, conn, rng) == out
        assert a.end_connection() == b.end_connection()
        assert a.state() == b.state()
        outs.append(out)
    assert a.seen == b.seen == 2600 + 1024
    assert outs[1] == history[700:1500] and outs[2] == history[1500:2600]
    assert isinstance(outs[3][0], str) and outs[3][1:] == history[2976:4000]  # the gap first


# --- Normalizer.feed_lines ----------------------------------------------------------------------


def test_feed_lines_matches_feed() -> None:
    lines = [ln.encode() for ln in fixture_lines("turnevents-edge-cases.ndjson")]
    lines += [
        orjson.dumps(f)
        for f in scripts.tool_run_script(model="claude-sonnet-4-6")
        if isinstance(f, dict)
    ]
    lines += [b"", b"   ", b"not json", b"[1,2]", b'{"type":"AssistantTextDelta","text":5}']
    lines += [b'{"type":"AssistantThinkingDelta","text":"hm"}', b'{"type":"Nope"}']
    for include_thinking in (False, True):

        class Opts:
            pass

        opts = Opts()
        opts.include_thinking = include_thinking  # type: ignore[attr-defined]
        from prospero.core.ratecard import RateCard

        opts.rate_card = RateCard()  # type: ignore[attr-defined]
        m1, m2 = Metrics(), Metrics()
        one = Normalizer(opts, m1)  # type: ignore[arg-type]
        want = [ev for ln in lines for ev in one.feed(ln)]
        got = Normalizer(opts, m2).feed_lines(lines)  # type: ignore[arg-type]
        assert got == want
        compact = Normalizer(opts, Metrics()).feed_lines_compact(lines)  # type: ignore[arg-type]
        assert compact == [compact_kind(e) for e in want]
        assert [expand_kind(k) for k in compact] == want
        assert [e.model_dump_json() for e in got] == [e.model_dump_json() for e in want]
        assert m1.snapshot() == m2.snapshot()


# --- trusted constructors ---------------------------------------------------------------------


def test_trusted_models_equal_validated_ones() -> None:
    o = output_event("thinking", "x\u0000y")
    ref = Output(stream="thinking", chunk="x\u0000y")
    assert o == ref and o.model_dump_json() == ref.model_dump_json() and hash(o) == hash(ref)
    assert (
        o.model_fields_set == Output.model_construct(stream="thinking", chunk="").model_fields_set
    )
    kinds = [o, ToolStarted(id="t", name="Read", input={"p": 1}), AgentFinished(outcome="x")]
    evs = FleetEvent.trusted_batch(5, "ts", "ws", "a1", kinds)
    ref_evs = [
        FleetEvent(seq=5 + i, ts="ts", repo="ws", agent_id="a1", kind=k)
        for i, k in enumerate(kinds)
    ]
    assert evs == ref_evs
    assert [e.model_dump_json() for e in evs] == [e.model_dump_json() for e in ref_evs]
    assert FleetEvent.trusted(5, "ts", "ws", "a1", o) == ref_evs[0]
    copy = evs[0].model_copy(update={"seq": 9})
    assert copy.seq == 9 and evs[0].seq == 5  # the shared fields-set is never mutated
    assert evs[0].model_fields_set == {"seq", "ts", "repo", "agent_id", "kind"}
    with pytest.raises(ValueError):
        FleetEvent.trusted(1, "ts", "ws", "a1", {"kind": "nope"})  # type: ignore[arg-type]
    run = EventRun("ws", "a1", "ts", 5, [compact_kind(k) for k in kinds])
    assert isinstance(run.kinds[0], tuple) and run.kinds[1] is kinds[1]
    assert run.events() == ref_evs and len(run) == 3 and run.stream_key == "a1"
    head, tail = run.split(1)
    assert head.events() + tail.events() == ref_evs


# --- SqliteEventStore: JSON insert vs bound fallback ------------------------------------------


def _kinds() -> list[object]:
    return [
        Output(chunk="plain"),
        Output(stream="thinking", chunk='quote " backslash \\ newline \n tab \t é 😀 \u2028'),
        ToolStarted(id="t1", name="Read", input={"path": "a.py", "n": 1.5, "big": 2**62}),
        TurnFinished(turn=1, model="m", usage=Usage(input_tokens=3, output_tokens=4), cost_usd=0.1),
        AgentFinished(outcome="EndOfTurn", turns=2, cost_usd=1e-9, usage=Usage(input_tokens=1)),
        StreamGap(missing=None, detail="x"),
    ]


def _rows(db: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(
            "SELECT ordinal, stream_key, seq, ts, repo, agent_id, kind_tag, kind, typeof(seq), "
            "typeof(kind) FROM events ORDER BY ordinal"
        ).fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("nul", [False, True])
async def test_json_and_bound_inserts_store_identical_rows(tmp_path: Path, nul: bool) -> None:
    kinds = _kinds()
    if nul:
        kinds.append(Output(chunk="nul \u0000 inside"))  # sends the batch down the bound path
    results = []
    for use_json in (True, False):
        db = tmp_path / f"{use_json}.db"
        store = SqliteEventStore(db)
        await store.open()
        store._json = use_json  # force one path
        evs = [
            FleetEvent(
                seq=i + 1, ts="2026-11-29T00:00:00.000000+00:00", repo="ws", agent_id="a", kind=k
            )  # type: ignore[arg-type]
            for i, k in enumerate(kinds)
        ]
        compact = [compact_kind(k) for k in kinds]  # type: ignore[arg-type]
        run = EventRun("ws", "b", "2026-11-29T00:00:01.000000+00:00", 1, compact)
        ords = await asyncio.wrap_future(store.submit_append([*evs[:2], run, *evs[2:]]))
        assert ords == list(range(1, 2 * len(kinds) + 1))
        assert await store.high_water("a") == len(kinds) == await store.high_water("b")
        back = await store.replay("b")
        assert [e.kind for e in back] == kinds
        usage = await store.usage("2026-11-29", "2026-11-29")
        # Per turn: each stream's turn_finished (3 in) counts, agent_finished only its run.
        assert usage and usage[0].runs == 2 and usage[0].input_tokens == 6
        await store.close()
        results.append(_rows(db))
    assert results[0] == results[1]
    assert all(r[8] == "integer" and r[9] == "text" for r in results[0])


# --- Emitter submit pipeline -------------------------------------------------------------------


class PipelineStore(SqliteEventStore):
    """Overrides only the submit path (so the emitter keeps using it): can hold the writer
    thread, and fail the next N submissions."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.fail_next = 0
        self.submitted: list[int] = []

    def hold(self) -> threading.Event:
        gate = threading.Event()
        self._w().submit(lambda conn: gate.wait(10))
        return gate

    def submit_append(
        self, events: Sequence[FleetEvent | EventRun], after: Future[list[int]] | None = None
    ) -> Future[list[int]]:
        self.submitted.append(sum(len(e) if isinstance(e, EventRun) else 1 for e in events))
        if self.fail_next:
            self.fail_next -= 1
            failed: Future[list[int]] = Future()
            failed.set_exception(OSError("disk I/O error (scripted)"))
            return failed
        return super().submit_append(events, after)


Bus = CollectingBus


def _chunks(store_events: list[FleetEvent]) -> list[str]:
    return [e.kind.chunk for e in store_events if isinstance(e.kind, Output)]


async def test_pipeline_conflict_requeues_the_batch_queued_after_it(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    store = PipelineStore(db)
    await store.open()
    other = SqliteEventStore(db)
    await other.open()
    bus = Bus()
    em = Emitter(store, bus, Metrics(), max_batch=4)
    assert store.batch_submitter() is not None
    await em.prepare(["a", "b"])  # seeded at 1 ...
    rival = Emitter(other, InProcessBus())
    for i in range(3):  # ... then another writer takes a:1..3
        await rival.emit("ws", "a", Output(chunk=f"rival{i}"))
    await rival.close()
    gate = store.hold()
    await em.emit_many("ws", "a", [Output(chunk=f"a{i}") for i in range(4)])  # conflicts
    await em.emit_many("ws", "b", [Output(chunk=f"b{i}") for i in range(4)])  # queued after it
    await em.emit_many("ws", "a", [Output(chunk=f"a{i}") for i in range(4, 6)])  # pending
    assert len(store.submitted) == 2
    gate.set()
    await asyncio.wait_for(em.flush(), 10)
    a = await store.replay("a")
    assert [e.seq for e in a] == list(range(1, 10))
    assert _chunks(a) == ["rival0", "rival1", "rival2", *(f"a{i}" for i in range(6))]
    assert _chunks(await store.replay("b")) == [f"b{i}" for i in range(4)]
    published = [(i.event.agent_id, i.event.seq, i.event.kind.chunk) for i in bus.items]  # type: ignore[union-attr]
    assert published == [
        *(("a", 4 + i, f"a{i}") for i in range(4)),
        *(("b", 1 + i, f"b{i}") for i in range(4)),
        ("a", 8, "a4"),
        ("a", 9, "a5"),
    ]
    ordinals = [i.ordinal for i in bus.items]
    assert None not in ordinals and ordinals == sorted(ordinals)
    stored = {(s.event.agent_id, s.event.seq): s.ordinal for s in await store.replay_fleet()}
    assert all(stored[(i.event.agent_id, i.event.seq)] == i.ordinal for i in bus.items)
    assert em.metrics.get(APPEND_FAILURES) == 0 and em.metrics.get(EVENTS_APPENDED) == 10
    await em.close()
    await other.close()
    await store.close()


async def test_pipeline_store_failure_publishes_marks_and_goes_on(tmp_path: Path) -> None:
    store = PipelineStore(tmp_path / "events.db")
    await store.open()
    bus = Bus()
    em = Emitter(store, bus, Metrics(), max_batch=3)
    await em.prepare(["a"])
    gate = store.hold()
    store.fail_next = 1
    await em.emit_many("ws", "a", [Output(chunk=f"x{i}") for i in range(3)])  # fails
    await em.emit_many("ws", "a", [Output(chunk=f"y{i}") for i in range(3)])  # queued after it
    gate.set()
    await asyncio.wait_for(em.flush(), 10)
    await asyncio.wait_for(em.flush(), 10)  # the loss marker is committed too
    kinds = [(i.ordinal is not None, i.event.seq, i.event.kind.kind) for i in bus.items]
    assert kinds == [
        *((False, s, "output") for s in (1, 2, 3)),  # published live, not persisted
        *((True, s, "output") for s in (4, 5, 6)),  # requeued and committed
        (True, 7, "store_persist_failed"),
    ]
    stored = await store.replay("a")
    assert [(e.seq, e.kind.kind) for e in stored] == [
        (4, "output"),
        (5, "output"),
        (6, "output"),
        (7, "store_persist_failed"),
    ]
    assert em.metrics.get(APPEND_FAILURES) == 3
    await em.close()
    await store.close()


async def test_runs_publish_the_same_events_as_single_emits(tmp_path: Path) -> None:
    store = SqliteEventStore(tmp_path / "events.db")
    await store.open()
    bus = Bus()
    em = Emitter(store, bus, Metrics(), max_batch=5)
    kinds = [Output(chunk=str(i)) for i in range(12)] + [
        ToolStarted(id="t", name="n"),
        AgentFinished(outcome="EndOfTurn", turns=1, usage=Usage(input_tokens=1)),
    ]
    await em.emit_many("ws", "a", kinds, ts="2026-11-29T00:00:00.000000+00:00")
    single = await em.emit("ws", "a", Output(chunk="single"))
    await em.flush()
    want = [
        FleetEvent(
            seq=i + 1, ts="2026-11-29T00:00:00.000000+00:00", repo="ws", agent_id="a", kind=k
        )
        for i, k in enumerate(kinds)
    ] + [single]
    assert [i.event for i in bus.items] == want == await store.replay("a")
    assert [i.ordinal for i in bus.items] == list(range(1, 16))
    assert (await store.usage("2026-11-29", "2026-11-29"))[0].runs == 1
    await em.close()
    await store.close()


def test_compact_output_serialises_like_the_model() -> None:
    from prospero.core.store.rows import output_json

    text = "".join(chr(c) for c in range(0x2400) if not 0xD800 <= c < 0xE000)
    text += '\U0001f600\U0010fffd \\ " \u2028\u2029\x7f'
    for stream in ("stdout", "thinking"):
        for chunk in (text, "", text[::-7]):
            model = Output(stream=stream, chunk=chunk)  # type: ignore[arg-type]
            assert output_json(stream, chunk) == model.model_dump_json(by_alias=True)
            assert expand_kind(compact_kind(model)) == model
    other = ToolStarted(id="x")
    assert compact_kind(other) is other and expand_kind(other) is other


async def test_emit_many_takes_compact_outputs_and_validates_the_rest(tmp_path: Path) -> None:
    store = SqliteEventStore(tmp_path / "events.db")
    await store.open()
    bus = Bus()
    em = Emitter(store, bus, Metrics())
    await em.emit_many("ws", "a", [("stdout", "x"), ("thinking", "y"), ToolStarted(id="t")])
    with pytest.raises(ValueError):
        await em.emit_many("ws", "a", [("stdout", "ok"), ("bogus", "z")])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        await em.emit_many("ws", "a", [{"kind": "nope"}])  # type: ignore[list-item]
    await em.flush()
    assert [e.kind for e in await store.replay("a")] == [
        Output(chunk="x"),
        Output(stream="thinking", chunk="y"),
        ToolStarted(id="t"),
    ]
    assert [i.event.seq for i in bus.items] == [1, 2, 3]
    await em.close()
    await store.close()


def test_event_kinds_serialise_like_model_dump_json() -> None:
    for k in [*_kinds(), ToolResult(text="x")]:
        assert k.__pydantic_serializer__.to_json(k, by_alias=True).decode() == k.model_dump_json(
            by_alias=True
        )


def test_new_line_and_gap_types_unchanged() -> None:
    c: LineCursor[bytes] = LineCursor()
    c.begin_connection()
    assert c.push(line_digest(b"a"), b"a") == [NewLine(b"a")]


# --- SqliteEventStore: heads folded in by retention --------------------------------------------


async def test_high_water_survives_chunked_pruning_and_appends_skip_heads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prospero.core.store.sqlite.events as sqlite_mod

    monkeypatch.setattr(sqlite_mod, "PRUNE_CHUNK", 7)
    db = tmp_path / "events.db"
    store = SqliteEventStore(db)
    await store.open()
    old, new = "2026-11-01T00:00:00.000000+00:00", "2026-11-29T00:00:00.000000+00:00"
    await store.append_batch(
        [
            FleetEvent(seq=i, ts=old, repo="ws", agent_id=f"s{i % 3}", kind=Output())
            for i in range(1, 31)
        ]
        + [FleetEvent(seq=100, ts=new, repo="ws", agent_id="s1", kind=Output())]
    )
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM stream_heads").fetchone()[0] == 0  # append: none
    want = {"s0": 30, "s1": 100, "s2": 29}
    assert {k: await store.high_water(k) for k in want} == want
    assert await store.prune(new) == 30
    assert {k: await store.high_water(k) for k in want} == want  # s0 and s2 are gone entirely
    assert dict(conn.execute("SELECT stream_key, high_water FROM stream_heads")) == {
        "s0": 30,
        "s1": 28,
        "s2": 29,
    }
    with pytest.raises(SeqConflict):  # the live row still guards its seq
        await store.append_batch(
            [FleetEvent(seq=100, ts=new, repo="ws", agent_id="s1", kind=Output())]
        )
    conn.close()
    await store.close()


async def test_version_1_file_is_upgraded_and_its_heads_kept(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    store = SqliteEventStore(db)
    await store.open()
    await store.close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO stream_heads VALUES ('gone', 41)")  # a v1 head of a pruned stream
    conn.close()
    store = SqliteEventStore(db)
    await store.open()
    assert await store.high_water("gone") == 41
    await store.close()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_mod.SCHEMA_VERSION
    conn.close()
