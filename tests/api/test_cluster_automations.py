"""Automations in a cluster: two prosperod replicas on one PostgreSQL database fire each
schedule tick exactly once — one replica holds the `automations` lease, and the (automation,
tick) row is unique, so a lease handover at a tick boundary does not fire the tick again."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from prospero.core.automations.scheduler import LEASE_KEY
from tests.api.conftest import Stack, StackFactory
from tests.support import wait_until

pytestmark = pytest.mark.serial

TTL = 1.0
BEAT = 0.25
PAST = datetime(2000, 1, 1, tzinfo=UTC)


def clustered(replica: str, pg_dsn: str) -> dict[str, Any]:
    return {
        "replica_id": replica,
        "database_url": pg_dsn,
        "lease_ttl": TTL,
        "heartbeat_interval": BEAT,
        "automation_interval": 0.05,
    }


def set_clock(stacks: list[Stack], at: datetime) -> None:
    for s in stacks:
        assert s.runtime.scheduler is not None
        s.runtime.scheduler.clock = lambda: at


async def runs(stack: Stack, ref: str) -> list[dict[str, Any]]:
    r = await stack.client.get(f"/api/automations/{ref}/runs")
    assert r.status_code == 200, r.text
    return list(r.json())


async def test_two_replicas_fire_each_tick_once(make_stack: StackFactory, pg_dsn: str) -> None:
    a = await make_stack(**clustered("a", pg_dsn))
    set_clock([a], PAST)
    b = await make_stack(workspace=False, **clustered("b", pg_dsn))
    stacks = [a, b]
    set_clock(stacks, PAST)
    r = await a.client.post(
        "/api/automations",
        json={
            "name": "every-minute",
            "workspace": "ws",
            "schedule": "* * * * *",
            "spawn": {"prompt": "tick {{now}}", "isolation": "shared"},
        },
    )
    assert r.status_code == 201, r.text
    assert (await b.client.get("/api/automations/every-minute")).status_code == 200

    async def one_leader() -> bool:
        return sum(s.runtime.scheduler.leader for s in stacks if s.runtime.scheduler) == 1

    await wait_until(one_leader, 10.0, interval=0.02, what="one scheduler leader")
    leader, follower = (a, b) if a.runtime.scheduler and a.runtime.scheduler.leader else (b, a)

    # tick 1: both replicas' loops run every 50 ms on the same clock
    set_clock(stacks, datetime(2099, 1, 1, 0, 0, 30, tzinfo=UTC))
    await wait_until(lambda: _fired(a, 1), 10.0, interval=0.05, what="tick 1 fired")
    assert leader.runtime.scheduler is not None
    passes = leader.runtime.scheduler.passes
    await wait_until(
        lambda: (
            leader.runtime.scheduler is not None and leader.runtime.scheduler.passes > passes + 5
        ),
        10.0,
        what="more passes on the tick",
    )
    hist = await runs(b, "every-minute")
    assert [h["tick"] for h in hist] == ["2099-01-01T00:00+00:00"]
    assert hist[0]["state"] == "spawned"
    assert list(a.fake.agents) == [hist[0]["agent_id"]]

    # both replicas fire the same tick directly, at once (as at a lease handover): one run
    svc_a, svc_b = a.runtime.automations, b.runtime.automations
    assert svc_a is not None and svc_b is not None
    auto = await svc_a.resolve("every-minute")
    tick = "2099-01-01T00:00+00:00"
    both = await asyncio.gather(
        *(svc.fire(auto, "schedule", tick=tick) for svc in (svc_a, svc_b, svc_a, svc_b))
    )
    assert both == [None, None, None, None]

    # handover: the leader stops its scheduler (releasing the lease) mid-minute; the other
    # replica takes the lease and, on the same minute, fires nothing again
    assert leader.runtime.scheduler is not None and follower.runtime.scheduler is not None
    await leader.runtime.scheduler.stop()
    await wait_until(
        lambda: follower.runtime.scheduler is not None and follower.runtime.scheduler.leader,
        10.0,
        interval=0.02,
        what="the follower leads",
    )
    fpasses = follower.runtime.scheduler.passes
    await wait_until(
        lambda: (
            follower.runtime.scheduler is not None
            and follower.runtime.scheduler.passes > fpasses + 5
        ),
        10.0,
        what="follower passes on the same tick",
    )
    assert len(await runs(a, "every-minute")) == 1
    # the next tick: fired once, by the new leader
    set_clock([follower], datetime(2099, 1, 1, 0, 1, 5, tzinfo=UTC))
    await wait_until(lambda: _fired(follower, 2), 10.0, interval=0.05, what="tick 2 fired")
    hist = await runs(a, "every-minute")
    assert [h["tick"] for h in hist] == ["2099-01-01T00:01+00:00", "2099-01-01T00:00+00:00"]
    lease = await follower.runtime.backend.leases.holder(LEASE_KEY)  # type: ignore[union-attr]
    assert lease is not None and lease.owner == follower.runtime.cluster.replica_id


async def _fired(stack: Stack, n: int) -> bool:
    hist = await runs(stack, "every-minute")
    return len(hist) >= n and all(h["state"] != "firing" for h in hist)
