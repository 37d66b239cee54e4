"""Fencing (issue 12): a replica that lost a lease writes nothing under it after the takeover.

Two replicas on one real PostgreSQL, each with its own `PostgresEventStore`, `PgLeases`,
`LeaseKeeper`, `LeasedOwnership` and `Emitter(ownership=...)`: a paused old owner (its keeper
no longer renewing, still believing it holds the lease) emits after another replica took the
key over, and none of it lands. Plus the store-level guard (`append_batch(fences=...)`:
`FenceLost`, nothing written; the lease row share-locked so a takeover waits for the append),
lifecycle kinds fenced by `repo:<workspace>`, unfenced kinds, a batch mixing a lost and a held
key, and the standalone emitter (SQLite, or no ownership) unaffected.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest

from prospero.core.drivers.ndjson_state import BASE_SUFFIX
from prospero.core.emitter import Emitter
from prospero.core.emitter_commit import cursor_lease_key
from prospero.core.errors import FenceLost
from prospero.core.fleet.cursors import EmitterCursors
from prospero.core.leases import Lease, LeaseKeeper
from prospero.core.metrics import EVENTS_APPENDED, EVENTS_FENCED
from prospero.core.ownership import Lease as OwnedLease
from prospero.core.ownership import LeasedOwnership, lease_key_for, workspace_key
from prospero.core.store.base import Fence
from prospero.core.store.postgres import events_sql as sql
from prospero.core.store.postgres.events import PostgresEventStore
from prospero.core.store.postgres.leases import PgLeases
from prospero.core.store.sqlite.events import SqliteEventStore
from prospero.types.events import (
    AgentDiscovered,
    AgentSpawned,
    FleetEvent,
    Output,
    StatusChanged,
    TurnFinished,
)
from prospero.types.model import AgentStatus
from tests.support import CollectingBus, wait_until

TTL = 1.5  # short: a takeover after a pause is a second or so away (long enough on a busy CI box)
LONG = 60.0
REPO = "ws"


def out(text: str) -> Output:
    return Output(stream="stdout", chunk=text)


def chunks(events: list[FleetEvent]) -> list[str]:
    return [e.kind.chunk for e in events if isinstance(e.kind, Output)]


async def pg_now(conn: asyncpg.Connection) -> float:
    return float(await conn.fetchval("SELECT extract(epoch FROM now())::float8"))


async def wait_expired(dsn: str, lease: Lease) -> None:
    """Bounded poll until the database clock is past the lease's expiry."""
    conn = await asyncpg.connect(dsn)
    try:

        async def past() -> bool:
            return await pg_now(conn) > lease.expires_at

        await wait_until(past, timeout=10, what=f"lease {lease.key} expired on the DB clock")
    finally:
        await conn.close()


class Pausable:
    """A keeper's clock and sleep that can be frozen: once `pause()`d the keeper renews nothing
    more (its sleeps never end) and its clock stands still, so it goes on believing it holds
    its leases (as a process stopped by SIGSTOP, or a long GC pause, would)."""

    def __init__(self) -> None:
        self.frozen_at: float | None = None
        self._paused = asyncio.Event()

    def pause(self) -> None:
        self.frozen_at = time.monotonic()
        self._paused.set()

    def clock(self) -> float:
        return self.frozen_at if self.frozen_at is not None else time.monotonic()

    async def sleep(self, dt: float) -> None:
        if self._paused.is_set():
            await asyncio.Event().wait()  # paused: forever (until the task is cancelled)
        sleeper = asyncio.ensure_future(asyncio.sleep(dt))
        pause = asyncio.ensure_future(self._paused.wait())
        try:
            await asyncio.wait({sleeper, pause}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            pause.cancel()
        if self._paused.is_set():
            await asyncio.Event().wait()


@dataclass
class Replica:
    name: str
    store: PostgresEventStore
    leases: PgLeases
    keeper: LeaseKeeper
    ownership: LeasedOwnership
    bus: CollectingBus
    emitter: Emitter
    pausable: Pausable


@dataclass
class Cluster:
    dsn: str
    replicas: list[Replica] = field(default_factory=list)

    async def replica(self, name: str, *, ttl: float = TTL) -> Replica:
        store = PostgresEventStore(self.dsn)
        await store.open()
        leases = PgLeases(self.dsn)
        await leases.open()
        pausable = Pausable()
        keeper = LeaseKeeper(leases, name, ttl=ttl, clock=pausable.clock, sleep=pausable.sleep)
        ownership = LeasedOwnership(keeper)
        bus = CollectingBus()
        emitter = Emitter(store, bus, ownership=ownership)
        r = Replica(name, store, leases, keeper, ownership, bus, emitter, pausable)
        self.replicas.append(r)
        return r

    async def close(self) -> None:
        for r in self.replicas:
            await r.emitter.close()
            await r.keeper.close(release=False)
            await r.leases.close()
            await r.store.close()


@pytest.fixture
async def cluster(pg_dsn: str) -> AsyncIterator[Cluster]:
    c = Cluster(pg_dsn)
    yield c
    await c.close()


async def take_over(r: Replica, key: str) -> OwnedLease:
    """Bounded poll until `r` gets `key` (the previous owner's lease must expire first)."""
    got: list[OwnedLease] = []

    async def acquired() -> bool:
        lease = await r.ownership.try_acquire(key)
        if lease is not None:
            got.append(lease)
        return lease is not None

    await wait_until(acquired, timeout=10, what=f"{r.name} takes {key} over")
    return got[0]


# -- two replicas: a paused old owner ---------------------------------------------------------


async def test_paused_old_owner_writes_nothing_after_takeover(cluster: Cluster) -> None:
    a = await cluster.replica("A")
    b = await cluster.replica("B")
    first = await a.ownership.try_acquire("x")
    assert first is not None and first.epoch == 1
    for i in range(5):
        await a.emitter.emit(REPO, "x", out(f"A{i}"))
    await a.emitter.emit_many(REPO, "x", [out("A5")], cursor=b"A-cursor")
    await a.emitter.flush()
    assert await a.store.high_water("x") == 6

    # A stops (renews nothing more) but its clock stands still: it goes on believing.
    a.pausable.pause()
    held = a.keeper.lease("x")
    assert held is not None
    await wait_expired(cluster.dsn, held)
    second = await take_over(b, "x")
    assert second.epoch == 2
    assert a.ownership.owns("x") and a.ownership.fence("x") == Fence("x", "A", 1)

    for i in range(3):
        await b.emitter.emit(REPO, "x", out(f"B{i}"))
    await b.emitter.emit_many(REPO, "x", [out("B3")], cursor=b"B-cursor")
    await b.emitter.flush()

    # The old owner emits on: seqs 7.. (its counter), the same as B's; all fenced out.
    seen = len(a.bus.items)
    for i in range(4):
        await a.emitter.emit(REPO, "x", out(f"late-A{i}"))
    await a.emitter.emit_many(REPO, "x", [out("late-A4")], cursor=b"late-A-cursor")
    await a.emitter.flush()

    stored = await b.store.replay("x")
    assert [e.seq for e in stored] == list(range(1, 11))  # no duplicate, no gap
    assert chunks(stored) == [f"A{i}" for i in range(6)] + [f"B{i}" for i in range(4)]
    assert await b.store.load_cursor("x") == b"B-cursor"
    assert a.emitter.metrics.get(EVENTS_FENCED) == 5
    assert a.emitter.metrics.get(EVENTS_APPENDED) == 6
    assert b.emitter.metrics.get(EVENTS_FENCED) == 0
    assert a.bus.items[seen:] == []  # dropped events are not published (not even as lost)
    # No loss marker either: they were B's to write.
    assert not [e for e in stored if e.kind.kind == "store_persist_failed"]


async def test_takeover_while_the_old_owner_keeps_writing(cluster: Cluster) -> None:
    """A writes without pause while it is paused-and-taken-over: every event of A that landed
    is ordered before B's first, the stream has no gap or duplicate, and everything A emitted
    is either stored or counted as fenced."""
    a = await cluster.replica("A")
    b = await cluster.replica("B")
    assert await a.ownership.try_acquire("x") is not None
    stop = asyncio.Event()
    emitted = 0

    async def produce() -> None:
        nonlocal emitted
        while not stop.is_set():
            await a.emitter.emit(REPO, "x", out(f"A{emitted}"))
            emitted += 1
            if emitted % 5 == 0:
                await a.emitter.flush()  # (also yields: the takeover runs meanwhile)

    producer = asyncio.ensure_future(produce())
    try:
        await wait_until(lambda: emitted >= 20, what="A is writing")
        a.pausable.pause()
        await take_over(b, "x")
        fenced_before = a.emitter.metrics.get(EVENTS_FENCED)
        for i in range(5):
            await b.emitter.emit(REPO, "x", out(f"B{i}"))
        await b.emitter.flush()
        await wait_until(
            lambda: a.emitter.metrics.get(EVENTS_FENCED) > fenced_before + 5,
            what="A's writes after the takeover are fenced",
        )
    finally:
        stop.set()
        await producer
    await a.emitter.flush()
    fleet = await b.store.replay_fleet()
    who = [s.event.kind.chunk[0] for s in fleet if isinstance(s.event.kind, Output)]
    assert who == sorted(who)  # every A before every B (commit order)
    assert who.count("B") == 5
    stored = await b.store.replay("x")
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
    assert who.count("A") + a.emitter.metrics.get(EVENTS_FENCED) == emitted


async def test_old_owner_whose_keeper_noticed_the_loss_is_fenced_locally(
    cluster: Cluster,
) -> None:
    """A keeper that stopped (not paused: it knows it holds nothing) fences with epoch 0: the
    emitter drops the events without a round trip, and nothing reaches the store."""
    a = await cluster.replica("A")
    assert await a.ownership.try_acquire("x") is not None
    await a.emitter.emit(REPO, "x", out("A0"))
    await a.emitter.flush()
    await a.keeper.close(release=False)
    assert a.ownership.fence("x") == Fence("x", "A", 0)
    last = await a.store.last_ordinal()
    for i in range(3):
        await a.emitter.emit(REPO, "x", out(f"A{i + 1}"))
    await a.emitter.flush()
    assert await a.store.last_ordinal() == last
    assert chunks(await a.store.replay("x")) == ["A0"]
    assert a.emitter.metrics.get(EVENTS_FENCED) == 3


# -- the store's guard (unit level) ---------------------------------------------------------


@pytest.fixture
async def pg(pg_dsn: str) -> AsyncIterator[tuple[PostgresEventStore, PgLeases]]:
    store = PostgresEventStore(pg_dsn)
    await store.open()
    leases = PgLeases(pg_dsn)
    await leases.open()
    yield store, leases
    await leases.close()
    await store.close()


def fev(seq: int, agent: str = "x", kind: object | None = None, repo: str = REPO) -> FleetEvent:
    return FleetEvent(
        seq=seq,
        ts="2026-01-01T00:00:00.000Z",
        repo=repo,
        agent_id=agent,
        kind=kind if kind is not None else out(f"{agent}{seq}"),  # type: ignore[arg-type]
    )


def fence_of(lease: Lease) -> Fence:
    return Fence(lease.key, lease.owner, lease.epoch)


async def test_store_declares_fenced_appends() -> None:
    assert PostgresEventStore.capabilities.fenced_appends
    assert PostgresEventStore.capabilities.shared
    assert not SqliteEventStore.capabilities.fenced_appends


async def test_store_append_under_held_fences(
    pg: tuple[PostgresEventStore, PgLeases],
) -> None:
    store, leases = pg
    x = await leases.acquire("x", "A", LONG)
    y = await leases.acquire("y", "A", LONG)
    assert x is not None and y is not None
    fences = [fence_of(x), fence_of(y), fence_of(x)]  # (duplicates are fine)
    ordinals = await store.append_batch(
        [fev(1, "x"), fev(1, "y")], cursors={"x": b"cx"}, fences=fences
    )
    assert ordinals == [1, 2]
    assert await store.load_cursor("x") == b"cx"
    # Cursors alone, fenced.
    assert await store.append_batch([], cursors={"y": b"cy"}, fences=[fence_of(y)]) == []
    assert await store.load_cursor("y") == b"cy"


@pytest.mark.parametrize("how", ["stale_epoch", "wrong_owner", "epoch_0", "expired", "unknown"])
async def test_store_fence_lost_writes_nothing(
    pg: tuple[PostgresEventStore, PgLeases], pg_dsn: str, how: str
) -> None:
    store, leases = pg
    held = await leases.acquire("held", "A", LONG)
    assert held is not None
    if how == "expired":
        x = await leases.acquire("x", "A", 0.2)
        assert x is not None
        await wait_expired(pg_dsn, x)  # nobody took it over: still not ours to write
        bad = fence_of(x)
    elif how == "unknown":
        bad = Fence("x", "A", 1)  # no lease was ever taken on x
    else:
        x = await leases.acquire("x", "A", 0.2 if how == "stale_epoch" else LONG)
        assert x is not None
        if how == "stale_epoch":
            await wait_expired(pg_dsn, x)
            x2 = await leases.acquire("x", "B", LONG)
            assert x2 is not None and x2.epoch == x.epoch + 1
            bad = fence_of(x)
        elif how == "wrong_owner":
            bad = Fence("x", "B", x.epoch)
        else:
            bad = Fence("x", "A", 0)
    batch = [fev(1, "held"), fev(1, "x"), fev(2, "x", TurnFinished(turn=1, cost_usd=1.0))]
    with pytest.raises(FenceLost) as info:
        await store.append_batch(
            batch, cursors={"x": b"cx", "held": b"ch"}, fences=[fence_of(held), bad]
        )
    assert info.value.keys == ["x"]
    # Nothing of the batch: no events, no cursors, no usage, no ordinal consumed.
    assert await store.last_ordinal() == 0
    assert await store.replay_fleet() == []
    assert await store.load_cursor("x") is None and await store.load_cursor("held") is None
    assert await store.usage("2026-01-01", "2026-01-01") == []
    # The store is usable after, and the held fence alone still passes.
    assert await store.append_batch([fev(1, "held")], fences=[fence_of(held)]) == [1]


async def test_store_fence_lost_names_every_lost_key_sorted(
    pg: tuple[PostgresEventStore, PgLeases],
) -> None:
    store, leases = pg
    held = await leases.acquire("m", "A", LONG)
    assert held is not None
    fences = [Fence("z", "A", 1), fence_of(held), Fence("b", "A", 3), Fence("m", "A", 99)]
    with pytest.raises(FenceLost) as info:
        await store.append_batch([fev(1, "m")], fences=fences)
    assert info.value.keys == ["b", "m", "z"]
    assert await store.last_ordinal() == 0


async def test_store_without_leases_table(pg_dsn: str) -> None:
    """No lease was ever taken on this database (no `leases` table): unfenced appends work, a
    fenced one is FenceLost on all its keys, nothing written, the store usable after."""
    store = PostgresEventStore(pg_dsn)
    await store.open()
    try:
        assert await store.append_batch([fev(1)]) == [1]
        with pytest.raises(FenceLost) as info:
            await store.append_batch(
                [fev(2)], cursors={"x": b"c"}, fences=[Fence("x", "A", 1), Fence("a", "A", 1)]
            )
        assert info.value.keys == ["a", "x"]
        assert await store.last_ordinal() == 1 and await store.load_cursor("x") is None
        assert await store.append_batch([fev(2)], cursors={"x": b"c"}) == [2]
    finally:
        await store.close()


async def test_fence_check_comes_before_the_seq_check(
    pg: tuple[PostgresEventStore, PgLeases],
) -> None:
    """An old owner's batch usually reuses seqs the new owner wrote: it must be FenceLost (its
    events dropped), not SeqConflict (which would re-seed and write them)."""
    store, leases = pg
    x = await leases.acquire("x", "B", LONG)
    assert x is not None
    await store.append_batch([fev(1)], fences=[fence_of(x)])
    with pytest.raises(FenceLost):
        await store.append_batch([fev(1)], fences=[Fence("x", "A", x.epoch)])


async def test_takeover_waits_for_an_append_in_flight(pg_dsn: str) -> None:
    """The guard share-locks the lease row until the append's transaction ends: a takeover of
    that key (its row UPDATEd by acquire) waits for it, so the old owner's append commits
    before the new epoch exists, never after."""
    leases = PgLeases(pg_dsn)
    await leases.open()
    store = PostgresEventStore(pg_dsn)
    await store.open()
    conn = await asyncpg.connect(pg_dsn)
    watch = await asyncpg.connect(pg_dsn)
    try:
        x = await leases.acquire("x", "A", 0.3)
        assert x is not None
        tx = conn.transaction()
        await tx.start()
        rows = await conn.fetch(sql.FENCE_CHECK, ["x"], ["A"], [x.epoch])
        assert len(rows) == 1  # held: the row is now share-locked by this transaction
        await wait_expired(pg_dsn, x)
        takeover = asyncio.ensure_future(leases.acquire("x", "B", LONG))

        async def blocked() -> bool:
            n = await watch.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO leases%'"
            )
            return bool(n)

        await wait_until(blocked, timeout=10, what="the takeover waits on the lease row")
        assert not takeover.done()
        await conn.execute(
            "INSERT INTO cursors (key, data) VALUES ('x', '\\x01'::bytea)"
        )  # the old owner's write, in the guarded transaction
        await tx.commit()
        new = await asyncio.wait_for(takeover, timeout=10)
        assert new is not None and new.epoch == x.epoch + 1 and new.owner == "B"
        assert await store.load_cursor("x") == b"\x01"
        # From now on, the old epoch is refused.
        with pytest.raises(FenceLost):
            await store.append_batch([], cursors={"x": b"\x02"}, fences=[fence_of(x)])
        assert await store.load_cursor("x") == b"\x01"
    finally:
        await conn.close()
        await watch.close()
        await store.close()
        await leases.close()


# -- the emitter with a fixed view of its leases --------------------------------------------


class StaticOwnership:
    """A FencingOwnership that believes what it is told (`epochs`): an owner whose belief is
    stale, without a keeper."""

    shared = True

    def __init__(self, replica_id: str, epochs: dict[str, int] | None = None) -> None:
        self.replica_id = replica_id
        self.epochs = dict(epochs or {})
        self.fenced: list[list[str]] = []

    async def try_acquire(self, key: str) -> OwnedLease | None:
        return None

    async def release(self, key: str) -> None:
        return None

    def owns(self, key: str) -> bool:
        return self.epochs.get(key, 0) > 0

    def fence(self, key: str) -> Fence:
        return Fence(key, self.replica_id, self.epochs.get(key, 0))


async def emitter_on(
    store: PostgresEventStore | SqliteEventStore, ownership: StaticOwnership | None
) -> tuple[Emitter, CollectingBus]:
    bus = CollectingBus()
    return Emitter(store, bus, ownership=ownership), bus


async def test_lifecycle_kinds_are_fenced_by_the_workspace_lease(
    pg: tuple[PostgresEventStore, PgLeases],
) -> None:
    store, leases = pg
    ws = await leases.acquire(workspace_key(REPO), "A", LONG)
    agent = await leases.acquire("y", "B", LONG)
    assert ws is not None and agent is not None
    assert lease_key_for(REPO, "y", "status_changed") == "repo:ws"
    assert lease_key_for(REPO, "", "output") == "repo:ws"
    a_em, _ = await emitter_on(store, StaticOwnership("A", {"repo:ws": ws.epoch}))
    b_em, _ = await emitter_on(store, StaticOwnership("B", {"y": agent.epoch}))
    try:
        # A holds the workspace, not agent y: it writes y's lifecycle events only.
        await a_em.emit(
            REPO, "y", StatusChanged(from_=AgentStatus.spawning, to=AgentStatus.running)
        )
        await a_em.emit(REPO, "y", out("not A's"))
        await a_em.emit(REPO, "", AgentDiscovered())
        await a_em.flush()
        # B holds agent y, not the workspace: it writes y's output, not its lifecycle.
        await b_em.emit(REPO, "y", AgentDiscovered())
        await b_em.emit(REPO, "y", out("B's"))
        await b_em.flush()
    finally:
        await a_em.close()
        await b_em.close()
    y = await store.replay("y")
    # (B's agent_discovered, seq 2, dropped: its output takes seq 2, no gap.)
    assert [(e.seq, e.kind.kind) for e in y] == [(1, "status_changed"), (2, "output")]
    assert chunks(y) == ["B's"]
    assert [e.kind.kind for e in await store.replay("repo:ws")] == ["agent_discovered"]
    assert a_em.metrics.get(EVENTS_FENCED) == 1 and b_em.metrics.get(EVENTS_FENCED) == 1


async def test_unfenced_kinds_are_written_by_a_replica_holding_nothing(
    pg: tuple[PostgresEventStore, PgLeases],
) -> None:
    store, leases = pg
    assert await leases.acquire("z", "A", LONG) is not None  # another replica's agent
    em, bus = await emitter_on(store, StaticOwnership("B"))
    try:
        await em.emit(REPO, "z", AgentSpawned())
        await em.emit(REPO, "z", out("not B's"))
        await em.flush()
    finally:
        await em.close()
    assert [e.kind.kind for e in await store.replay("z")] == ["agent_spawned"]
    assert em.metrics.get(EVENTS_FENCED) == 1 and em.metrics.get(EVENTS_APPENDED) == 1
    assert [i.event.kind.kind for i in bus.items] == ["agent_spawned"]


async def test_batch_mixing_a_lost_and_a_held_key_writes_the_held_one(
    pg: tuple[PostgresEventStore, PgLeases], pg_dsn: str
) -> None:
    """One batch: agent x (taken over by B; A's belief stale) and agent y (A's). The store
    refuses it for x; the emitter drops x's events and cursors (both rows of x's driver) and
    writes the rest at once: y's events and cursor, and the unfenced event of x."""
    store, leases = pg
    x = await leases.acquire("x", "A", 0.2)
    y = await leases.acquire("y", "A", LONG)
    assert x is not None and y is not None
    await wait_expired(pg_dsn, x)
    x2 = await leases.acquire("x", "B", LONG)
    assert x2 is not None
    await store.append_batch([fev(1, "x")], cursors={"x": b"B"}, fences=[fence_of(x2)])
    own = StaticOwnership("A", {"x": x.epoch, "y": y.epoch})
    em, bus = await emitter_on(store, own)
    try:
        await em.prepare(["x", "y"])
        assert cursor_lease_key("x" + BASE_SUFFIX) == "x"
        # Queued without a yield in between: one batch.
        await em.emit_many(
            REPO, "x", [out("x-late")], cursor=b"A", cursor_extra=[("x" + BASE_SUFFIX, b"A")]
        )
        await em.emit_many(REPO, "y", [out("y0"), out("y1")], cursor=b"Y")
        await em.emit(REPO, "x", AgentSpawned())
        await em.flush()
    finally:
        await em.close()
    assert chunks(await store.replay("y")) == ["y0", "y1"]
    assert await store.load_cursor("y") == b"Y"
    xs = await store.replay("x")
    # x-late (seq 2) dropped: the unfenced event queued behind it closes the gap.
    assert [(e.seq, e.kind.kind) for e in xs] == [(1, "output"), (2, "agent_spawned")]
    assert chunks(xs) == ["x1"]  # B's
    assert await store.load_cursor("x") == b"B"
    assert await store.load_cursor("x" + BASE_SUFFIX) is None
    assert em.metrics.get(EVENTS_FENCED) == 1 and em.metrics.get(EVENTS_APPENDED) == 3
    assert sorted(chunks([i.event for i in bus.items])) == ["y0", "y1"]
    assert all(i.ordinal is not None for i in bus.items)


async def test_cursor_alone_under_a_lost_key_is_dropped(
    pg: tuple[PostgresEventStore, PgLeases],
) -> None:
    store, leases = pg
    x = await leases.acquire("x", "B", LONG)
    assert x is not None
    await store.append_batch([], cursors={"x": b"B"}, fences=[fence_of(x)])
    em, _ = await emitter_on(store, StaticOwnership("A", {"x": x.epoch}))  # wrong owner
    try:
        await em.emit_many(REPO, "x", [], cursor=b"A")
        await em.flush()
    finally:
        await em.close()
    assert await store.load_cursor("x") == b"B"


async def test_dropped_stream_continues_from_the_store_when_the_key_comes_back(
    pg: tuple[PostgresEventStore, PgLeases], pg_dsn: str
) -> None:
    """After its events were fenced out, a stream's next seq comes from the store's high water
    (the other owner's), not from the emitter's counter: when the lease comes back to it, the
    stream has no gap."""
    store, leases = pg
    x = await leases.acquire("x", "A", 0.2)
    assert x is not None
    own_a = StaticOwnership("A", {"x": x.epoch})
    a_em, _ = await emitter_on(store, own_a)
    b_em, _ = await emitter_on(store, None)
    try:
        await a_em.emit(REPO, "x", out("A0"))
        await a_em.flush()
        await wait_expired(pg_dsn, x)
        x2 = await leases.acquire("x", "B", LONG)
        assert x2 is not None
        b_em._fencing = StaticOwnership("B", {"x": x2.epoch})  # (B's emitter, fenced)
        for i in range(3):
            await a_em.emit(REPO, "x", out(f"late{i}"))  # seqs 2..4: fenced out
        await a_em.flush()
        assert a_em.metrics.get(EVENTS_FENCED) == 3
        await b_em.emit(REPO, "x", out("B0"))  # seq 2
        await b_em.flush()
        assert await leases.release(x2)
        x3 = await leases.acquire("x", "A", LONG)
        assert x3 is not None and x3.epoch == x2.epoch + 1
        own_a.epochs["x"] = x3.epoch
        await a_em.emit(REPO, "x", out("A-again"))
        await a_em.flush()
    finally:
        await a_em.close()
        await b_em.close()
    stored = await store.replay("x")
    assert [e.seq for e in stored] == [1, 2, 3]
    assert chunks(stored) == ["A0", "B0", "A-again"]


# -- standalone: unchanged ----------------------------------------------------------------


async def test_standalone_emitter_ignores_ownership_on_sqlite(tmp_path: Path) -> None:
    """SQLite has one writer (no `fenced_appends`): an ownership holding nothing changes
    nothing, and the emitter takes its usual (inline / pipelined) paths."""
    store = SqliteEventStore(tmp_path / "events.db")
    await store.open()
    try:
        em, bus = await emitter_on(store, StaticOwnership("A"))
        assert em._fencing is None and em._inline is not None
        try:
            await em.emit_many(REPO, "x", [out("a"), out("b")], cursor=b"c")
            await em.emit(REPO, "", AgentDiscovered())
            await em.flush()
        finally:
            await em.close()
        assert chunks(await store.replay("x")) == ["a", "b"]
        assert await store.load_cursor("x") == b"c"
        assert len(await store.replay("repo:ws")) == 1
        assert em.metrics.get(EVENTS_FENCED) == 0 and len(bus.items) == 3
    finally:
        await store.close()


async def test_postgres_emitter_without_ownership_is_unfenced(pg_dsn: str) -> None:
    """No ownership: no fences (the `leases` table need not even exist)."""
    store = PostgresEventStore(pg_dsn)
    await store.open()
    try:
        em, _ = await emitter_on(store, None)
        assert em._fencing is None
        try:
            await em.emit_many(REPO, "x", [out("a")], cursor=b"c")
            await em.flush()
        finally:
            await em.close()
        assert chunks(await store.replay("x")) == ["a"]
        assert await store.load_cursor("x") == b"c"
    finally:
        await store.close()


async def test_driver_cursor_saves_go_through_the_fence(
    pg: tuple[PostgresEventStore, PgLeases],
) -> None:
    """`EmitterCursors` (what a clustered FleetManager hands its drivers): an ACP driver's
    session state saved by a replica that lost the agent does not overwrite the new owner's."""
    store, leases = pg
    x = await leases.acquire("x", "B", LONG)
    assert x is not None
    await store.append_batch([], cursors={"x": b"new owner"}, fences=[fence_of(x)])
    em, _ = await emitter_on(store, StaticOwnership("A", {"x": x.epoch}))  # A: stale belief
    try:
        cursors = EmitterCursors(em, store, REPO)
        await cursors.save_cursor("x", b"old owner")
        assert await cursors.load_cursor("x") == b"new owner"
        ours = await emitter_on(store, StaticOwnership("B", {"x": x.epoch}))
        try:
            await EmitterCursors(ours[0], store, REPO).save_cursor("x", b"new owner, later")
        finally:
            await ours[0].close()
        assert await store.load_cursor("x") == b"new owner, later"
    finally:
        await em.close()
