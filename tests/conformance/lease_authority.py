"""LeaseAuthority conformance: what every lease backend (MemoryLeases, PgLeases) must do.

A test module subclasses `LeaseAuthorityConformance` and provides fixtures:
- `authority_factory`: an async callable returning a new open handle on the *same* authority
  (for PostgreSQL a new connection pool on the same database: another replica); the fixture
  closes what it opened at teardown;
- `wait_past`: an async callable `wait_past(t)` returning once the authority's clock (`now()`)
  is past `t` (a fake clock jumps there; a real one is polled, bounded);
- `short_ttl`: a TTL for leases a test lets expire (the others use `LONG`, which never expires
  within a test).

Semantics pinned here beyond the Protocol's docstrings:
- epochs per key strictly increase, forever: after expiry, takeover, release and re-acquire by
  the same owner alike; a lease object from an older epoch can neither renew nor release;
- a live lease is exclusive: of N owners acquiring one key at once exactly one gets it;
- `holder`/`holders`/`leases` show live leases only; keys are independent.

`FakeClock` (a clock with a matching `sleep`) drives MemoryLeases and LeaseKeeper tests.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Callable

import pytest

from prospero.core.leases import Lease, LeaseAuthority

AuthorityFactory = Callable[[], Awaitable[LeaseAuthority]]
WaitPast = Callable[[float], Awaitable[None]]

LONG = 120.0


class FakeClock:
    """A clock tests move by hand, and a `sleep` on it: sleepers wake when `advance` (or
    `set`) moves the clock to or past their wake time."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._n = itertools.count()

    def __call__(self) -> float:
        return self.t

    @property
    def sleepers(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def set(self, t: float) -> None:
        self.t = max(self.t, t)
        while self._sleepers and self._sleepers[0][0] <= self.t:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    def advance(self, dt: float) -> None:
        self.set(self.t + dt)

    async def sleep(self, dt: float) -> None:
        if dt <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.t + dt, next(self._n), fut))
        await fut


class LeaseAuthorityConformance:
    @pytest.fixture
    async def auth(self, authority_factory: AuthorityFactory) -> LeaseAuthority:
        return await authority_factory()

    @staticmethod
    async def expire(auth: LeaseAuthority, wait_past: WaitPast, lease: Lease) -> None:
        await wait_past(lease.expires_at)
        assert await auth.now() >= lease.expires_at

    # -- acquire -------------------------------------------------------------------------

    async def test_acquire_free_key(self, auth: LeaseAuthority) -> None:
        before = await auth.now()
        lease = await auth.acquire("a1", "r1", LONG)
        after = await auth.now()
        assert lease is not None
        assert (lease.key, lease.owner, lease.epoch, lease.ttl) == ("a1", "r1", 1, LONG)
        assert before + LONG <= lease.expires_at <= after + LONG
        assert await auth.holder("a1") == lease
        assert await auth.leases() == [lease]

    async def test_acquire_held_by_same_owner_renews_same_epoch(self, auth: LeaseAuthority) -> None:
        first = await auth.acquire("a1", "r1", LONG)
        again = await auth.acquire("a1", "r1", LONG)
        assert first is not None and again is not None
        assert again.epoch == first.epoch == 1
        assert again.expires_at >= first.expires_at
        assert await auth.holder("a1") == again

    async def test_acquire_held_by_another_live_owner_is_refused(
        self, auth: LeaseAuthority
    ) -> None:
        held = await auth.acquire("a1", "r1", LONG)
        assert await auth.acquire("a1", "r2", LONG) is None
        assert await auth.holder("a1") == held

    async def test_exclusive_under_concurrent_acquire(
        self, authority_factory: AuthorityFactory
    ) -> None:
        handles = [await authority_factory() for _ in range(4)]
        owners = [f"r{i}" for i in range(8)]
        for key in ("k1", "k2", "k3"):
            got = await asyncio.gather(
                *(handles[i % len(handles)].acquire(key, o, LONG) for i, o in enumerate(owners))
            )
            winners = [g for g in got if g is not None]
            assert len(winners) == 1, got
            assert winners[0].epoch == 1
            assert await handles[0].holder(key) == winners[0]

    async def test_concurrent_acquire_after_release_one_winner_next_epoch(
        self, authority_factory: AuthorityFactory
    ) -> None:
        handles = [await authority_factory() for _ in range(4)]
        first = await handles[0].acquire("k", "r0", LONG)
        assert first is not None
        assert await handles[0].release(first)
        got = await asyncio.gather(
            *(handles[i % 4].acquire("k", f"r{i}", LONG) for i in range(1, 9))
        )
        winners = [g for g in got if g is not None]
        assert len(winners) == 1
        assert winners[0].epoch == 2

    async def test_takeover_after_ttl_with_next_epoch(
        self, auth: LeaseAuthority, wait_past: WaitPast, short_ttl: float
    ) -> None:
        old = await auth.acquire("a1", "r1", short_ttl)
        assert old is not None
        assert await auth.acquire("a1", "r2", LONG) is None  # still live
        await self.expire(auth, wait_past, old)
        assert await auth.holder("a1") is None
        assert await auth.leases() == []
        new = await auth.acquire("a1", "r2", LONG)
        assert new is not None
        assert (new.owner, new.epoch) == ("r2", old.epoch + 1)
        assert await auth.holder("a1") == new

    async def test_paused_old_owner_cannot_renew_or_release_after_takeover(
        self, authority_factory: AuthorityFactory, wait_past: WaitPast, short_ttl: float
    ) -> None:
        a, b = await authority_factory(), await authority_factory()
        old = await a.acquire("a1", "r1", short_ttl)
        assert old is not None
        await self.expire(a, wait_past, old)
        new = await b.acquire("a1", "r2", LONG)
        assert new is not None and new.epoch == old.epoch + 1
        assert await a.renew(old) is None
        assert await a.renew(old, LONG) is None
        assert await a.renew_many([old]) == [None]
        assert await a.release(old) is False
        assert await a.holder("a1") == new
        # Nor does the old owner get it back while the new one is live.
        assert await a.acquire("a1", "r1", LONG) is None

    async def test_same_owner_after_own_expiry_gets_next_epoch(
        self, auth: LeaseAuthority, wait_past: WaitPast, short_ttl: float
    ) -> None:
        old = await auth.acquire("a1", "r1", short_ttl)
        assert old is not None
        await self.expire(auth, wait_past, old)
        again = await auth.acquire("a1", "r1", LONG)
        assert again is not None and again.epoch == old.epoch + 1
        assert await auth.renew(old) is None  # the old epoch is over

    # -- renew ---------------------------------------------------------------------------

    async def test_renew_extends_same_epoch(
        self, auth: LeaseAuthority, wait_past: WaitPast
    ) -> None:
        lease = await auth.acquire("a1", "r1", LONG)
        assert lease is not None
        await wait_past(await auth.now())  # the clock moves on a little
        renewed = await auth.renew(lease)
        assert renewed is not None
        assert (renewed.key, renewed.owner, renewed.epoch) == ("a1", "r1", lease.epoch)
        assert renewed.expires_at > lease.expires_at
        assert await auth.holder("a1") == renewed
        # A renewal may change the TTL; the lease object before it still renews (same epoch).
        longer = await auth.renew(lease, LONG * 2)
        assert longer is not None and longer.ttl == LONG * 2
        assert longer.expires_at > renewed.expires_at

    async def test_renew_after_expiry_fails_even_if_nobody_took_it(
        self, auth: LeaseAuthority, wait_past: WaitPast, short_ttl: float
    ) -> None:
        lease = await auth.acquire("a1", "r1", short_ttl)
        assert lease is not None
        await self.expire(auth, wait_past, lease)
        assert await auth.renew(lease) is None
        assert await auth.holder("a1") is None

    async def test_renew_with_wrong_owner_or_epoch_fails(self, auth: LeaseAuthority) -> None:
        lease = await auth.acquire("a1", "r1", LONG)
        assert lease is not None
        forged = Lease("a1", "r2", lease.epoch, lease.expires_at, lease.ttl)
        stale = Lease("a1", "r1", lease.epoch + 1, lease.expires_at, lease.ttl)
        missing = Lease("nope", "r1", 1, lease.expires_at, lease.ttl)
        assert await auth.renew(forged) is None
        assert await auth.renew(stale) is None
        assert await auth.renew(missing) is None
        assert await auth.holder("a1") == lease

    async def test_renew_ttl_must_be_positive(self, auth: LeaseAuthority) -> None:
        with pytest.raises(ValueError):
            await auth.acquire("a1", "r1", 0)
        with pytest.raises(ValueError):
            await auth.acquire("a1", "r1", -1.0)
        lease = await auth.acquire("a1", "r1", LONG)
        assert lease is not None
        with pytest.raises(ValueError):
            await auth.renew(lease, 0.0)

    async def test_renew_many_in_order_each_on_its_own(
        self, auth: LeaseAuthority, wait_past: WaitPast, short_ttl: float
    ) -> None:
        assert await auth.renew_many([]) == []
        a = await auth.acquire("a", "r1", LONG)
        b = await auth.acquire("b", "r1", short_ttl)
        c = await auth.acquire("c", "r2", LONG)
        d = await auth.acquire("d", "r1", LONG)
        assert a and b and c and d
        await self.expire(auth, wait_past, b)
        assert await auth.release(d)
        forged = Lease("c", "r1", c.epoch, c.expires_at, c.ttl)
        got = await auth.renew_many([d, forged, a, b])
        assert got[0] is None and got[1] is None and got[3] is None
        assert got[2] is not None and (got[2].key, got[2].epoch) == ("a", a.epoch)
        assert got[2].expires_at >= a.expires_at
        assert await auth.holder("c") == c

    # -- release -------------------------------------------------------------------------

    async def test_release_frees_and_epochs_never_go_back(self, auth: LeaseAuthority) -> None:
        lease = await auth.acquire("a1", "r1", LONG)
        assert lease is not None
        assert await auth.release(lease) is True
        assert await auth.holder("a1") is None
        assert await auth.leases() == []
        assert await auth.release(lease) is False  # idempotent
        assert await auth.renew(lease) is None
        again = await auth.acquire("a1", "r1", LONG)
        assert again is not None and again.epoch == lease.epoch + 1
        assert await auth.release(lease) is False  # an old epoch releases nothing
        assert await auth.holder("a1") == again

    async def test_release_by_another_owner_changes_nothing(self, auth: LeaseAuthority) -> None:
        lease = await auth.acquire("a1", "r1", LONG)
        assert lease is not None
        forged = Lease("a1", "r2", lease.epoch, lease.expires_at, lease.ttl)
        assert await auth.release(forged) is False
        assert await auth.holder("a1") == lease

    async def test_epochs_strictly_increase_over_many_handovers(
        self, auth: LeaseAuthority, wait_past: WaitPast, short_ttl: float
    ) -> None:
        epochs: list[int] = []
        for i in range(6):
            owner = f"r{i % 3}"
            lease = await auth.acquire("k", owner, short_ttl if i % 2 else LONG)
            assert lease is not None, i
            epochs.append(lease.epoch)
            if i % 2:
                await self.expire(auth, wait_past, lease)  # lapses
            else:
                assert await auth.release(lease)
        assert epochs == list(range(1, 7))

    # -- listing, keys, handles ----------------------------------------------------------

    async def test_keys_are_independent_and_listed_by_key(
        self, auth: LeaseAuthority, wait_past: WaitPast, short_ttl: float
    ) -> None:
        b = await auth.acquire("repo:ws", "r2", LONG)
        a = await auth.acquire("agent-1", "r1", LONG)
        gone = await auth.acquire("agent-2", "r1", short_ttl)
        assert a and b and gone
        assert a.epoch == b.epoch == gone.epoch == 1
        await self.expire(auth, wait_past, gone)
        assert await auth.leases() == [a, b]
        assert await auth.holder("agent-2") is None
        assert await auth.holder("unknown") is None

    async def test_holders_of_many_keys_live_only(
        self, auth: LeaseAuthority, wait_past: WaitPast, short_ttl: float
    ) -> None:
        a = await auth.acquire("agent-1", "r1", LONG)
        b = await auth.acquire("agent-2", "r2", LONG)
        gone = await auth.acquire("agent-3", "r1", short_ttl)
        released = await auth.acquire("agent-4", "r2", LONG)
        assert a and b and gone and released
        assert await auth.release(released)
        await self.expire(auth, wait_past, gone)
        keys = ["agent-2", "agent-1", "agent-3", "agent-4", "unknown", "agent-1"]
        assert await auth.holders(keys) == {"agent-1": a, "agent-2": b}
        assert await auth.holders([]) == {}
        assert await auth.holders(["unknown"]) == {}

    async def test_handles_share_one_authority(self, authority_factory: AuthorityFactory) -> None:
        a, b = await authority_factory(), await authority_factory()
        lease = await a.acquire("a1", "r1", LONG)
        assert lease is not None
        assert await b.holder("a1") == lease
        assert await b.acquire("a1", "r2", LONG) is None
        renewed = await b.renew(lease)  # whoever calls, the lease is r1's
        assert renewed is not None and renewed.epoch == lease.epoch
        assert await b.release(lease)
        again = await a.acquire("a1", "r2", LONG)
        assert again is not None and again.epoch == 2

    async def test_clock_moves_forward(self, auth: LeaseAuthority, wait_past: WaitPast) -> None:
        t0 = await auth.now()
        await wait_past(t0)
        assert await auth.now() > t0
