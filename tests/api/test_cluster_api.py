"""`GET /api/cluster` (api/routes_cluster.py): a standalone prosperod, a cluster view from a lease
authority on a fake clock (exact ages and expiries), and replicas sharing a real PostgreSQL
database that see each other come and go."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prospero.api.auth import required_scope
from prospero.core.cluster import ClusterInfo, replica_key
from prospero.core.leases import MemoryLeases
from prospero.core.tokens import Scope, TokenTable, add_token
from tests.api.conftest import Stack, StackFactory, envelope
from tests.support import wait_until


async def cluster(stack: Stack) -> dict[str, Any]:
    r = await stack.client.get("/api/cluster")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    body: dict[str, Any] = r.json()
    return body


async def test_standalone_is_this_replica_alone_without_leases(make_stack: StackFactory) -> None:
    stack = await make_stack(replica_id="solo-1")
    assert await cluster(stack) == {
        "mode": "standalone",
        "replica_id": "solo-1",
        "store": "sqlite",
        "lease_ttl_s": None,
        "heartbeat_s": None,
        "replicas": [{"replica_id": "solo-1", "heartbeat_age_s": 0.0, "leases": 0, "this": True}],
        "leases": [],
    }
    # HEAD is answered wherever GET is
    r = await stack.client.head("/api/cluster")
    assert r.status_code == 200 and r.content == b""


async def test_default_replica_id_is_reported(stack: Stack) -> None:
    body = await cluster(stack)
    assert body["replica_id"] == stack.runtime.cluster.replica_id
    assert body["replica_id"]
    assert [r["replica_id"] for r in body["replicas"]] == [body["replica_id"]]


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def test_clustered_view_from_the_authority(stack: Stack) -> None:
    """Ages and expiries come from the authority's clock; counts leave presence leases out;
    this replica first, the others by id; leases by key; expired leases gone."""
    clock = FakeClock()
    auth = MemoryLeases(clock)
    stack.runtime.cluster = ClusterInfo("clustered", "b-me", "postgres", 10.0, 3.0, auth)
    assert await auth.acquire(replica_key("b-me"), "b-me", 10.0)
    assert await auth.acquire(replica_key("a-other"), "a-other", 10.0)
    assert await auth.acquire(replica_key("c-gone"), "c-gone", 2.0)
    assert await auth.acquire("agent-1", "a-other", 10.0)
    assert await auth.acquire("repo:ws", "b-me", 10.0)
    clock.t += 1.5
    assert await auth.acquire("agent-2", "b-me", 10.0)
    own = await auth.holder(replica_key("b-me"))
    assert own is not None and await auth.renew(own)  # b-me's heartbeat, now
    clock.t += 1.0  # c-gone (TTL 2) expired 0.5 s ago

    body = await cluster(stack)
    assert body["mode"] == "clustered"
    assert body["replica_id"] == "b-me" and body["store"] == "postgres"
    assert body["lease_ttl_s"] == 10.0 and body["heartbeat_s"] == 3.0
    assert body["replicas"] == [
        {"replica_id": "b-me", "heartbeat_age_s": 1.0, "leases": 2, "this": True},
        {"replica_id": "a-other", "heartbeat_age_s": 2.5, "leases": 1, "this": False},
    ]
    assert body["leases"] == [
        {"key": "agent-1", "owner": "a-other", "epoch": 1, "expires_in_s": 7.5},
        {"key": "agent-2", "owner": "b-me", "epoch": 1, "expires_in_s": 9.0},
        {"key": replica_key("a-other"), "owner": "a-other", "epoch": 1, "expires_in_s": 7.5},
        {"key": replica_key("b-me"), "owner": "b-me", "epoch": 1, "expires_in_s": 9.0},
        {"key": "repo:ws", "owner": "b-me", "epoch": 1, "expires_in_s": 7.5},
    ]

    # a takeover: agent-1 and repo:ws expire (agent-2 has 1 s left), b-me takes agent-1 with
    # the next epoch
    clock.t += 8.0
    assert await auth.acquire(replica_key("b-me"), "b-me", 10.0)
    assert await auth.acquire("agent-1", "b-me", 10.0)
    body = await cluster(stack)
    assert body["replicas"] == [
        {"replica_id": "b-me", "heartbeat_age_s": 0.0, "leases": 2, "this": True}
    ]
    assert body["leases"] == [
        {"key": "agent-1", "owner": "b-me", "epoch": 2, "expires_in_s": 10.0},
        {"key": "agent-2", "owner": "b-me", "epoch": 1, "expires_in_s": 1.0},
        {"key": replica_key("b-me"), "owner": "b-me", "epoch": 1, "expires_in_s": 10.0},
    ]


async def test_this_replica_is_listed_before_its_first_heartbeat(stack: Stack) -> None:
    auth = MemoryLeases(FakeClock())
    stack.runtime.cluster = ClusterInfo("clustered", "me", "postgres", 5.0, 1.0, auth)
    assert await auth.acquire(replica_key("other"), "other", 5.0)
    assert await auth.acquire("agent-9", "me", 5.0)
    body = await cluster(stack)
    assert body["replicas"] == [
        {"replica_id": "me", "heartbeat_age_s": None, "leases": 1, "this": True},
        {"replica_id": "other", "heartbeat_age_s": 0.0, "leases": 0, "this": False},
    ]


async def test_not_ready_without_cluster_info(stack: Stack) -> None:
    stack.runtime.cluster = None  # type: ignore[assignment]
    envelope(await stack.client.get("/api/cluster"), 503, "unreachable")


async def test_read_scope_suffices(make_stack: StackFactory, tmp_path: Path) -> None:
    assert required_scope("GET", "/api/cluster") is Scope.read
    assert required_scope("HEAD", "/api/cluster") is Scope.read
    path = tmp_path / "tokens"
    read = add_token(path, "viewer", Scope.read)
    stack = await make_stack(tokens=TokenTable(path), workspace=False)
    envelope(await stack.client.get("/api/cluster"), 401, "unauthorized")
    r = await stack.client.get("/api/cluster", headers={"Authorization": f"Bearer {read}"})
    assert r.status_code == 200 and r.json()["mode"] == "standalone"
    envelope(
        await stack.client.post("/api/cluster", headers={"Authorization": f"Bearer {read}"}),
        403,
        "forbidden",
    )


async def test_openapi_documents_the_route(stack: Stack) -> None:
    doc = (await stack.client.get("/openapi.json")).json()
    op = doc["paths"]["/api/cluster"]["get"]
    assert set(doc["paths"]["/api/cluster"]) == {"get"}
    assert op["operationId"] == "getCluster"
    assert op["x-prospero-scope"] == "read"
    ok = op["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok["$ref"].endswith("/ClusterView")
    assert {"401", "403", "503"} <= set(op["responses"])
    schemas = doc["components"]["schemas"]
    assert set(schemas["ClusterView"]["properties"]) == {
        "mode",
        "replica_id",
        "store",
        "lease_ttl_s",
        "heartbeat_s",
        "replicas",
        "leases",
    }
    assert set(schemas["ClusterReplica"]["properties"]) == {
        "replica_id",
        "heartbeat_age_s",
        "leases",
        "this",
    }
    assert set(schemas["ClusterLease"]["properties"]) == {"key", "owner", "epoch", "expires_in_s"}


# ------------------------------------------------------------------------------ PostgreSQL


async def test_replicas_on_postgres_see_each_other(make_stack: StackFactory, pg_dsn: str) -> None:
    common: dict[str, Any] = {"database_url": pg_dsn, "lease_ttl": 6.0, "heartbeat_interval": 1.0}
    one = await make_stack(replica_id="r1", **common)
    body = await cluster(one)
    assert body["mode"] == "clustered" and body["store"] == "postgres"
    assert body["replica_id"] == "r1"
    assert body["lease_ttl_s"] == 6.0 and body["heartbeat_s"] == 1.0
    assert body["replicas"][0]["replica_id"] == "r1" and body["replicas"][0]["this"]
    assert 0.0 <= body["replicas"][0]["heartbeat_age_s"] <= 6.0
    presence = [x for x in body["leases"] if x["key"] == replica_key("r1")]
    assert len(presence) == 1 and presence[0]["owner"] == "r1"
    assert 0.0 <= presence[0]["expires_in_s"] <= 6.0

    two = await make_stack(replica_id="r2", workspace=False, **common)

    async def both_seen() -> bool:
        ids = [r["replica_id"] for r in (await cluster(one))["replicas"]]
        return ids == ["r1", "r2"]

    await wait_until(both_seen, 20.0, interval=0.05, what="r1 sees r2")
    seen_by_two = await cluster(two)
    assert [(r["replica_id"], r["this"]) for r in seen_by_two["replicas"]] == [
        ("r2", True),
        ("r1", False),
    ]
    for view in (await cluster(one), seen_by_two):
        leases = view["leases"]
        assert [x["key"] for x in leases] == sorted(x["key"] for x in leases)
        for rep in view["replicas"]:
            held = [
                x
                for x in leases
                if x["owner"] == rep["replica_id"] and not x["key"].startswith("replica:")
            ]
            # counted from the same authority, possibly a renewal apart: at most one off
            assert abs(rep["leases"] - len(held)) <= 1, (rep, leases)

    # r2 stops: it hands its leases over at once, r1 no longer lists it
    await two.client.aclose()
    await two.server.stop()
    await two.runtime.stop()

    async def alone() -> bool:
        view = await cluster(one)
        return [r["replica_id"] for r in view["replicas"]] == ["r1"] and all(
            x["owner"] == "r1" for x in view["leases"]
        )

    await wait_until(alone, 20.0, interval=0.05, what="r2 gone from r1's view")
