"""follow_stream / follow_fleet: replay-then-tail with no gap and no duplicate, lag self-heal;
events as JSON bytes (history a page per read, live events a page per burst)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from prospero.core import subscription
from prospero.core.bus import InProcessBus
from prospero.core.emitter import Emitter
from prospero.core.errors import StoreError
from prospero.core.store.base import RawEvent, StoredEvent
from prospero.core.store.sqlite.events import SqliteEventStore
from prospero.core.subscription import (
    IDLE,
    Follower,
    GapSignal,
    RawPage,
    follow_fleet,
    follow_stream,
)
from prospero.types.events import AgentFinished, FleetEvent, Output
from tests.conformance.eventstore import ev
from tests.support import wait_until


@dataclass
class Rig:
    store: SqliteEventStore
    bus: InProcessBus
    emitter: Emitter

    async def emit(self, agent: str, n: int, *, prefix: str = "") -> None:
        for i in range(n):
            await self.emitter.emit("ws", agent, Output(chunk=f"{prefix}{i}"))

    async def finish(self, agent: str) -> FleetEvent:
        return await self.emitter.emit("ws", agent, AgentFinished(outcome="EndOfTurn", turns=1))


async def make_rig(path: Path, buffer: int = 1024) -> Rig:
    store = SqliteEventStore(path)
    await store.open()
    bus = InProcessBus(buffer=buffer)
    em = Emitter(store, bus, max_batch=64)
    await em.start()
    return Rig(store, bus, em)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = await make_rig(tmp_path / "events.db")
    yield r
    await r.emitter.close()
    r.bus.close()
    await r.store.close()


@pytest.fixture
async def tiny(tmp_path: Path) -> AsyncIterator[Rig]:
    r = await make_rig(tmp_path / "events.db", buffer=4)
    yield r
    await r.emitter.close()
    r.bus.close()
    await r.store.close()


def events(items: Sequence[Any]) -> list[RawEvent]:
    """The events of follower items, in order (gap signals and IDLE left out)."""
    out: list[RawEvent] = []
    for i in items:
        if isinstance(i, RawPage):
            assert i.events, "a RawPage is never empty"
            out += i.events
    return out


def seqs(items: Sequence[Any]) -> list[int]:
    return [r.seq for r in events(items)]


def cursors(items: Sequence[Any]) -> list[int]:
    return [r.cursor for r in events(items)]


def payload(r: RawEvent) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads(r.data)
    return data


async def take(f: Follower[Any], n: int) -> list[Any]:
    """Follower items until they hold at least `n` events."""
    got: list[Any] = []
    while len(events(got)) < n:
        got.append(await asyncio.wait_for(f.__anext__(), 10))
    return got


def as_bytes(stored: Sequence[StoredEvent]) -> list[tuple[int, bytes]]:
    return [(s.ordinal, orjson.dumps(s.event.to_json())) for s in stored]


# -- follow_stream -----------------------------------------------------------------------------


async def test_join_has_no_gap_and_no_duplicate_under_concurrent_emission(rig: Rig) -> None:
    await rig.emit("a", 200, prefix="pre")
    await rig.emitter.flush()
    total = 200 + 3000

    async def producer() -> None:
        for i in range(3000):
            await rig.emitter.emit("ws", "a", Output(chunk=f"live{i}"))
            await rig.emitter.emit("ws", "other", Output(chunk="noise"))
            if i % 5 == 0:
                await asyncio.sleep(0)
        await rig.finish("a")

    async def consume(from_seq: int) -> list[Any]:
        out: list[Any] = []
        async with follow_stream(rig.store, rig.bus, "a", from_seq, page=50) as f:
            async for item in f:
                out.append(item)
        return out

    prod = asyncio.create_task(producer())
    # Followers joining at different moments of the production, from different points.
    consumers = []
    for k, start in enumerate((1, 0, 150, 201)):
        consumers.append(asyncio.create_task(consume(start)))
        await wait_until(lambda k=k: rig.emitter.pending > 0 or prod.done(), what=f"tick {k}")
        for _ in range(k * 20):
            await asyncio.sleep(0)
    await prod
    results = await asyncio.gather(*consumers)
    for start, got in zip((1, 0, 150, 201), results, strict=True):
        first = max(start, 1)
        assert seqs(got) == list(range(first, total + 2)), f"from {start}"
        assert events(got)[-1].kind == "agent_finished"
    assert rig.bus.subscriber_count() == 0


async def test_paused_consumer_with_tiny_buffer_gets_gap_then_every_event_once(tiny: Rig) -> None:
    await tiny.emit("a", 1)
    await tiny.emitter.flush()
    f = follow_stream(tiny.store, tiny.bus, "a")
    got: list[Any] = [await f.__anext__()]  # seq 1 from history
    # While the consumer is paused, 499 events and the terminal one are committed+published.
    await tiny.emit("a", 499)
    await tiny.finish("a")
    await tiny.emitter.flush()
    got += [item async for item in f]
    gaps = [g for g in got if isinstance(g, GapSignal)]
    assert gaps == [GapSignal(skipped=496, last_seq=5)]  # 2..5 fit the buffer of 4
    assert seqs(got) == list(range(1, 502))
    assert seqs(got[: got.index(gaps[0])]) == [1, 2, 3, 4, 5]


async def test_slow_consumer_sees_every_event_exactly_once(tiny: Rig) -> None:
    n = 1500

    async def producer() -> None:
        for i in range(n):
            await tiny.emitter.emit("ws", "a", Output(chunk=str(i)))
            if i % 50 == 0:
                await asyncio.sleep(0)
        await tiny.finish("a")

    got: list[Any] = []
    f = follow_stream(tiny.store, tiny.bus, "a", page=32)
    prod = asyncio.create_task(producer())
    async for item in f:
        got.append(item)
        for _ in range(3):  # deliberately slower than the producer
            await asyncio.sleep(0)
    await prod
    assert seqs(got) == list(range(1, n + 2))
    assert any(isinstance(g, GapSignal) for g in got)


async def test_closes_after_agent_finished_in_history(rig: Rig) -> None:
    await rig.emit("a", 3)
    await rig.finish("a")
    await rig.emit("a", 2, prefix="after")  # e.g. a respawned run appended to the same stream
    await rig.emitter.flush()
    got = [i async for i in follow_stream(rig.store, rig.bus, "a")]
    assert seqs(got) == [1, 2, 3, 4]
    assert rig.bus.subscriber_count() == 0
    # Without close_on_finish the follower keeps going.
    f = follow_stream(rig.store, rig.bus, "a", close_on_finish=False)
    rest = await take(f, 6)
    assert seqs(rest) == [1, 2, 3, 4, 5, 6]
    await f.aclose()
    assert rig.bus.subscriber_count() == 0


async def test_closes_after_live_agent_finished(rig: Rig) -> None:
    f = follow_stream(rig.store, rig.bus, "a")
    task = asyncio.create_task(_collect(f))
    await rig.emit("a", 5)
    await rig.finish("a")
    await rig.emit("a", 1, prefix="late")
    got = await asyncio.wait_for(task, 10)
    assert seqs(got) == [1, 2, 3, 4, 5, 6]


async def _collect(f: AsyncIterator[Any]) -> list[Any]:
    return [i async for i in f]


async def test_from_seq_skips_earlier_events(rig: Rig) -> None:
    await rig.emit("a", 10)
    await rig.finish("a")
    await rig.emitter.flush()
    got = [i async for i in follow_stream(rig.store, rig.bus, "a", 8, page=2)]
    assert seqs(got) == [8, 9, 10, 11]
    # A from beyond the end waits for live events.
    f = follow_stream(rig.store, rig.bus, "b", 3)
    nxt = asyncio.create_task(f.__anext__())
    await rig.emit("b", 3)
    item = await asyncio.wait_for(nxt, 10)
    assert isinstance(item, RawPage) and item.events[0].seq == 3
    await f.aclose()


async def test_unknown_stream_waits_for_its_first_event(rig: Rig) -> None:
    f = follow_stream(rig.store, rig.bus, "not-yet")
    nxt = asyncio.create_task(f.__anext__())
    await rig.emit("someone-else", 3)
    await rig.emitter.flush()
    assert not nxt.done()
    await rig.emit("not-yet", 1)
    item = await asyncio.wait_for(nxt, 10)
    assert isinstance(item, RawPage)
    assert payload(item.events[0])["agent_id"] == "not-yet" and item.events[0].seq == 1
    await f.aclose()


async def test_live_jump_is_filled_from_the_store(rig: Rig) -> None:
    f = follow_stream(rig.store, rig.bus, "a")
    nxt = asyncio.create_task(f.__anext__())
    await wait_until(lambda: rig.bus.subscriber_count() == 1)
    # Another writer (no publish on our bus) stores 1..3; our emitter then emits 4.
    await rig.store.append_batch([ev("a", i) for i in (1, 2, 3)])
    await rig.emit("a", 1, prefix="ours")
    got = [await asyncio.wait_for(nxt, 10)]
    got += await take(f, 4 - len(events(got)))
    assert seqs(got) == [1, 2, 3, 4]
    assert not any(isinstance(g, GapSignal) for g in got)
    await f.aclose()


async def test_unpersisted_events_are_still_followed(rig: Rig) -> None:
    # Unpersisted events exist only on the bus: a follower tailing it gets them. (A follower
    # whose history read comes after a later event was stored would skip them as already
    # past, so this test starts the outage once the follower's history read is done.)
    history_read = asyncio.Event()
    replay = rig.store.replay_raw

    async def replay_then_signal(*args: Any, **kwargs: Any) -> list[RawEvent]:
        try:
            return await replay(*args, **kwargs)
        finally:
            history_read.set()

    rig.store.replay_raw = replay_then_signal  # type: ignore[method-assign]
    f = follow_stream(rig.store, rig.bus, "a")
    task = asyncio.create_task(_collect(f))
    await asyncio.wait_for(history_read.wait(), 10)
    original = rig.store.append_batch

    async def failing(events: object) -> list[int]:
        raise StoreError("scripted failure")

    rig.store.append_batch = failing  # type: ignore[method-assign]
    await rig.emit("a", 2)
    await rig.emitter.flush()
    rig.store.append_batch = original  # type: ignore[method-assign]
    await rig.finish("a")
    got = await asyncio.wait_for(task, 10)
    kinds = [(r.seq, r.kind) for r in events(got)]
    assert kinds == [
        (1, "output"),
        (2, "output"),
        (3, "store_persist_failed"),
        (4, "agent_finished"),
    ]


async def test_follower_ends_when_the_bus_closes(rig: Rig) -> None:
    await rig.emit("a", 2)
    await rig.emitter.flush()
    f = follow_stream(rig.store, rig.bus, "a")
    task = asyncio.create_task(_collect(f))
    await wait_until(lambda: rig.bus.subscriber_count() == 1)
    await wait_until(lambda: not task.done() and rig.bus.subscriber_count() == 1)
    rig.bus.close()
    got = await asyncio.wait_for(task, 10)
    assert seqs(got) == [1, 2]


async def test_abandoned_follower_unsubscribes(rig: Rig) -> None:
    f = follow_stream(rig.store, rig.bus, "a")
    assert rig.bus.subscriber_count() == 1  # subscribed at call time
    await f.aclose()
    assert rig.bus.subscriber_count() == 0


# -- follow_fleet ------------------------------------------------------------------------------


async def test_fleet_replay_then_tail_in_ordinal_order(rig: Rig) -> None:
    await rig.emit("a", 20)
    await rig.emit("b", 20)
    await rig.emitter.flush()
    total = 40 + 3 * 800

    async def producer() -> None:
        for i in range(800):
            for agent in ("a", "b", "c"):
                await rig.emitter.emit("ws", agent, Output(chunk=str(i)))
            if i % 10 == 0:
                await asyncio.sleep(0)

    prod = asyncio.create_task(producer())
    got: list[Any] = []
    async with follow_fleet(rig.store, rig.bus, page=33) as f:
        async for pg in f:
            got.append(pg)
            if len(events(got)) >= total:
                break
    await prod
    ordinals = cursors(got)
    assert ordinals == sorted(ordinals) and len(set(ordinals)) == len(ordinals)
    stored = await rig.store.replay_fleet()
    assert as_bytes(stored)[: len(ordinals)] == [(r.cursor, r.data) for r in events(got)]
    assert len(ordinals) >= total
    assert rig.bus.subscriber_count() == 0


async def test_fleet_after_ordinal(rig: Rig) -> None:
    await rig.emit("a", 5)
    await rig.emit("b", 5)
    await rig.emitter.flush()
    all_ = await rig.store.replay_fleet()
    f = follow_fleet(rig.store, rig.bus, all_[6].ordinal)
    got = await take(f, 3)
    assert cursors(got) == [s.ordinal for s in all_[7:]]
    nxt = asyncio.create_task(f.__anext__())
    await rig.emit("c", 1)
    live = await asyncio.wait_for(nxt, 10)
    assert isinstance(live, RawPage) and len(live.events) == 1
    assert payload(live.events[0])["agent_id"] == "c"
    assert live.events[0].cursor == all_[-1].ordinal + 1
    await f.aclose()


async def test_fleet_lag_self_heals_from_the_store(tiny: Rig) -> None:
    await tiny.emit("a", 1)
    await tiny.emitter.flush()
    f = follow_fleet(tiny.store, tiny.bus, page=16)
    got = [await f.__anext__()]
    for agent in ("a", "b", "c"):
        await tiny.emit(agent, 200)
    await tiny.emitter.flush()
    got += await take(f, 601 - len(events(got)))
    await f.aclose()
    stored = await tiny.store.replay_fleet()
    assert cursors(got) == [s.ordinal for s in stored]


async def test_fleet_gap_from_another_writer_is_read_back(rig: Rig) -> None:
    f = follow_fleet(rig.store, rig.bus)
    nxt = asyncio.create_task(f.__anext__())
    await wait_until(lambda: rig.bus.subscriber_count() == 1)
    other = await rig.store.append_batch([ev("x", 1), ev("y", 1)])  # not published here
    await rig.emit("a", 1)
    got = [await asyncio.wait_for(nxt, 10)]
    got += await take(f, 3 - len(events(got)))
    assert cursors(got) == [*other, other[-1] + 1]
    assert [payload(r)["agent_id"] for r in events(got)] == ["x", "y", "a"]
    await f.aclose()


async def test_fleet_skips_unpersisted_events(rig: Rig) -> None:
    f = follow_fleet(rig.store, rig.bus)
    nxt = asyncio.create_task(f.__anext__())
    await wait_until(lambda: rig.bus.subscriber_count() == 1)
    original = rig.store.append_batch

    async def fail_once(events: Sequence[FleetEvent]) -> list[int]:
        rig.store.append_batch = original  # type: ignore[method-assign]
        raise StoreError("scripted failure")

    rig.store.append_batch = fail_once  # type: ignore[method-assign]
    await rig.emit("a", 1)
    while rig.emitter.pending:  # the output fails, its marker is persisted by the next commit
        await rig.emitter.flush()
    await rig.emit("a", 1, prefix="ok")
    got = [await asyncio.wait_for(nxt, 10)]
    got += await take(f, 2 - len(events(got)))
    # The unpersisted output never shows; its stored loss marker does, then the next event.
    first, second = events(got)[:2]
    assert first.kind == "store_persist_failed"
    assert second.kind == "output" and second.cursor == first.cursor + 1
    await f.aclose()


async def test_aclose_from_another_task_ends_a_waiting_consumer(rig: Rig) -> None:
    f = follow_stream(rig.store, rig.bus, "a")
    consumer = asyncio.create_task(_collect(f))
    await rig.emit("a", 2)
    await wait_until(lambda: rig.emitter.pending == 0)
    await f.aclose()
    got = await asyncio.wait_for(consumer, 10)
    assert seqs(got) in ([], [1], [1, 2])
    assert rig.bus.subscriber_count() == 0


# -- bytes: history a page per read, live events a page per burst ------------------------------


def flat(items: list[Any]) -> list[tuple[int, bytes] | GapSignal]:
    """Follower items as (cursor, JSON) per event, in order; gap signals kept."""
    out: list[tuple[int, bytes] | GapSignal] = []
    for i in items:
        if isinstance(i, RawPage):
            assert i.events, "a RawPage is never empty"
            out += [(r.cursor, r.data) for r in i.events]
        elif isinstance(i, GapSignal):
            out.append(i)
    return out


async def test_history_pages_are_the_stored_events_as_bytes(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subscription, "RAW_PAGE", 7)
    await rig.emit("a", 30)
    await rig.finish("a")
    await rig.emit("a", 2, prefix="after")  # past the end: not delivered
    await rig.emitter.flush()
    stored = await rig.store.replay("a")
    for start in (0, 1, 5, 29):
        got = [i async for i in follow_stream(rig.store, rig.bus, "a", start)]
        assert all(len(i.events) <= 7 for i in got)
        assert any(len(i.events) > 1 for i in got) or start == 29
        first = max(start, 1)
        assert flat(got) == [(e.seq, orjson.dumps(e.to_json())) for e in stored[first - 1 : 31]]
    assert rig.bus.subscriber_count() == 0


async def test_live_join_without_gap_or_duplicate_same_bytes_as_the_store(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subscription, "RAW_PAGE", 16)
    await rig.emit("a", 100, prefix="pre")
    await rig.emitter.flush()
    f = follow_stream(rig.store, rig.bus, "a")
    task = asyncio.create_task(_collect(f))
    for i in range(500):
        await rig.emitter.emit("ws", "a", Output(chunk=f"live{i}"))
        if i % 7 == 0:
            await asyncio.sleep(0)
    await rig.finish("a")
    got = flat(await asyncio.wait_for(task, 10))
    assert [c for c in got if isinstance(c, tuple)] == [
        (e.seq, orjson.dumps(e.to_json())) for e in await rig.store.replay("a")
    ]


async def test_raw_paused_consumer_gets_gap_then_every_event_once(
    tiny: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subscription, "RAW_PAGE", 8)
    await tiny.emit("a", 1)
    await tiny.emitter.flush()
    f = follow_stream(tiny.store, tiny.bus, "a")
    got: list[Any] = [await f.__anext__()]
    await tiny.emit("a", 499)
    await tiny.finish("a")
    await tiny.emitter.flush()
    got += [item async for item in f]
    flattened = flat(got)
    assert [g for g in flattened if isinstance(g, GapSignal)] == [
        GapSignal(skipped=496, last_seq=5)
    ]
    assert [c[0] for c in flattened if isinstance(c, tuple)] == list(range(1, 502))


async def test_raw_fleet_follower_and_lag_heal(tiny: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subscription, "RAW_PAGE", 16)
    await tiny.emit("a", 40)
    await tiny.emitter.flush()
    f = follow_fleet(tiny.store, tiny.bus)
    got: list[Any] = [await f.__anext__()]
    assert isinstance(got[0], RawPage) and len(got[0].events) == 16
    for agent in ("a", "b", "c"):
        await tiny.emit(agent, 200)
    await tiny.emitter.flush()
    got += await take(f, 640 - len(events(got)))
    await f.aclose()
    stored = await tiny.store.replay_fleet()
    assert flat(got) == as_bytes(stored)


async def test_a_burst_of_live_events_is_one_page(rig: Rig) -> None:
    """Everything the bus queued while the follower was away comes out as one page."""
    f = follow_stream(rig.store, rig.bus, "a")
    fleet = follow_fleet(rig.store, rig.bus)
    first = asyncio.create_task(f.__anext__())
    first_fleet = asyncio.create_task(fleet.__anext__())
    await wait_until(lambda: rig.bus.subscriber_count() == 2)
    for _ in range(3):  # both followers are now waiting for live events (no history)
        await asyncio.sleep(0)
    await rig.emit("a", 1, prefix="one")
    page = await asyncio.wait_for(first, 10)
    assert isinstance(page, RawPage) and [r.seq for r in page.events] == [1]
    fleet_page = await asyncio.wait_for(first_fleet, 10)
    assert isinstance(fleet_page, RawPage)
    # Ten events committed and published while neither follower runs: one page each.
    for i in range(10):
        await rig.emitter.emit("ws", "a", Output(chunk=f"burst{i}"))
    await rig.emitter.flush()
    page = await asyncio.wait_for(f.__anext__(), 10)
    assert isinstance(page, RawPage) and [r.seq for r in page.events] == list(range(2, 12))
    stored = await rig.store.replay("a")
    assert [r.data for r in page.events] == [orjson.dumps(e.to_json()) for e in stored[1:]]
    fleet_page = await asyncio.wait_for(fleet.__anext__(), 10)
    assert isinstance(fleet_page, RawPage) and len(fleet_page.events) == 10
    assert [r.data for r in fleet_page.events] == [r.data for r in page.events]
    await f.aclose()
    await fleet.aclose()


async def test_interrupt_wakes_a_waiting_follower_with_idle(rig: Rig) -> None:
    await rig.emit("a", 2)
    await rig.emitter.flush()
    f = follow_stream(rig.store, rig.bus, "a")
    assert seqs([await f.__anext__()]) == [1, 2]
    nxt = asyncio.create_task(f.__anext__())
    await wait_until(lambda: rig.bus.subscriber_count() == 1)
    for _ in range(3):
        await asyncio.sleep(0)
    assert not nxt.done()
    f.interrupt()
    assert await asyncio.wait_for(nxt, 10) is IDLE
    # Still following: the next live event arrives as usual.
    nxt = asyncio.create_task(f.__anext__())
    await rig.emit("a", 1, prefix="later")
    page = await asyncio.wait_for(nxt, 10)
    assert isinstance(page, RawPage) and page.events[0].seq == 3
    await f.aclose()
    fleet = follow_fleet(rig.store, rig.bus, 10**9)  # nothing stored after that ordinal
    nxt_fleet = asyncio.create_task(fleet.__anext__())
    for _ in range(3):
        await asyncio.sleep(0)
    fleet.interrupt()
    assert await asyncio.wait_for(nxt_fleet, 10) is IDLE
    await fleet.aclose()
