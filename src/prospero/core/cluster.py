"""What a prosperod knows of its cluster: its replica id, the lease settings, the replicas alive
and who holds which lease (`GET /api/cluster`, `prospero cluster`), and which replica drives
each agent (the `owner` of the agents the API lists).

A replica announces itself by holding the lease `replica:<id>` for as long as it runs (its
keeper renews it with the others every heartbeat): the replicas alive are the holders of live
`replica:*` leases, each one's heartbeat age is how long ago it last renewed (TTL minus what
is left). Standalone, the only replica is this one and there are no leases.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from prospero.core.leases import Lease, LeaseAuthority

REPLICA_PREFIX = "replica:"


def replica_key(replica_id: str) -> str:
    return REPLICA_PREFIX + replica_id


def default_replica_id() -> str:
    """`$HOSTNAME` (a pod's name under Kubernetes), else the host name, else prosperod-local."""
    import os

    return os.environ.get("HOSTNAME") or socket.gethostname() or "prosperod-local"


def _shown(lease: Lease) -> Lease:
    """A presence lease is held by its process (`<id>@<boot nonce>`, so two processes with one
    id cannot both hold it): shown as held by the replica id."""
    if lease.key.startswith(REPLICA_PREFIX):
        rid = lease.key[len(REPLICA_PREFIX) :]
        if lease.owner.startswith(rid + "@"):
            return dataclasses.replace(lease, owner=rid)
    return lease


@dataclass(frozen=True)
class ReplicaInfo:
    replica_id: str
    heartbeat_age_s: float  # seconds since its last renewal (authority clock)
    leases: int  # leases it holds, its own `replica:` lease not counted
    this: bool


@dataclass
class ClusterInfo:
    mode: Literal["standalone", "clustered"]
    replica_id: str
    store: str  # "sqlite" | "postgres"
    lease_ttl: float | None = None
    heartbeat: float | None = None
    authority: LeaseAuthority | None = None

    async def now(self) -> float:
        if self.authority is None:
            import time

            return time.time()
        return await self.authority.now()

    async def leases(self) -> list[Lease]:
        """Every live lease (replica presence leases included), by key."""
        if self.authority is None:
            return []
        now = await self.authority.now()
        return [
            _shown(le) for le in await self.authority.leases() if le.owner and le.expires_at > now
        ]

    async def owners(self, agent_ids: Sequence[str]) -> dict[str, str]:
        """Which replica drives each of `agent_ids` now: the holder of its live lease (keyed by
        the agent id), on the authority's clock. Agents nobody drives are left out; standalone,
        nothing is (no leases; the one prosperod drives what it drives). One authority round
        trip, whatever the number of agents."""
        if self.authority is None or not agent_ids:
            return {}
        held = await self.authority.holders(agent_ids)
        return {key: le.owner for key, le in held.items() if le.owner}

    async def replicas(self) -> list[ReplicaInfo]:
        if self.authority is None:
            return [ReplicaInfo(self.replica_id, 0.0, 0, True)]
        now = await self.authority.now()
        live = [le for le in await self.authority.leases() if le.owner and le.expires_at > now]
        counts: dict[str, int] = {}
        for le in live:
            if not le.key.startswith(REPLICA_PREFIX):
                counts[le.owner] = counts.get(le.owner, 0) + 1
        out = []
        for le in live:
            if le.key.startswith(REPLICA_PREFIX):
                rid = le.key[len(REPLICA_PREFIX) :]
                age = max(0.0, le.ttl - (le.expires_at - now))
                out.append(
                    ReplicaInfo(rid, round(age, 3), counts.get(rid, 0), rid == self.replica_id)
                )
        return sorted(out, key=lambda r: r.replica_id)
