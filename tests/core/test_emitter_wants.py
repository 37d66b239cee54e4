"""The emitter builds a run's events only for a bus that wants them (issue 11, ingest).

`InProcessBus.wants(key)` says whether publishing an event of that stream would reach anyone;
the emitter skips building the models of runs nobody wants. Nothing observable changes:
watchers of a stream (or of the fleet) get exactly what they got before, in order, and a bus
that overrides `publish` still sees every item."""

from __future__ import annotations

from pathlib import Path

from prospero.core.bus import BusItem, InProcessBus, Lagged
from prospero.core.emitter import Emitter
from prospero.core.metrics import EVENTS_APPENDED, Metrics
from prospero.core.store.sqlite.events import SqliteEventStore
from prospero.types.events import Output, TurnFinished


def test_wants_follows_the_subscriptions() -> None:
    bus = InProcessBus()
    assert not bus.wants("a")
    sub = bus.subscribe("a")
    assert bus.wants("a") and not bus.wants("b")
    sub.close()
    assert not bus.wants("a")
    fleet = bus.subscribe(None)
    assert bus.wants("a") and bus.wants("b")
    fleet.close()
    assert not bus.wants("b")
    bus.subscribe("a")
    bus.close()
    assert not bus.wants("a")


def test_a_bus_overriding_publish_wants_everything() -> None:
    class Recording(InProcessBus):
        def publish(self, item: BusItem) -> None:
            super().publish(item)

    assert Recording().wants("a")
    patched = InProcessBus()
    patched.publish = lambda item: None  # type: ignore[method-assign]
    assert patched.wants("a")


async def test_runs_reach_their_watchers_only_and_all_are_stored(tmp_path: Path) -> None:
    store = SqliteEventStore(tmp_path / "events.db")
    await store.open()
    bus = InProcessBus(buffer=10_000)
    metrics = Metrics()
    em = Emitter(store, bus, metrics)
    await em.start()
    try:
        watch_a = bus.subscribe("a")
        fleet = bus.subscribe(None)
        turn = TurnFinished(turn=0, stop_reason="end_turn")
        await em.emit_many("ws", "a", [("stdout", "a0"), turn, Output(chunk="a1")])
        await em.emit_many("ws", "b", [("stdout", "b0"), ("thinking", "b1")])
        await em.emit_many("ws", "a", [("stdout", "a2")])
        await em.flush()
        got_a = _drain(watch_a)
        got_all = _drain(fleet)
        assert [(i.event.agent_id, i.event.seq) for i in got_a] == [
            ("a", 1),
            ("a", 2),
            ("a", 3),
            ("a", 4),
        ]
        assert [(i.event.agent_id, i.event.seq) for i in got_all] == [
            ("a", 1),
            ("a", 2),
            ("a", 3),
            ("b", 1),
            ("b", 2),
            ("a", 4),
        ]
        assert got_a[1].event.kind == turn
        assert got_a[2].event.kind == Output(chunk="a1")
        stored = await store.replay("a")
        assert [e.model_dump() for e in stored] == [i.event.model_dump() for i in got_a]
        ordinals = [i.ordinal for i in got_all]
        assert None not in ordinals and ordinals == sorted(ordinals)
        fleet.close()
        # Nobody watches b now: its run is stored (and counted) without being published.
        await em.emit_many("ws", "b", [("stdout", "b2")])
        await em.flush()
        assert [e.kind for e in await store.replay("b", 3)] == [Output(chunk="b2")]
        assert metrics.get(EVENTS_APPENDED) == 7
        assert not _drain(watch_a)
    finally:
        await em.close()
        await store.close()


def _drain(sub: object) -> list[BusItem]:
    out: list[BusItem] = []
    queue = sub._queue  # type: ignore[attr-defined]
    while queue:
        item = queue.popleft()
        assert not isinstance(item, Lagged)
        out.append(item)
    return out
