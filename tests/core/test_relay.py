"""The relay between replicas: the conformance suite on MemoryRelay and on PgRelay (a real
PostgreSQL server), plus what only the database relay has — a lost doorbell and a dropped
LISTEN connection heal, rows of dead callers are collected."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest

from prospero.core.relay import CommandRelay, MemoryRelay, MemoryRelayHub
from prospero.core.relay.postgres import PgRelay
from tests.conformance.relay import Recorder, RelayConformance, RelayFactory
from tests.support import wait_until


class TestMemoryRelay(RelayConformance):
    @pytest.fixture
    async def relay_factory(self) -> AsyncIterator[RelayFactory]:
        hub = MemoryRelayHub()
        made: list[MemoryRelay] = []

        async def make(replica: str) -> CommandRelay:
            r = MemoryRelay(hub, replica)
            made.append(r)
            return r

        yield make
        for r in made:
            await r.close()


class TestPgRelay(RelayConformance):
    @pytest.fixture
    async def relay_factory(self, pg_dsn: str) -> AsyncIterator[RelayFactory]:
        made: list[PgRelay] = []

        async def make(replica: str) -> CommandRelay:
            r = PgRelay(pg_dsn, replica, heal_interval=0.2)
            made.append(r)
            return r

        yield make
        for r in made:
            with contextlib.suppress(Exception):
                await r.close()


async def test_pg_a_lost_doorbell_heals_and_a_dropped_listen_connection_reconnects(
    pg_dsn: str,
) -> None:
    a = PgRelay(pg_dsn, "a", heal_interval=0.2)
    b = PgRelay(pg_dsn, "b", heal_interval=0.2)
    rb = Recorder()
    try:
        await a.start(Recorder())
        await b.start(rb)
        # A call whose NOTIFY never came (inserted by hand): b's heal pass takes it.
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute(
                "INSERT INTO relay_calls (id, target, agent_id, op, args, expires_at) "
                "VALUES ('lost', 'b', 'agent-9', 'end_input', '{}', now() + interval '30 s')"
            )

            async def ran() -> bool:
                return [c.id for c in rb.calls] == ["lost"]

            await wait_until(ran, 5.0, what="the healed call run")
            # b's LISTEN connection is killed: calls still get through (heal, then reconnect).
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND query LIKE 'LISTEN%'"
            )
            value = await a.call("b", "agent-1", "send_input", {"text": "after"}, timeout=10)
            assert value["echo"] == {"text": "after"}
            # Stale rows of callers that died are not run (past their deadline).
            await conn.execute(
                "INSERT INTO relay_calls (id, target, agent_id, op, args, expires_at) "
                "VALUES ('stale', 'b', 'agent-9', 'kill', '{}', now() - interval '1 s')"
            )
            await a.call("b", "agent-1", "end_input", timeout=10)
            assert "stale" not in [c.id for c in rb.calls]
            # A finished call's row is gone (the caller deleted it).
            left = await conn.fetchval("SELECT count(*) FROM relay_calls WHERE result IS NOT NULL")
            assert left <= 1  # 'lost' (nobody waits for it); every awaited call cleaned up
        finally:
            await conn.close()
    finally:
        await a.close()
        await b.close()
