"""The `owner` of the agents the API lists (`/api/fleet`, `/api/agents/{id}`,
`/api/workspaces/{ws}/agents`): the replica holding the agent's lease now, read from the lease
authority once per response; null when nobody holds it and always standalone. Two replicas on a
real PostgreSQL report the same owner, and the new one after a takeover."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prospero.core.cluster import ClusterInfo
from prospero.core.errors import StoreError
from prospero.core.leases import Lease, MemoryLeases
from tests.api.conftest import Stack, StackFactory
from tests.api.test_cluster_takeover import crash
from tests.support import wait_until

TTL = 1.0
BEAT = 0.25


async def owners_seen(stack: Stack, agent_id: str) -> list[Any]:
    """The agent's `owner` in each of the three listings, as `stack` answers them."""
    fleet = (await stack.client.get("/api/fleet")).json()
    in_fleet = [a for ws in fleet["workspaces"] for a in ws["agents"] if a["id"] == agent_id]
    r = await stack.client.get(f"/api/agents/{agent_id}")
    assert r.status_code == 200, r.text
    listed = [
        a
        for a in (await stack.client.get("/api/workspaces/ws/agents")).json()
        if a["id"] == agent_id
    ]
    assert len(in_fleet) == 1 and len(listed) == 1
    for a in (in_fleet[0], r.json(), listed[0]):
        assert "owner" in a
    return [in_fleet[0]["owner"], r.json()["owner"], listed[0]["owner"]]


async def holder(stack: Stack, key: str) -> str | None:
    authority = stack.runtime.cluster.authority
    assert authority is not None
    lease = await authority.holder(key)
    return lease.owner if lease is not None else None


async def test_standalone_owner_is_null(make_stack: StackFactory) -> None:
    stack = await make_stack(replica_id="solo")
    agent = await stack.spawn("interactive", interactive=True)
    await stack.wait_status(agent, "running", "idle")
    assert await owners_seen(stack, agent) == [None, None, None]


async def test_owner_is_the_lease_holder_on_every_replica(
    make_stack: StackFactory, pg_dsn: str
) -> None:
    common: dict[str, Any] = {"database_url": pg_dsn, "lease_ttl": TTL, "heartbeat_interval": BEAT}
    a = await make_stack(replica_id="a", **common)
    b = await make_stack(replica_id="b", workspace=False, **common)  # the same registry
    agent = await a.spawn("interactive", interactive=True)

    async def driven_and_listed() -> bool:
        if await holder(a, agent) is None:
            return False
        codes = [(await s.client.get(f"/api/agents/{agent}")).status_code for s in (a, b)]
        return codes == [200, 200]

    await wait_until(driven_and_listed, 20.0, interval=0.05, what="driven, listed by both")
    owner = await holder(a, agent)
    assert owner in ("a", "b")
    for s in (a, b):
        assert await owners_seen(s, agent) == [owner] * 3, s.runtime.cluster.replica_id

    # The owner dies without handing over: after the TTL the survivor drives the agent, and
    # says so.
    driver, survivor = (a, b) if owner == "a" else (b, a)
    await crash(driver)
    me = survivor.runtime.cluster.replica_id

    async def taken_over() -> bool:
        return await owners_seen(survivor, agent) == [me] * 3

    await wait_until(taken_over, 5 * TTL + 5.0, interval=0.05, what="owner after takeover")
    assert await holder(survivor, agent) == me


class CountingLeases(MemoryLeases):
    def __init__(self, clock: Any) -> None:
        super().__init__(clock)
        self.holders_calls = 0
        self.fail = False

    async def holders(self, keys: Sequence[str]) -> dict[str, Lease]:
        self.holders_calls += 1
        if self.fail:
            raise StoreError("leases: the database is away")
        return await super().holders(keys)


async def test_one_authority_query_per_response_and_a_failing_one_leaves_null(
    stack: Stack,
) -> None:
    """Three agents, one `holders` call per listing; expired leases own nothing; when the
    authority fails, the listings still answer, with null owners."""
    ids = [await stack.spawn("interactive", interactive=True) for _ in range(3)]
    for agent in ids:
        await stack.wait_status(agent, "running", "idle")
    t = [1000.0]
    auth = CountingLeases(lambda: t[0])
    stack.runtime.cluster = ClusterInfo("clustered", "me", "postgres", 10.0, 3.0, auth)
    assert await auth.acquire(ids[0], "r-other", 10.0)
    assert await auth.acquire(ids[1], "me", 2.0)
    t[0] += 5.0  # ids[1]'s lease expired; ids[2] never had one

    fleet = (await stack.client.get("/api/fleet")).json()
    assert auth.holders_calls == 1
    got = {a["id"]: a["owner"] for ws in fleet["workspaces"] for a in ws["agents"]}
    assert got == {ids[0]: "r-other", ids[1]: None, ids[2]: None}
    listed = (await stack.client.get("/api/workspaces/ws/agents")).json()
    assert auth.holders_calls == 2
    assert {a["id"]: a["owner"] for a in listed} == got
    assert (await stack.client.get(f"/api/agents/{ids[0]}")).json()["owner"] == "r-other"
    assert auth.holders_calls == 3

    auth.fail = True
    r = await stack.client.get("/api/fleet")
    assert r.status_code == 200
    assert all(a["owner"] is None for ws in r.json()["workspaces"] for a in ws["agents"])
    r = await stack.client.get(f"/api/agents/{ids[0]}")
    assert r.status_code == 200 and r.json()["owner"] is None


async def test_openapi_documents_owner(stack: Stack) -> None:
    doc = (await stack.client.get("/openapi.json")).json()
    prop = doc["components"]["schemas"]["Agent"]["properties"]["owner"]
    assert {"type": "null"} in prop["anyOf"] and {"type": "string"} in prop["anyOf"]
    assert "owner" not in doc["components"]["schemas"]["Agent"].get("required", [])
