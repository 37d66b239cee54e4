"""`GET /api/cluster`: how this prosperod runs and, when clustered, who else shares its database.

Built from the runtime's `cluster` (`prospero.core.cluster.ClusterInfo`): the mode, this
replica's id, the store backend, the lease TTL and heartbeat, the replicas the lease authority
knows (heartbeat age and live-lease count of each) and the live leases (owner, epoch, seconds to
expiry). Ages and expiries are on the authority's clock (the database's when clustered), so
they compare across replicas. A replica is present while it holds its `replica:<id>` lease (its
heartbeat); those presence leases are listed with the others but not counted in a replica's
`leases`. A standalone prosperod answers mode `standalone` with itself as the only replica and
no leases.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Annotated

from fastapi import APIRouter, Depends
from starlette.responses import Response

from prospero.api.deps import ApiState, NotReady, api_state
from prospero.api.responses import errors, json_response
from prospero.core.cluster import REPLICA_PREFIX, ClusterInfo
from prospero.core.errors import StoreError
from prospero.types.cluster import ClusterLease, ClusterReplica, ClusterView
from prospero.types.model import Agent

log = logging.getLogger(__name__)

router = APIRouter(tags=["cluster"])

State = Annotated[ApiState, Depends(api_state)]


def cluster_of(st: ApiState) -> ClusterInfo:
    cluster = getattr(st.runtime, "cluster", None)
    if not isinstance(cluster, ClusterInfo):
        raise NotReady()
    return cluster


async def fill_owners(st: ApiState, agents: Iterable[Agent]) -> None:
    """Set the `owner` of each agent view (fresh views, built for this response): the replica
    holding its lease now, null when none does. One lease-authority query for all of them;
    none standalone. A failing query leaves them null (logged): the fleet's own view does not
    depend on the lease table."""
    cluster = getattr(st.runtime, "cluster", None)
    if not isinstance(cluster, ClusterInfo) or cluster.authority is None:
        return
    views = list(agents)
    if not views:
        return
    try:
        owners = await cluster.owners([a.id for a in views])
    except StoreError as e:
        log.warning("agent owners unknown for this response: %s", e)
        return
    for a in views:
        a.owner = owners.get(a.id)


async def cluster_view(cluster: ClusterInfo) -> ClusterView:
    """The view of one request: replicas and leases as the authority reports them now."""
    leases = sorted(await cluster.leases(), key=lambda x: (x.key, x.epoch))
    now = await cluster.now() if leases else 0.0
    replicas = [
        ClusterReplica(
            replica_id=r.replica_id,
            heartbeat_age_s=max(0.0, round(r.heartbeat_age_s, 3)),
            leases=r.leases,
            this=r.this or r.replica_id == cluster.replica_id,
        )
        for r in await cluster.replicas()
    ]
    if not any(r.this for r in replicas):
        # Not (yet) in the authority's list, e.g. before its first heartbeat: it still answers.
        replicas.append(
            ClusterReplica(
                replica_id=cluster.replica_id,
                heartbeat_age_s=None,
                leases=sum(
                    1
                    for x in leases
                    if x.owner == cluster.replica_id and not x.key.startswith(REPLICA_PREFIX)
                ),
                this=True,
            )
        )
    replicas.sort(key=lambda r: (not r.this, r.replica_id))
    return ClusterView(
        mode="clustered" if cluster.mode == "clustered" else "standalone",
        replica_id=cluster.replica_id,
        store=cluster.store,
        lease_ttl_s=cluster.lease_ttl,
        heartbeat_s=cluster.heartbeat,
        replicas=replicas,
        leases=[
            ClusterLease(
                key=x.key,
                owner=x.owner,
                epoch=x.epoch,
                expires_in_s=max(0.0, round(x.expires_at - now, 3)),
            )
            for x in leases
        ],
    )


@router.get(
    "/api/cluster",
    operation_id="getCluster",
    response_model=ClusterView,
    responses=errors(503),
    summary="Cluster view: mode, this replica, the replicas and their leases",
    description=(
        "`mode`: `standalone` (one prosperod, its own store) or `clustered` (replicas sharing "
        "one PostgreSQL database under leases). `replicas`: every replica the lease authority "
        "knows, this one (`this: true`) first, with the age of its last heartbeat and how many "
        "live leases it holds. `leases`: the live leases by key (an agent id or "
        "`repo:<workspace>`), with owner, epoch (the fencing token) and seconds until expiry "
        "unless renewed (each replica's presence lease `replica:<id>` included; it is not "
        "counted in the replica's `leases`). Ages and expiries are on the authority's clock "
        "(the database clock "
        "when clustered). Standalone: this replica only, no leases, `lease_ttl_s` and "
        "`heartbeat_s` null."
    ),
)
async def get_cluster(st: State) -> Response:
    return json_response(await cluster_view(cluster_of(st)))
