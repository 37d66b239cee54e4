"""The notifier (core/notify) over real SQLite stores and a real HTTP receiver: which events
notify and how they read (render), from the store's head on first start, nothing lost or sent
twice across a restart, deliveries claimed but never finished sent again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from prospero.core.metrics import Metrics
from prospero.core.notify import Notifier, NotifierConfig
from prospero.core.notify.render import notice_of, payload
from prospero.core.store.sqlite.events import SqliteEventStore
from prospero.core.store.sqlite.notifications import SqliteNotificationStore
from prospero.types import events as ev
from prospero.types.notifications import Delivery, NotificationTarget
from tests.receiver import Receiver
from tests.support import wait_until


def fleet(seq: int, kind: ev.EventKind, agent: str = "a1") -> ev.FleetEvent:
    return ev.FleetEvent(seq=seq, ts="2026-12-02T00:00:00Z", repo="ws", agent_id=agent, kind=kind)


def as_stored(kind: ev.EventKind) -> dict[str, Any]:
    return fleet(1, kind).to_json()


def test_what_notifies_and_how_it_reads() -> None:
    pending = ev.DecisionPending(
        id="d1", tool_call=ev.DecisionToolCall(id="c", title="Edit README.md", kind="edit")
    )
    n = notice_of(5, as_stored(pending), "https://p.example/")
    assert n is not None and n.event == "decision_pending" and n.ordinal == 5
    assert n.summary == "agent a1 in ws asks permission: Edit README.md"
    assert n.link == "https://p.example/#/agents/a1"
    for outcome, name in (
        ("EndOfTurn", "agent_finished"),
        ("killed", "agent_finished"),
        ("ProviderError", "agent_failed"),
        ("crashed", "agent_failed"),
    ):
        n = notice_of(1, as_stored(ev.AgentFinished(outcome=outcome, detail="why")), None)
        assert n is not None and n.event == name, outcome
        assert outcome in n.summary and "why" in n.summary and n.link is None
    assert notice_of(1, as_stored(ev.AgentFinished(outcome="budget_exceeded")), None) is None
    daily = ev.BudgetExceeded(limit="usd", spent=0.0126, cap=0.01, scope="workspace_day")
    n = notice_of(1, as_stored(daily), None)
    assert n is not None and "its workspace's daily budget" in n.summary
    warn = ev.BudgetWarning(limit="tokens", spent=1200, cap=1500)
    n = notice_of(1, as_stored(warn), None)
    assert (
        n is not None
        and n.summary == "agent a1 in ws has spent 1,200 tokens of its budget (1,500 tokens)"
    )
    assert notice_of(1, as_stored(ev.Output(chunk="x")), None) is None
    long = ev.AgentFinished(outcome="ProviderError", detail="x" * 5000)
    n = notice_of(1, as_stored(long), None)
    assert n is not None
    assert len(payload("discord", n, "t")["content"]) == 2000
    assert len(payload("slack", n, "t")["text"]) == 3000
    body = payload("json", n, "t")
    assert body["event"] == "agent_failed" and body["data"]["kind"]["detail"] == "x" * 5000


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[SqliteEventStore, SqliteNotificationStore]]:
    events = SqliteEventStore(tmp_path / "events.db")
    notes = SqliteNotificationStore(tmp_path / "events.db")
    await events.open()
    await notes.open()
    yield events, notes
    await notes.close()
    await events.close()


async def test_from_the_head_then_restart_loses_nothing_and_resends_nothing(
    stores: tuple[SqliteEventStore, SqliteNotificationStore],
) -> None:
    events, notes = stores
    rx = await Receiver().start()
    try:
        await notes.create_target(
            NotificationTarget(id="nt_1", name="ops", url=rx.url, created_at="")
        )
        await events.append_batch([fleet(1, ev.AgentFinished(outcome="EndOfTurn"), "old")])
        cfg = NotifierConfig(poll_interval=0.02)
        n1 = Notifier(notes, events, Metrics(), cfg)
        n1.start()
        await wait_until(lambda: n1.leading, 10, what="the notifier's first read of the head")
        await events.append_batch([fleet(1, ev.AgentFinished(outcome="EndOfTurn"), "a1")])

        async def told(k: int) -> bool:
            return len(rx.bodies) >= k

        await wait_until(lambda: told(1), 10, what="the first notification")
        assert [b["agent_id"] for b in rx.bodies] == ["a1"]  # not the history before it
        await n1.stop()
        # While no notifier runs, two more runs end; a restarted one sends exactly those.
        await events.append_batch(
            [
                fleet(1, ev.AgentFinished(outcome="Cancelled"), "a2"),
                fleet(1, ev.AgentFinished(outcome="EndOfTurn"), "a3"),
            ]
        )
        n2 = Notifier(notes, events, Metrics(), cfg)
        n2.start()
        await wait_until(lambda: told(3), 10, what="the runs that ended while down")
        assert [(b["agent_id"], b["event"]) for b in rx.bodies] == [
            ("a1", "agent_finished"),
            ("a2", "agent_failed"),
            ("a3", "agent_finished"),
        ]
        await n2.stop()
        # A delivery claimed and never finished (a process killed mid-send) is sent again.
        await notes.claim(
            Delivery(id=0, target_id="nt_1", ordinal=999, event="agent_failed",
                     agent_id="a4", workspace="ws", summary="agent a4 in ws failed",
                     created_at="t")
        )  # fmt: skip
        n3 = Notifier(notes, events, Metrics(), cfg)
        n3.start()
        await wait_until(lambda: told(4), 10, what="the unfinished delivery")
        assert rx.bodies[3]["summary"] == "agent a4 in ws failed"
        await wait_until(lambda: _no_pending(notes), 10, what="the resent delivery recorded")
        await n3.stop()
        assert len(rx.bodies) == 4
    finally:
        await rx.stop()


async def _no_pending(notes: SqliteNotificationStore) -> bool:
    return not await notes.pending()
