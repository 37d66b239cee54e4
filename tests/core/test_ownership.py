"""LeasedOwnership over a LeaseKeeper (MemoryLeases, fake clock): a replica that lost a lease
stands back from that key for one TTL, so a healthy peer takes it first; alone, it takes the
key back after that TTL."""

from __future__ import annotations

from prospero.core.leases import Lease, MemoryLeases
from prospero.core.ownership import LeasedOwnership
from tests.conformance.lease_authority import FakeClock
from tests.core.test_leases import asleep_after, clock, fake_keeper, memory  # noqa: F401
from tests.support import wait_until


async def test_a_replica_that_lost_a_lease_stands_back_for_one_ttl(
    memory: MemoryLeases,  # noqa: F811
    clock: FakeClock,  # noqa: F811
) -> None:
    lost: list[Lease] = []
    keeper = fake_keeper(memory, clock, lost)  # ttl 3 s, heartbeat 1 s
    ownership = LeasedOwnership(keeper)
    seen: list[str] = []
    ownership.on_lost(seen.append)
    first = await ownership.try_acquire("a1")
    assert first is not None
    await asleep_after(keeper, clock, 0)
    # Its lease runs out under it (a pause): the next renewal is refused.
    held = await memory.holder("a1")
    assert held is not None and await memory.release(held)
    clock.advance(1.0)
    await asleep_after(keeper, clock, 1)
    assert seen == ["a1"] and not ownership.owns("a1")
    # The key is free, but this replica does not take it back within the TTL...
    assert await memory.holder("a1") is None
    assert await ownership.try_acquire("a1") is None
    # ...so a peer polling in that window gets it.
    peer = await memory.acquire("a1", "r2", 3.0)
    assert peer is not None
    # Releasing what it lost (the driver closing) does not cut the stand-back short.
    await ownership.release("a1")
    assert await memory.release(peer)
    assert await ownership.try_acquire("a1") is None
    # After one TTL, with no peer holding it, it comes back (a new epoch).
    clock.advance(3.0)
    again = await ownership.try_acquire("a1")
    assert again is not None and again.epoch > first.epoch
    assert ownership.owns("a1")
    # Other keys were never held back.
    assert await ownership.try_acquire("a2") is not None
    await wait_until(lambda: keeper.owns("a2"), 5, what="a2 held")
    await keeper.close()
