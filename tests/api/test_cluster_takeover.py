"""Two prosperod replicas on one PostgreSQL database (whole HTTP stacks, in process, against one
fake caliband): any replica serves any agent's history and live stream; one replica drives an
agent, under its lease; when that replica dies without handing over, the other takes the agent
over after the lease TTL and continues its stream from the stored cursor, with no event lost or
written twice."""

from __future__ import annotations

import asyncio
from typing import Any

from prospero.core.cluster import replica_key
from tests.api.conftest import SseReader, Stack, StackFactory, sse_headers
from tests.cli.conftest import Cli
from tests.support import wait_until

TTL = 1.0
BEAT = 0.25


async def holder(stack: Stack, key: str) -> str | None:
    authority = stack.runtime.cluster.authority
    assert authority is not None
    lease = await authority.holder(key)
    now = await authority.now()
    return lease.owner if lease is not None and lease.expires_at > now else None


async def crash(stack: Stack) -> None:
    """Die without handing anything over: drivers stop, leases are left to expire."""
    runtime = stack.runtime
    assert runtime.manager is not None and runtime.ownership is not None
    await runtime.ownership.keeper.close(release=False)  # no more renewals, no release
    if runtime.presence is not None:  # the process's presence lease too
        await runtime.presence.close(release=False)
    if runtime.scheduler is not None:  # nor does it fire automations any more
        await runtime.scheduler.stop(release=False)
    if runtime.relay is not None:  # calls relayed to it go unanswered
        await runtime.relay.close()
    await runtime.manager.stop()
    await stack.server.stop()


async def test_a_dead_replicas_agent_is_taken_over_and_continues_without_loss_or_duplicate(
    make_stack: StackFactory, pg_dsn: str
) -> None:
    common: dict[str, Any] = {
        "database_url": pg_dsn,
        "lease_ttl": TTL,
        "heartbeat_interval": BEAT,
    }
    a = await make_stack(replica_id="a", **common)
    b = await make_stack(replica_id="b", workspace=False, **common)  # the same registry
    agent = await a.spawn("interactive", interactive=True)

    async def first_reply_everywhere() -> bool:
        for s in (a, b):
            texts = [e["kind"].get("chunk", "") for e in await s.history(agent)]
            if "What next?" not in "".join(texts):
                return False
        return True

    await wait_until(first_reply_everywhere, 20.0, interval=0.05, what="history on both")
    owner = await holder(a, agent)
    assert owner in ("a", "b")  # exactly one replica drives it (whichever took it first)
    driver, other = (a, b) if owner == "a" else (b, a)
    assert await holder(a, "repo:ws") in ("a", "b")

    # The other replica streams what the driving one writes.
    async with other.client.stream(
        "GET", f"/api/agents/{agent}/stream", headers=sse_headers()
    ) as resp:
        assert resp.status_code == 200
        reader = SseReader(resp)
        await crash(driver)
        # Takeover within the TTL plus a poll or two.
        me = other.runtime.cluster.replica_id

        async def taken_over() -> bool:
            return await holder(other, agent) == me

        await wait_until(taken_over, 5 * TTL + 5.0, interval=0.05, what="takeover")

        # The dead replica's presence lease was last renewed a little after its agent lease
        # (they renew on their own timers): it lapses within a TTL of the takeover.
        async def presence_gone() -> bool:
            return await holder(other, replica_key(driver.runtime.cluster.replica_id)) is None

        await wait_until(presence_gone, TTL + 2.0, interval=0.05, what="presence lapsed")
        # `prospero cluster` (the real CLI, over HTTP) shows the takeover: the agent's lease
        # under its new owner at epoch 2, the dead replica gone from the replicas alive.
        dead = driver.runtime.cluster.replica_id
        res = await asyncio.to_thread(Cli(other.url), "cluster")
        assert res.exit_code == 0, res.output
        rows = [line.split() for line in res.stdout.splitlines()]
        assert [agent, me, "2"] == next(r for r in rows if r and r[0] == agent)[:3]
        assert [me, "(this)"] in [r[:2] for r in rows]
        assert not any(r and r[0] == dead for r in rows)
        r = await other.client.post(f"/api/agents/{agent}/input", json={"text": "hello there"})
        assert r.status_code in (200, 202, 204), r.text
        r = await other.client.post(f"/api/agents/{agent}/end-input")
        assert r.status_code in (200, 202, 204), r.text
        live: list[dict[str, Any]] = []
        while (msg := await reader.next()) is not None:
            if msg.event is None:
                live.append(msg.json())
    events = await other.wait_finished(agent)
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))  # no hole, nothing twice
    text = "".join(e["kind"].get("chunk", "") for e in events)
    assert text.count("What next?") == 1  # the first turn, once: not re-read by the new owner
    assert "hello there" in text  # the echo, written by the new owner
    assert [e["kind"]["kind"] for e in events].count("agent_finished") == 1
    assert live == events[: len(live)] and live[-1]["kind"]["kind"] == "agent_finished"


async def test_a_replica_that_lost_an_agent_can_take_it_over_again(
    make_stack: StackFactory, pg_dsn: str
) -> None:
    """A drives the agent, loses its lease to B (expired under it: a pause), then B dies: A
    takes the agent back with a new driver that continues from what B stored, not the closed
    one it had."""
    common: dict[str, Any] = {"database_url": pg_dsn, "lease_ttl": TTL, "heartbeat_interval": BEAT}
    a = await make_stack(replica_id="a", **common)
    agent = await a.spawn("interactive", interactive=True)

    async def a_drives() -> bool:
        return await holder(a, agent) == "a"

    await wait_until(a_drives, 20.0, interval=0.05, what="a drives the agent")
    b = await make_stack(replica_id="b", workspace=False, **common)
    authority = a.runtime.cluster.authority
    assert authority is not None
    # A pause: a's lease on the agent runs out under it (renewals refused from now on).
    import asyncpg

    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute("UPDATE leases SET expires_at = now() WHERE key = $1", agent)
    finally:
        await conn.close()

    async def b_drives() -> bool:
        return await holder(b, agent) == "b"

    await wait_until(b_drives, 5 * TTL + 5.0, interval=0.05, what="b takes the agent")
    r = await b.client.post(f"/api/agents/{agent}/input", json={"text": "from b"})
    assert r.status_code == 202, r.text

    async def echoed(s: Stack, text: str) -> bool:
        return text in "".join(e["kind"].get("chunk", "") for e in await s.history(agent))

    await wait_until(lambda: echoed(a, "from b"), 20.0, interval=0.05, what="b's turn")
    await crash(b)
    await wait_until(a_drives, 5 * TTL + 5.0, interval=0.05, what="a takes it back")
    r = await a.client.post(f"/api/agents/{agent}/input", json={"text": "a again"})
    assert r.status_code == 202, r.text
    await wait_until(lambda: echoed(a, "a again"), 20.0, interval=0.05, what="a's new turn")
    r = await a.client.post(f"/api/agents/{agent}/end-input")
    assert r.status_code == 202, r.text
    events = await a.wait_finished(agent)
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))
    text = "".join(e["kind"].get("chunk", "") for e in events)
    assert text.count("from b") == 1 and text.count("a again") == 1
