"""`GET /api/cluster` DTOs: how this prosperod runs (standalone, or one replica of a cluster
sharing a PostgreSQL database), the replicas the lease authority knows and the live leases.

Durations are seconds. `heartbeat_age_s` and `expires_in_s` are measured on the lease
authority's clock (the database clock when clustered), never against the client's or a replica's
local clock, so they compare across replicas.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

ClusterMode = Literal["standalone", "clustered"]


class ClusterReplica(BaseModel):
    replica_id: str = Field(description="The replica's id (its lease owner name).")
    heartbeat_age_s: float | None = Field(
        description="Seconds since the replica's last heartbeat (authority clock); 0 standalone, "
        "null when the authority does not list it yet."
    )
    leases: int = Field(
        ge=0, description="Live leases the replica holds (its `replica:<id>` one not counted)."
    )
    this: bool = Field(description="True for the replica that answered this request.")


class ClusterLease(BaseModel):
    key: str = Field(
        description="The leased key: an agent id, `repo:<workspace>`, or `replica:<id>` (a "
        "replica's presence)."
    )
    owner: str = Field(description="The replica holding it.")
    epoch: int = Field(ge=1, description="Fencing token: strictly increasing per key.")
    expires_in_s: float = Field(
        ge=0, description="Seconds until it expires unless renewed (authority clock)."
    )


class ClusterView(BaseModel):
    mode: ClusterMode
    replica_id: str = Field(description="The replica that answered.")
    store: str = Field(description="The store backend: `sqlite` or `postgres`.")
    lease_ttl_s: float | None = Field(description="Lease TTL; null when standalone.")
    heartbeat_s: float | None = Field(description="Lease renewal interval; null when standalone.")
    replicas: list[ClusterReplica] = Field(
        description="Every replica the authority knows, this one first, then by id."
    )
    leases: list[ClusterLease] = Field(description="Live leases, by key; empty when standalone.")
