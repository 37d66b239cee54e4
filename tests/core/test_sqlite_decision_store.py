"""SQLite: the DecisionStore and AgentMetaStore conformance suites (and the in-memory
AgentMetaStore), on a real `events.db`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from prospero.core.store.base import AgentMetaStore
from prospero.core.store.decisions import DecisionStore
from prospero.core.store.sqlite.agents import MemoryAgentMetaStore, SqliteAgentMetaStore
from prospero.core.store.sqlite.decisions import SqliteDecisionStore
from tests.conformance.agent_meta_store import AgentMetaStoreConformance, AgentMetaStoreFactory
from tests.conformance.decision_store import DecisionStoreConformance, DecisionStoreFactory


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "events.db"


class TestSqliteDecisionStore(DecisionStoreConformance):
    @pytest.fixture
    async def decision_store_factory(self, db_path: Path) -> AsyncIterator[DecisionStoreFactory]:
        opened: list[SqliteDecisionStore] = []

        async def make() -> DecisionStore:
            s = SqliteDecisionStore(db_path)
            await s.open()
            opened.append(s)
            return s

        yield make
        for s in opened:
            await s.close()


class TestSqliteAgentMetaStore(AgentMetaStoreConformance):
    @pytest.fixture
    async def agent_meta_store_factory(self, db_path: Path) -> AsyncIterator[AgentMetaStoreFactory]:
        opened: list[SqliteAgentMetaStore] = []

        async def make() -> AgentMetaStore:
            s = SqliteAgentMetaStore(db_path)
            await s.open()
            opened.append(s)
            return s

        yield make
        for s in opened:
            await s.close()


class TestMemoryAgentMetaStore(AgentMetaStoreConformance):
    @pytest.fixture
    async def agent_meta_store_factory(self) -> AgentMetaStoreFactory:
        store = MemoryAgentMetaStore()  # one process: a "reopen" is the same object

        async def make() -> AgentMetaStore:
            return store

        return make
