"""prosperod on PostgreSQL (`--database-url`, core/store/backend.py): the whole HTTP stack on a
real throwaway PostgreSQL server, a fake caliband and scripted agents, the same API as SQLite."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from prospero.core.errors import StoreError
from prospero.daemon.runtime import DaemonConfig, Runtime
from tests.api.conftest import SseReader, StackFactory, sse_headers
from tests.support import wait_until


async def sse_events(client: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    """Every event of a stream that ends (a finished agent's)."""
    out: list[dict[str, Any]] = []
    async with client.stream("GET", url, headers=sse_headers()) as resp:
        assert resp.status_code == 200
        reader = SseReader(resp)
        while (msg := await reader.next()) is not None:
            if msg.event is None:
                out.append(msg.json())
    return out


async def test_history_workspaces_and_metadata_live_in_postgres(
    make_stack: StackFactory, pg_dsn: str
) -> None:
    first = await make_stack(database_url=pg_dsn, replica_id="first")
    assert first.runtime.backend is not None and first.runtime.backend.kind == "postgres"
    assert not (first.tmp / "data" / "events.db").exists()  # nothing went to SQLite
    agent = await first.spawn("tools")
    await first.wait_finished(agent)
    events: list[dict[str, Any]] = []

    async def settled() -> bool:  # the poll has recorded the final status too
        nonlocal events
        events = await first.history(agent)
        return any(e["kind"].get("to") == "done" for e in events)

    await wait_until(settled, 20.0, interval=0.05, what="status done recorded")
    kinds = [e["kind"]["kind"] for e in events]
    assert "agent_finished" in kinds and "tool_started" in kinds
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    # The stream ends with the run (`agent_finished`); the final status follows it in history.
    end = kinds.index("agent_finished") + 1
    assert await sse_events(first.client, f"/api/agents/{agent}/stream") == events[:end]
    r = await first.client.get("/api/usage")
    assert r.status_code == 200, r.text
    await first.client.aclose()
    await first.server.stop()
    await first.runtime.stop()

    # A new prosperod on the same database: the workspace, the agent's metadata and its whole
    # history are there, byte for byte.
    second = await make_stack(database_url=pg_dsn, workspace=False, replica_id="second")
    await second.add_workspace("ws", register=False)  # its caliband, not a new registration
    r = await second.client.get("/api/workspaces")
    assert [w["name"] for w in r.json()] == ["ws"]
    assert await second.history(agent) == events
    await second.wait_status(agent, "done")  # once its first poll has listed the workspace
    r = await second.client.get(f"/api/agents/{agent}")
    assert r.status_code == 200, r.text
    assert r.json()["drive_protocol"] == "ndjson"


async def test_two_replicas_with_one_replica_id_are_refused(
    make_stack: StackFactory, pg_dsn: str, tmp_path: Any
) -> None:
    await make_stack(database_url=pg_dsn, workspace=False, replica_id="r1", lease_ttl=1.0)
    other = Runtime(
        DaemonConfig(
            data_dir=tmp_path / "other",
            autostart=False,
            database_url=pg_dsn,
            replica_id="r1",
            lease_ttl=1.0,
        )
    )
    with pytest.raises(StoreError, match="replica id 'r1' is in use"):
        await other.start()
    await other.stop()  # what start() opened is released: nothing to close twice


async def test_an_unreachable_database_fails_the_start_with_the_server_named(
    tmp_path: Any,
) -> None:
    rt = Runtime(
        DaemonConfig(
            data_dir=tmp_path / "d",
            autostart=False,
            database_url="postgresql://prospero:hunter2@127.0.0.1:1/prospero",
        )
    )
    with pytest.raises(StoreError) as err:
        await rt.start()
    assert "127.0.0.1:1" in str(err.value) and "hunter2" not in str(err.value)
    await rt.stop()


async def test_live_sse_on_postgres_arrives_through_the_doorbell(
    make_stack: StackFactory, pg_dsn: str
) -> None:
    stack = await make_stack(database_url=pg_dsn, replica_id="live")
    seen: list[dict[str, Any]] = []
    agent: str | None = None
    async with stack.client.stream("GET", "/api/stream", headers=sse_headers()) as resp:
        assert resp.status_code == 200
        reader = SseReader(resp)
        agent = await stack.spawn()  # after the stream is open: everything arrives live
        while (msg := await reader.next()) is not None:
            if msg.event is not None:
                continue
            ev = msg.json()
            if ev["agent_id"] == agent:
                seen.append(ev)
                if ev["kind"]["kind"] == "agent_finished":
                    break
    history = await stack.history(agent)
    assert seen == history[: len(seen)]
    assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))


async def test_two_processes_booting_at_once_with_one_replica_id_one_is_refused(
    pg_dsn: str, tmp_path: Any
) -> None:
    """Both find no live presence lease and both ask for it at the same instant: the lease is
    held by the booting process (not the id), so exactly one gets it."""

    def runtime(name: str) -> Runtime:
        return Runtime(
            DaemonConfig(
                data_dir=tmp_path / name,
                autostart=False,
                database_url=pg_dsn,
                replica_id="twin",
                lease_ttl=1.0,
            )
        )

    a, b = runtime("a"), runtime("b")
    results = await asyncio.gather(a.start(), b.start(), return_exceptions=True)
    try:
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1, results
        assert isinstance(errors[0], StoreError) and "is in use" in str(errors[0])
        up = a if results[0] is None else b
        replicas = await up.cluster.replicas()
        assert [(r.replica_id, r.this) for r in replicas] == [("twin", True)]
        leases = await up.cluster.leases()
        assert [(le.key, le.owner) for le in leases if le.key.startswith("replica:")] == [
            ("replica:twin", "twin")
        ]
    finally:
        await a.stop()
        await b.stop()
