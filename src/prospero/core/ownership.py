"""The Ownership seam: which replica writes a stream / drives an agent.

Keys (prospero-surface.md §4.7): an agent id (the one replica that attaches to or drives that
agent and writes what its driver produces) and `repo:<workspace>` (the one replica that writes
the workspace's poll-derived lifecycle events, `LIFECYCLE_KINDS`, whichever stream they go to).

- `SelfOwnsAll` (standalone): owns everything, fences nothing.
- `LeasedOwnership` (clustered): leases from a `LeaseAuthority` (`core/leases.py`; PostgreSQL's
  `leases` table on the database clock) kept renewed by a `LeaseKeeper`. `fence(key)` is the
  write guard the emitter attaches to an append (`store.base.Fence`: owner + epoch, checked in
  the append's transaction), so a replica that lost a lease — paused past its TTL, partitioned —
  writes nothing under it after the takeover, even if it has not noticed yet.

`lease_key_for` says which lease an event is written under (None: unfenced).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from prospero.core.leases import Lease as HeldLease
from prospero.core.leases import LeaseKeeper
from prospero.core.store.base import Fence

# Poll-derived lifecycle events: written by the `repo:<workspace>` lease holder only.
LIFECYCLE_KINDS = frozenset({"agent_discovered", "status_changed", "agent_gone", "repo_health"})
# Written by whichever replica served the request that caused them (a spawn, a decision
# answered through its API): not fenced; `UNIQUE (stream_key, seq)` orders them with the rest.
UNFENCED_KINDS = frozenset(
    {"agent_spawned", "decision_pending", "decision_resolved", "store_persist_failed"}
)


def workspace_key(workspace: str) -> str:
    return f"repo:{workspace}"


def lease_key_for(repo: str, agent_id: str, kind: str) -> str | None:
    """The lease an event of this kind is written under, or None when it is not fenced."""
    if kind in UNFENCED_KINDS:
        return None
    if kind in LIFECYCLE_KINDS or not agent_id:
        return workspace_key(repo)
    return agent_id


@dataclass(frozen=True)
class Lease:
    key: str
    epoch: int


@runtime_checkable
class Ownership(Protocol):
    # Whether other writers share what this one owns: False standalone (this process wrote
    # everything, so there is nothing to rebase on or to check against another writer).
    shared: bool

    async def try_acquire(self, key: str) -> Lease | None: ...

    async def release(self, key: str) -> None: ...

    def owns(self, key: str) -> bool: ...


class FencingOwnership(Ownership, Protocol):
    """An Ownership whose writes are guarded: `fence(key)` for an append made under `key`."""

    replica_id: str

    def fence(self, key: str) -> Fence: ...


class SelfOwnsAll:
    shared = False

    async def try_acquire(self, key: str) -> Lease | None:
        return Lease(key, 1)

    async def release(self, key: str) -> None:
        return None

    def owns(self, key: str) -> bool:
        return True


class LeasedOwnership:
    """Ownership under leases kept by `keeper` (its owner is this replica's id)."""

    shared = True

    def __init__(self, keeper: LeaseKeeper) -> None:
        self.keeper = keeper
        self.replica_id = keeper.owner
        self._on_lost: list[Callable[[str], None]] = []
        # Key -> until when (keeper clock) this replica stands back from a lease it lost.
        self._standing_back: dict[str, float] = {}
        previous = keeper.on_lost

        def lost(lease: HeldLease) -> None:
            self._standing_back[lease.key] = keeper.clock() + keeper.ttl
            if previous is not None:
                previous(lease)
            for cb in list(self._on_lost):
                cb(lease.key)

        keeper.on_lost = lost

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call `callback(key)` when a lease this replica held is lost (refused or expired)."""
        self._on_lost.append(callback)

    async def try_acquire(self, key: str) -> Lease | None:
        """Take (or keep) the lease on `key`; None while another replica holds it — and for
        one TTL after this replica lost it: a replica whose lease ran out under it (paused,
        partitioned, its database link failing) is the suspect one, so a healthy peer gets
        the first chance at the key. Without a peer the key is taken back after that TTL."""
        until = self._standing_back.get(key)
        if until is not None:
            if self.keeper.clock() < until:
                return None
            del self._standing_back[key]
        lease = await self.keeper.acquire(key)
        return None if lease is None else Lease(key, lease.epoch)

    async def release(self, key: str) -> None:
        await self.keeper.release(key)

    def owns(self, key: str) -> bool:
        return self.keeper.owns(key)

    def fence(self, key: str) -> Fence:
        """The guard for a write under `key`: our epoch while we hold it; epoch 0 (which the
        store never finds held) when we do not, so the write is refused, not made."""
        lease = self.keeper.lease(key)
        return Fence(key, self.replica_id, lease.epoch if lease is not None else 0)

    async def close(self) -> None:
        """Release every lease (a clean shutdown hands over at once, not after the TTL)."""
        await self.keeper.close(release=True)
