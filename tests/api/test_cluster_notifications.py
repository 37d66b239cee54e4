"""Notifications in a cluster: two prosperod replicas on one PostgreSQL database deliver each
notification once — one replica holds the `notifier` lease and reads the shared cursor, and
a delivery row is unique per (target, event) — and when the sending replica dies the other
goes on from the shared cursor, losing nothing."""

from __future__ import annotations

from typing import Any

import pytest

from prospero.core.notify.notifier import LEASE_KEY
from tests.api.conftest import Stack, StackFactory
from tests.receiver import Receiver
from tests.support import wait_until

pytestmark = pytest.mark.serial

TTL = 1.0
BEAT = 0.25


async def holder(stack: Stack, key: str) -> str | None:
    authority = stack.runtime.cluster.authority
    assert authority is not None
    lease = await authority.holder(key)
    now = await authority.now()
    return lease.owner if lease is not None and lease.expires_at > now else None


async def test_each_notification_is_delivered_once_and_survives_the_senders_death(
    make_stack: StackFactory, pg_dsn: str
) -> None:
    common: dict[str, Any] = {
        "database_url": pg_dsn,
        "lease_ttl": TTL,
        "heartbeat_interval": BEAT,
        "notify_interval": 0.05,
    }
    rx = await Receiver().start()
    try:
        a = await make_stack(replica_id="a", **common)
        b = await make_stack(replica_id="b", workspace=False, **common)
        r = await b.client.post(
            "/api/notifications/targets", json={"name": "ops", "url": rx.url}
        )  # configured on one replica, seen by both (the shared store)
        assert r.status_code == 201, r.text

        async def led() -> bool:
            return await holder(a, LEASE_KEY) in ("a", "b")

        await wait_until(led, 10, what="a notifier leader")
        first = await a.spawn()
        await a.wait_finished(first, within=30)

        async def told(n: int) -> bool:
            return len(rx.bodies) >= n

        await wait_until(lambda: told(1), 20, what="the first run notified")
        # Both replicas read past that event before we count (the leader's cursor moved on,
        # the other would have to take the lease to read at all).
        leader = a if await holder(a, LEASE_KEY) == "a" else b
        other = b if leader is a else a
        assert leader.runtime.notifier is not None and other.runtime.notifier is not None
        assert other.runtime.notifier.leading is False

        # The leader dies without handing its lease over: the other takes it after the TTL
        # and sends what happens next, from the shared cursor.
        await leader.runtime.notifier.stop(release=False)
        second = await other.spawn() if other is a else await a.spawn()
        await a.wait_finished(second, within=30)
        await wait_until(lambda: told(2), 20, what="the second run notified by the survivor")
        runs = [(body["agent_id"], body["event"]) for body in rx.bodies]
        assert runs == [(first, "agent_finished"), (second, "agent_finished")], runs
        assert await holder(a, LEASE_KEY) == other.runtime.cluster.replica_id
        log = (await a.client.get("/api/notifications/deliveries")).json()
        assert sorted((d["agent_id"], d["state"]) for d in log) == sorted(
            [(first, "delivered"), (second, "delivered")]
        )
        assert rx.attempts == 2  # nothing sent twice, by either replica
    finally:
        await rx.stop()
