"""AgentMetaStore conformance: what every agent-metadata backend (SQLite, PostgreSQL, memory)
must do.

A test module subclasses `AgentMetaStoreConformance` and provides an `agent_meta_store_factory`
fixture: an async callable that opens and returns a new handle on the *same* backing store,
fresh for each test (calling it twice = a restart). The fixture closes every handle it opened
at teardown.

Semantics pinned here beyond base.py's docstrings: every AgentMeta field round-trips;
`put_meta` replaces the whole record (workspace included); `list_meta` is in agent-id order,
byte-wise (`sorted()` of the ids); `delete_meta` is True once, then False; rows survive a
reopen.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from prospero.core.store.base import AgentMetaStore
from prospero.types.model import AgentMeta

AgentMetaStoreFactory = Callable[[], Awaitable[AgentMetaStore]]


def meta(agent_id: str = "a1", **kw: Any) -> AgentMeta:
    return AgentMeta.model_validate({"agent_id": agent_id, "workspace": "ws", **kw})


class AgentMetaStoreConformance:
    @pytest.fixture
    async def agent_meta_store(
        self, agent_meta_store_factory: AgentMetaStoreFactory
    ) -> AgentMetaStore:
        return await agent_meta_store_factory()

    async def test_empty(self, agent_meta_store: AgentMetaStore) -> None:
        assert await agent_meta_store.get_meta("a1") is None
        assert await agent_meta_store.list_meta() == []
        assert await agent_meta_store.delete_meta("a1") is False

    async def test_round_trip_every_field(self, agent_meta_store: AgentMetaStore) -> None:
        full = meta(
            "agent-ü",
            workspace="wß",
            spawned_here=True,
            drive_protocol="acp",
            posture="supervised",
            prompt="fix the bug\n\twith “quotes” and \u0000 nul",
            adopted=True,
            created_at="2026-12-01T00:00:00+00:00",
            outcome="EndOfTurn",
        )
        bare = meta("b2")
        await agent_meta_store.put_meta(full)
        await agent_meta_store.put_meta(bare)
        assert await agent_meta_store.get_meta("agent-ü") == full
        assert await agent_meta_store.get_meta("b2") == bare
        assert await agent_meta_store.get_meta("B2") is None

    async def test_put_replaces(self, agent_meta_store: AgentMetaStore) -> None:
        s = agent_meta_store
        first = meta(spawned_here=True, drive_protocol="acp", posture="supervised", prompt="p")
        await s.put_meta(first)
        await s.put_meta(meta("other"))
        finished = first.model_copy(update={"outcome": "EndOfTurn"})
        await s.put_meta(finished)
        assert await s.get_meta("a1") == finished
        moved = meta(workspace="ws2", adopted=True)  # the whole record is replaced
        await s.put_meta(moved)
        got = await s.get_meta("a1")
        assert got == moved and got is not None and got.posture is None and not got.spawned_here
        assert [m.agent_id for m in await s.list_meta()] == ["a1", "other"]

    async def test_list_in_agent_id_order(self, agent_meta_store: AgentMetaStore) -> None:
        agent_ids = ["mid", "b", "A", "a", "a-1", "a_1", "Z9", "_x", "é"]
        for agent_id in agent_ids:
            await agent_meta_store.put_meta(meta(agent_id, prompt=agent_id))
        listed = await agent_meta_store.list_meta()
        assert [m.agent_id for m in listed] == sorted(agent_ids)
        assert all(m.prompt == m.agent_id for m in listed)

    async def test_delete(self, agent_meta_store: AgentMetaStore) -> None:
        s = agent_meta_store
        await s.put_meta(meta("a1"))
        await s.put_meta(meta("b2"))
        assert await s.delete_meta("b2") is True
        assert await s.delete_meta("b2") is False
        assert await s.get_meta("b2") is None
        assert [m.agent_id for m in await s.list_meta()] == ["a1"]
        await s.put_meta(meta("b2", posture="autonomous"))  # back after a delete
        assert (await s.get_meta("b2")) == meta("b2", posture="autonomous")

    async def test_survives_reopen(self, agent_meta_store_factory: AgentMetaStoreFactory) -> None:
        s1 = await agent_meta_store_factory()
        m = meta(posture="autonomous", spawned_here=True, created_at="2026-01-01T00:00:00Z")
        await s1.put_meta(m)
        await s1.put_meta(meta("gone"))
        assert await s1.delete_meta("gone")
        close = getattr(s1, "close", None)
        if close is not None:
            await close()
        s2 = await agent_meta_store_factory()
        assert await s2.get_meta("a1") == m
        assert await s2.list_meta() == [m]
