"""The NotificationStore conformance suite (core/store/notifications.py): run against SQLite
and PostgreSQL by tests/core/test_notification_stores.py. Two handles on one store stand for
two replicas (or a restarted process)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from prospero.core.store.notifications import DuplicateTarget, NotificationStore
from prospero.types.notifications import Delivery, NotificationTarget

NotificationStoreFactory = Callable[[], Awaitable[NotificationStore]]


def target(tid: str = "nt_1", name: str = "ops", **kw: object) -> NotificationTarget:
    return NotificationTarget(
        id=tid, name=name, url="https://hooks.example/T/B/secret", created_at="t0", **kw
    )  # type: ignore[arg-type]


def delivery(tid: str = "nt_1", ordinal: int | None = 7, event: str = "agent_finished") -> Delivery:
    return Delivery(
        id=0, target_id=tid, ordinal=ordinal, event=event, agent_id="a1", workspace="ws",
        summary="agent a1 in ws finished\x00", created_at="t1",
    )  # fmt: skip


class NotificationStoreConformance:
    @pytest.fixture
    async def notification_store_factory(self) -> NotificationStoreFactory:  # pragma: no cover
        raise NotImplementedError

    async def test_targets_round_trip_and_names_are_unique(
        self, notification_store_factory: NotificationStoreFactory
    ) -> None:
        s = await notification_store_factory()
        t = target(events=["agent_failed"], workspaces=["ws"], format="slack")
        await s.create_target(t)
        assert await s.get_target("nt_1") == t
        with pytest.raises(DuplicateTarget):
            await s.create_target(target("nt_2"))
        await s.create_target(target("nt_2", "another"))
        assert [x.name for x in await s.targets()] == ["another", "ops"]
        with pytest.raises(DuplicateTarget):
            await s.update_target(target("nt_2", "ops"))
        assert await s.update_target(t.model_copy(update={"enabled": False}))
        assert (await s.get_target("nt_1")).enabled is False  # type: ignore[union-attr]
        assert not await s.update_target(target("nt_9", "ghost"))
        assert await s.delete_target("nt_1") and not await s.delete_target("nt_1")
        assert await s.get_target("nt_1") is None

    async def test_a_delivery_is_claimed_once_by_racing_handles(
        self, notification_store_factory: NotificationStoreFactory
    ) -> None:
        a, b = await notification_store_factory(), await notification_store_factory()
        await a.create_target(target())
        got = await asyncio.gather(*(h.claim(delivery()) for h in (a, b) * 6))
        assert len([g for g in got if g is not None]) == 1
        # another event, or another target, is another delivery; a test message always new
        assert await b.claim(delivery(ordinal=8)) is not None
        assert await b.claim(delivery(tid="nt_2")) is not None
        t1, t2 = await a.claim(delivery(ordinal=None)), await b.claim(delivery(ordinal=None))
        assert t1 is not None and t2 is not None and t1 != t2

    async def test_finish_pending_log_and_prune(
        self, notification_store_factory: NotificationStoreFactory
    ) -> None:
        s = await notification_store_factory()
        ids = [await s.claim(delivery(ordinal=n), keep=3) for n in range(5)]
        assert all(i is not None for i in ids)
        log = await s.deliveries("nt_1")
        assert [d.ordinal for d in log] == [4, 3, 2]  # newest first, pruned to 3
        assert log[0].summary.startswith("agent a1 in ws finished")
        assert [d.ordinal for d in await s.pending()] == [2, 3, 4]  # oldest first
        await s.finish(ids[4], "delivered", attempts=2, http_status=200, error=None, at="t2")  # type: ignore[arg-type]
        await s.finish(ids[3], "failed", attempts=1, http_status=400, error="HTTP 400", at="t3")  # type: ignore[arg-type]
        log = await s.deliveries(None, limit=2)
        assert [(d.state, d.attempts, d.http_status, d.error, d.updated_at) for d in log] == [
            ("delivered", 2, 200, None, "t2"),
            ("failed", 1, 400, "HTTP 400", "t3"),
        ]
        assert [d.ordinal for d in await s.pending()] == [2]
        await s.create_target(target())
        await s.delete_target("nt_1")  # its log goes with it
        assert await s.deliveries("nt_1") == []

    async def test_the_cursor_only_moves_forward(
        self, notification_store_factory: NotificationStoreFactory
    ) -> None:
        a, b = await notification_store_factory(), await notification_store_factory()
        assert await a.load_cursor() is None
        await a.save_cursor(10)
        await b.save_cursor(4)  # a stale reader cannot move it back
        assert await b.load_cursor() == 10
        await b.save_cursor(12)
        assert await a.load_cursor() == 12
