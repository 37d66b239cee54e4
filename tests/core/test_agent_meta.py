"""AgentMeta: the SQLite store (shared `events.db`) and how it overlays the provider's record."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from prospero.core.fleet.meta import agent_view, drivable, drive_protocol, effective_status
from prospero.core.fleet.records import AgentSpec, ListedAgent
from prospero.core.store.base import AgentMetaStore
from prospero.core.store.sqlite.agents import MemoryAgentMetaStore, SqliteAgentMetaStore
from prospero.core.store.sqlite.events import SqliteEventStore
from prospero.core.transport import UnixAddress
from prospero.types.model import AgentMeta, AgentStatus
from tests.support import short_tmpdir


def meta(agent_id: str = "a1", **kw: object) -> AgentMeta:
    return AgentMeta.model_validate({"agent_id": agent_id, "workspace": "ws", **kw})


def record(status: AgentStatus = AgentStatus.running, protocol: str = "ndjson") -> ListedAgent:
    return ListedAgent(
        id="a1",
        name="agent-a1",
        status=status,
        started_at="2026-12-01T00:00:00+00:00",
        session_dir="/s",
        address=UnixAddress("/x.sock"),
        spec=AgentSpec(prompt="hi", drive_protocol=protocol),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_store_round_trip(kind: str) -> None:
    db = Path(short_tmpdir()) / "events.db"
    store: AgentMetaStore
    store = SqliteAgentMetaStore(db) if kind == "sqlite" else MemoryAgentMetaStore()
    assert await store.get_meta("a1") is None
    m = meta(spawned_here=True, drive_protocol="acp", posture="supervised", prompt="p")
    await store.put_meta(m)
    await store.put_meta(meta("b2", adopted=True))
    assert await store.get_meta("a1") == m
    await store.put_meta(m.model_copy(update={"outcome": "EndOfTurn"}))
    got = await store.get_meta("a1")
    assert got is not None and got.outcome == "EndOfTurn" and got.posture == "supervised"
    assert [x.agent_id for x in await store.list_meta()] == ["a1", "b2"]
    assert await store.delete_meta("b2") is True and await store.delete_meta("b2") is False
    await store.close()


async def test_sqlite_store_shares_the_event_file_and_survives_reopen() -> None:
    db = Path(short_tmpdir()) / "events.db"
    events = SqliteEventStore(db)
    await events.open()
    store = SqliteAgentMetaStore(db)
    await store.put_meta(meta(posture="autonomous"))
    await store.close()
    again = SqliteAgentMetaStore(db)
    got = await again.get_meta("a1")
    assert got is not None and got.posture == "autonomous"
    # an unreadable row is ignored (logged), never fatal
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO agent_meta VALUES ('zz', 'ws', '{\"nope\":')")
    assert await again.get_meta("zz") is None
    assert [m.agent_id for m in await again.list_meta()] == ["a1"]
    await again.close()
    await events.close()


def test_meta_overlays_the_record() -> None:
    rec = record()
    assert drive_protocol(rec, None) == "ndjson" and drivable(rec, None)
    acp = record(protocol="acp")
    assert drive_protocol(acp, None) == "acp" and not drivable(acp, None)  # not ours
    assert drivable(acp, meta(drive_protocol="acp", spawned_here=True))
    assert drivable(acp, meta(drive_protocol="acp", adopted=True))
    # meta wins over caliband's record for the protocol
    assert drive_protocol(rec, meta(drive_protocol="acp")) == "acp"
    view = agent_view("ws", acp, meta(drive_protocol="acp", posture="supervised", spawned_here=True))
    assert (view.posture, view.spawned_here, view.drive_protocol) == ("supervised", True, "acp")
    assert agent_view("ws", acp, None).posture is None


@pytest.mark.parametrize(
    ("raw", "protocol", "outcome", "reads"),
    [
        (AgentStatus.running, "ndjson", None, AgentStatus.running),
        (AgentStatus.running, "acp", "EndOfTurn", AgentStatus.done),  # worker kept after end
        (AgentStatus.running, "acp", "Error", AgentStatus.failed),
        (AgentStatus.killed, "acp", "EndOfTurn", AgentStatus.done),  # released by Prospero
        (AgentStatus.killed, "acp", "killed", AgentStatus.killed),
        (AgentStatus.failed, "acp", "crashed", AgentStatus.failed),  # caliband's verdict
        (AgentStatus.done, "ndjson", "EndOfTurn", AgentStatus.done),
        (AgentStatus.killed, "ndjson", "EndOfTurn", AgentStatus.killed),
        (AgentStatus.running, "ndjson", "crashed", AgentStatus.crashed),
    ],
)
def test_effective_status(
    raw: AgentStatus, protocol: str, outcome: str | None, reads: AgentStatus
) -> None:
    m = meta(drive_protocol=protocol, outcome=outcome)
    assert effective_status(record(raw, protocol), m) == reads
