"""Leases: the LeaseAuthority conformance suite on MemoryLeases (fake clock) and PgLeases (real
PostgreSQL, its clock), PgLeases specifics (migration, shared pool, errors, the fencing guard),
and LeaseKeeper (renewal, loss reporting, conservative `owns`) on both."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

import asyncpg
import pytest

from prospero.core.errors import StoreError
from prospero.core.leases import Lease, LeaseAuthority, LeaseKeeper, MemoryLeases
from prospero.core.store.postgres.db import PgDb
from prospero.core.store.postgres.leases import FENCE_SQL, PgLeases
from tests.conformance.lease_authority import (
    LONG,
    AuthorityFactory,
    FakeClock,
    LeaseAuthorityConformance,
    WaitPast,
)
from tests.support import wait_until

# -- the conformance suite on both backends ---------------------------------------------------


class TestMemoryLeases(LeaseAuthorityConformance):
    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    def authority_factory(self, clock: FakeClock) -> AuthorityFactory:
        memory = MemoryLeases(clock)

        async def make() -> LeaseAuthority:
            return memory

        return make

    @pytest.fixture
    def wait_past(self, clock: FakeClock) -> WaitPast:
        async def past(t: float) -> None:
            clock.set(t + 0.001)

        return past

    @pytest.fixture
    def short_ttl(self) -> float:
        return 5.0


async def pg_now(conn: asyncpg.Connection) -> float:
    return float(await conn.fetchval("SELECT extract(epoch FROM now())::float8"))


class TestPgLeases(LeaseAuthorityConformance):
    @pytest.fixture
    async def authority_factory(self, pg_dsn: str) -> AsyncIterator[AuthorityFactory]:
        opened: list[PgLeases] = []

        async def make() -> LeaseAuthority:
            s = PgLeases(pg_dsn)
            await s.open()
            opened.append(s)
            return s

        yield make
        for s in opened:
            await s.close()

    @pytest.fixture
    async def wait_past(self, pg_dsn: str) -> AsyncIterator[WaitPast]:
        conn = await asyncpg.connect(pg_dsn)

        async def past(t: float) -> None:
            async def passed() -> bool:
                return await pg_now(conn) > t

            await wait_until(passed, timeout=20, what=f"the database clock past {t}")

        yield past
        await conn.close()

    @pytest.fixture
    def short_ttl(self) -> float:
        return 0.3


# -- PgLeases specifics -----------------------------------------------------------------------


async def test_pg_concurrent_boots_and_reopen_keep_state(pg_dsn: str) -> None:
    boots = [PgLeases(pg_dsn) for _ in range(4)]
    await asyncio.gather(*(b.open() for b in boots))
    try:
        lease = await boots[0].acquire("a1", "r1", LONG)
        assert lease is not None
        await boots[0].close()
        again = PgLeases(pg_dsn)
        await again.open()
        await again.open()  # idempotent
        try:
            assert await again.holder("a1") == lease
            assert await again.release(lease)
        finally:
            await again.close()
            await again.close()
        conn = await asyncpg.connect(pg_dsn)
        try:
            version = await conn.fetchval(
                "SELECT version FROM schema_versions WHERE component = 'leases'"
            )
            assert version == 1
            # The released row keeps its epoch (the next holder gets 2).
            assert await conn.fetchval("SELECT epoch FROM leases WHERE key = 'a1'") == 1
        finally:
            await conn.close()
    finally:
        for b in boots[1:]:
            await b.close()


async def test_pg_shared_pool_is_not_closed_by_the_store(pg_dsn: str) -> None:
    db = PgDb(pg_dsn)
    await db.open()
    try:
        store = PgLeases(db)
        await store.open()
        assert await store.acquire("a1", "r1", LONG) is not None
        await store.close()
        assert await db.pool.fetchval("SELECT count(*) FROM leases") == 1
    finally:
        await db.close()


async def test_pg_failures_are_store_errors_without_password(pg_dsn: str) -> None:
    closed = PgLeases(PgDb(pg_dsn))  # never opened
    with pytest.raises(StoreError, match="not open"):
        await closed.acquire("a1", "r1", LONG)
    bad = PgLeases("postgresql://prospero:s3cret@127.0.0.1:1/nowhere")
    with pytest.raises(StoreError) as info:
        await bad.open()
    assert "s3cret" not in str(info.value)


async def test_pg_fence_guard_holds_off_a_takeover_until_the_write_commits(
    pg_dsn: str,
) -> None:
    """The proposal for fenced appends: the guard, in the writer's transaction, share-locks the
    lease row, so a takeover (even of an expired lease) waits for that transaction to end; after
    the takeover the old epoch's guard finds nothing."""
    a, b = PgLeases(pg_dsn), PgLeases(pg_dsn)
    await a.open()
    await b.open()
    writer = await asyncpg.connect(pg_dsn)
    watcher = await asyncpg.connect(pg_dsn)
    try:
        old = await a.acquire("a1", "r1", 0.3)
        assert old is not None
        tx = writer.transaction()
        await tx.start()
        assert await writer.fetchval(FENCE_SQL, "a1", "r1", old.epoch) == 1
        await writer.execute("CREATE TEMP TABLE written (x int)")  # stands in for the append

        async def expired() -> bool:
            return await pg_now(watcher) > old.expires_at

        await wait_until(expired, timeout=20, what="the lease expired on the database clock")
        takeover = asyncio.create_task(b.acquire("a1", "r2", LONG))

        async def blocked() -> bool:
            n = await watcher.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO leases%'"
            )
            return bool(n)

        await wait_until(blocked, timeout=20, what="the takeover waits on the fenced write")
        assert not takeover.done()
        await tx.commit()
        new = await asyncio.wait_for(takeover, 20)
        assert new is not None and (new.owner, new.epoch) == ("r2", old.epoch + 1)
        async with writer.transaction():
            assert await writer.fetchval(FENCE_SQL, "a1", "r1", old.epoch) is None
            assert await writer.fetchval(FENCE_SQL, "a1", "r2", new.epoch) == 1
    finally:
        await writer.close()
        await watcher.close()
        await a.close()
        await b.close()


# -- LeaseKeeper ------------------------------------------------------------------------------


class Gate:
    """A LeaseAuthority wrapper whose renewals can hang (`pause`) or fail (`fail`)."""

    def __init__(self, inner: LeaseAuthority) -> None:
        self.inner = inner
        self.open = asyncio.Event()
        self.open.set()
        self.fail: Exception | None = None
        self.calls = 0
        self.waiting = 0

    def pause(self) -> None:
        self.open.clear()

    def resume(self) -> None:
        self.open.set()

    async def acquire(self, key: str, owner: str, ttl: float) -> Lease | None:
        return await self.inner.acquire(key, owner, ttl)

    async def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        return await self.inner.renew(lease, ttl)

    async def renew_many(self, leases: Sequence[Lease]) -> list[Lease | None]:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        self.waiting += 1
        try:
            await self.open.wait()
        finally:
            self.waiting -= 1
        return await self.inner.renew_many(leases)

    async def release(self, lease: Lease) -> bool:
        return await self.inner.release(lease)

    async def holder(self, key: str) -> Lease | None:
        return await self.inner.holder(key)

    async def holders(self, keys: Sequence[str]) -> dict[str, Lease]:
        return await self.inner.holders(keys)

    async def leases(self) -> list[Lease]:
        return await self.inner.leases()

    async def now(self) -> float:
        return await self.inner.now()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def memory(clock: FakeClock) -> MemoryLeases:
    return MemoryLeases(clock)


def fake_keeper(
    auth: LeaseAuthority, clock: FakeClock, lost: list[Lease], owner: str = "r1"
) -> LeaseKeeper:
    return LeaseKeeper(
        auth, owner, ttl=3.0, heartbeat=1.0, on_lost=lost.append, clock=clock, sleep=clock.sleep
    )


async def asleep_after(keeper: LeaseKeeper, clock: FakeClock, rounds: int) -> None:
    """Wait until the keeper finished `rounds` renewal rounds and sleeps to its next one."""

    def idle() -> bool:
        return keeper.rounds == rounds and clock.sleepers == 1

    await wait_until(idle, timeout=10, what=f"keeper asleep after {rounds} rounds")


def test_keeper_heartbeat_must_be_shorter_than_the_ttl(memory: MemoryLeases) -> None:
    with pytest.raises(ValueError):
        LeaseKeeper(memory, "r1", ttl=1.0, heartbeat=1.0)
    with pytest.raises(ValueError):
        LeaseKeeper(memory, "r1", ttl=0)
    assert LeaseKeeper(memory, "r1", ttl=3.0).heartbeat == 1.0


async def test_keeper_renewal_keeps_ownership_across_many_ttls(
    memory: MemoryLeases, clock: FakeClock
) -> None:
    lost: list[Lease] = []
    keeper = fake_keeper(memory, clock, lost)
    lease = await keeper.acquire("a1")
    assert lease is not None and keeper.owns("a1")
    for i in range(30):  # 30 heartbeats = 10 TTLs
        await asleep_after(keeper, clock, i)
        assert keeper.owns("a1"), i
        clock.advance(1.0)
    await asleep_after(keeper, clock, 30)
    held = await memory.holder("a1")
    assert held is not None and (held.owner, held.epoch) == ("r1", lease.epoch)
    assert held.expires_at > lease.expires_at + 25
    assert keeper.lease("a1") == held
    assert keeper.held() == ["a1"]
    assert lost == [] and keeper.lost == set()
    assert await memory.acquire("a1", "r2", 3.0) is None
    await keeper.close()
    assert await memory.holder("a1") is None  # close releases


async def test_keeper_reports_loss_when_another_owner_takes_over_after_a_pause(
    memory: MemoryLeases, clock: FakeClock
) -> None:
    lost: list[Lease] = []
    keeper = fake_keeper(memory, clock, lost)
    lease = await keeper.acquire("a1")
    assert lease is not None
    await asleep_after(keeper, clock, 0)
    # The process stalls past the TTL: no renewal ran (nothing yields between these lines).
    clock.advance(10.0)
    assert not keeper.owns("a1")  # before the keeper even ran again
    other = await memory.acquire("a1", "r2", 3.0)
    assert other is not None and other.epoch == lease.epoch + 1
    await wait_until(lambda: bool(lost), timeout=10, what="loss reported")
    assert lost == [lease] and keeper.lost == {"a1"}
    assert not keeper.owns("a1") and keeper.lease("a1") is None and keeper.held() == []
    assert await memory.holder("a1") == other
    # It cannot get it back while r2 holds it; once free it comes back with a new epoch.
    assert await keeper.acquire("a1") is None
    assert await memory.release(other)
    again = await keeper.acquire("a1")
    assert again is not None and again.epoch == other.epoch + 1
    assert keeper.owns("a1") and keeper.lost == set()
    await keeper.close()


async def test_keeper_reports_loss_the_moment_a_renewal_is_refused(
    memory: MemoryLeases, clock: FakeClock
) -> None:
    lost: list[Lease] = []
    keeper = fake_keeper(memory, clock, lost)
    lease = await keeper.acquire("a1")
    assert lease is not None
    await asleep_after(keeper, clock, 0)
    assert await memory.release(lease)  # revoked behind the keeper's back
    taken = await memory.acquire("a1", "r2", 3.0)
    assert taken is not None
    clock.advance(1.0)  # well before the local deadline
    await asleep_after(keeper, clock, 1)
    assert lost == [lease] and not keeper.owns("a1")
    await keeper.close()
    assert await memory.holder("a1") == taken  # close releases nothing of r2's


async def test_keeper_owns_false_at_the_local_deadline_while_renewal_hangs(
    memory: MemoryLeases, clock: FakeClock
) -> None:
    gate = Gate(memory)
    lost: list[Lease] = []
    keeper = fake_keeper(gate, clock, lost)
    lease = await keeper.acquire("a1")
    assert lease is not None  # local deadline: 1003
    await asleep_after(keeper, clock, 0)
    gate.pause()
    clock.advance(1.0)  # the renewal goes out and hangs

    def hanging() -> bool:
        return gate.waiting == 1 and clock.sleepers == 1

    await wait_until(hanging, timeout=10, what="renewal in flight, keeper watching its deadline")
    assert keeper.owns("a1")
    clock.advance(1.5)
    assert keeper.owns("a1")
    clock.advance(0.5)  # 1003: the deadline, unconfirmed
    assert not keeper.owns("a1")
    await wait_until(lambda: bool(lost), timeout=10, what="loss reported at the deadline")
    assert lost == [lease] and keeper.lost == {"a1"}
    # The authority answers late (refused: its expiry was 1003 too); the keeper stays out.
    gate.resume()
    await asleep_after(keeper, clock, 1)
    assert not keeper.owns("a1")
    await keeper.close()


async def test_keeper_releases_a_renewal_confirmed_after_it_gave_the_lease_up(
    memory: MemoryLeases, clock: FakeClock
) -> None:
    gate = Gate(memory)
    lost: list[Lease] = []
    # A margin makes the local deadline (1002) earlier than the authority's expiry (1003).
    keeper = LeaseKeeper(
        gate,
        "r1",
        ttl=3.0,
        heartbeat=1.0,
        margin=1.0,
        on_lost=lost.append,
        clock=clock,
        sleep=clock.sleep,
    )
    lease = await keeper.acquire("a1")
    assert lease is not None
    await asleep_after(keeper, clock, 0)
    gate.pause()
    clock.advance(1.0)
    await wait_until(lambda: gate.waiting == 1, timeout=10, what="renewal in flight")
    clock.advance(1.0)  # 1002: the keeper gives up; the authority still has it till 1003
    await wait_until(lambda: bool(lost), timeout=10, what="loss reported")
    assert await memory.holder("a1") is not None
    gate.resume()  # the renewal goes through now: the keeper frees it

    async def freed() -> bool:
        return await memory.holder("a1") is None

    await wait_until(freed, timeout=10, what="the late renewal released")
    assert not keeper.owns("a1")
    await keeper.close()


async def test_keeper_keeps_ownership_through_errors_until_the_deadline(
    memory: MemoryLeases, clock: FakeClock
) -> None:
    gate = Gate(memory)
    lost: list[Lease] = []
    keeper = fake_keeper(gate, clock, lost)
    assert await keeper.acquire("a1") is not None
    await asleep_after(keeper, clock, 0)
    gate.fail = StoreError("database unreachable")
    for i in (1, 2):
        clock.advance(1.0)
        await asleep_after(keeper, clock, i)
        assert keeper.failures == i and keeper.owns("a1") and lost == []
    clock.advance(1.0)  # 1003: the deadline
    assert not keeper.owns("a1")
    await asleep_after(keeper, clock, 3)
    assert [lease.key for lease in lost] == ["a1"]
    await keeper.close()


async def test_keeper_release_and_close(memory: MemoryLeases, clock: FakeClock) -> None:
    lost: list[Lease] = []
    keeper = fake_keeper(memory, clock, lost)
    a = await keeper.acquire("a1")
    b = await keeper.acquire("repo:ws")
    c = await keeper.acquire("a2")
    assert a and b and c
    assert keeper.held() == ["a1", "a2", "repo:ws"]
    assert await keeper.acquire("a1") == a  # ours already: same epoch
    assert await keeper.release("a1") is True
    assert await keeper.release("a1") is False
    assert not keeper.owns("a1") and await memory.holder("a1") is None
    await asleep_after(keeper, clock, 0)
    clock.advance(1.0)
    await asleep_after(keeper, clock, 1)
    assert keeper.held() == ["a2", "repo:ws"] and lost == []
    await keeper.close(release=False)  # a crash: the leases stay until they expire
    assert not keeper.owns("a2")
    assert await memory.holder("a2") is not None
    await keeper.close()  # idempotent
    with pytest.raises(RuntimeError):
        await keeper.acquire("a3")
    assert lost == []


async def test_keeper_on_pg_keeps_ownership_across_ttls(pg_dsn: str) -> None:
    a, b = PgLeases(pg_dsn), PgLeases(pg_dsn)
    await a.open()
    await b.open()
    lost: list[Lease] = []
    keeper = LeaseKeeper(a, "r1", ttl=1.0, heartbeat=0.1, on_lost=lost.append)
    try:
        keys = [f"agent-{i}" for i in range(10)] + ["repo:ws"]
        first = {k: await keeper.acquire(k) for k in keys}
        assert all(v is not None and v.epoch == 1 for v in first.values())
        start = first["agent-0"]
        assert start is not None

        async def renewed_far() -> bool:
            h = await b.holder("agent-0")
            return h is not None and h.expires_at > start.expires_at + 2.5

        await wait_until(renewed_far, timeout=30, what="renewed for more than 2.5 TTLs")
        assert lost == [] and keeper.held() == sorted(keys)
        live = await b.leases()
        assert [(x.key, x.owner, x.epoch) for x in live] == [(k, "r1", 1) for k in sorted(keys)]
        assert await b.acquire("agent-3", "r2", 1.0) is None
        await keeper.close()
        assert await b.leases() == []  # close released them all
    finally:
        await keeper.close()
        await a.close()
        await b.close()


async def test_keeper_on_pg_loses_to_a_takeover_after_a_pause(pg_dsn: str) -> None:
    a, b = PgLeases(pg_dsn), PgLeases(pg_dsn)
    await a.open()
    await b.open()
    gate = Gate(a)
    lost: list[Lease] = []
    # The keeper's deadlines run on this host's monotonic clock, the lease's expiry on the
    # server's wall clock: the margin is what a deployment gives for the two to disagree (rate
    # drift, scheduling). CI once saw `owns` still true at the takeover with no margin; the
    # message below says by how much, and how far the two clocks moved apart meanwhile.
    keeper = LeaseKeeper(gate, "r1", ttl=0.5, heartbeat=0.1, margin=0.05, on_lost=lost.append)

    async def offset() -> float:  # server wall clock - local monotonic clock
        t0 = time.monotonic()
        server = await b.now()
        return server - (t0 + time.monotonic()) / 2

    try:
        before = await offset()
        mine = await keeper.acquire("a1")
        assert mine is not None
        deadline = keeper._held["a1"].deadline
        gate.pause()  # renewals stop reaching the database
        taken: list[Lease] = []
        owned_at_takeover: list[tuple[bool, float]] = []

        async def take() -> bool:
            got = await b.acquire("a1", "r2", LONG)
            if got is not None:
                owned_at_takeover.append((keeper.owns("a1"), deadline - time.monotonic()))
                taken.append(got)
            return got is not None

        await wait_until(take, timeout=30, interval=0.02, what="r2 takes the lapsed lease")
        after = await offset()
        # Conservative: the keeper stopped claiming it before the authority gave it away.
        assert [owned for owned, _ in owned_at_takeover] == [False], (
            f"keeper deadline {owned_at_takeover[0][1]:+.4f}s from the takeover and "
            f"{deadline - (mine.expires_at - before):+.4f}s from the server's expiry (on the "
            f"monotonic clock); the clocks moved apart by {after - before:+.4f}s meanwhile"
        )
        assert taken[0].epoch == mine.epoch + 1
        await wait_until(lambda: bool(lost), timeout=10, what="loss reported")
        assert lost == [mine] and keeper.lost == {"a1"}
        gate.resume()  # the stalled renewal reaches the database: refused (old epoch)
        await wait_until(lambda: gate.waiting == 0, timeout=10, what="renewal answered")
        assert await b.holder("a1") == taken[0]
        assert not keeper.owns("a1")
        assert await keeper.acquire("a1") is None
    finally:
        gate.resume()
        await keeper.close()
        await a.close()
        await b.close()
