"""Retention: prune_older_than and the periodic RetentionTask."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from prospero.core.metrics import Metrics
from prospero.core.retention import (
    EVENTS_PRUNED,
    PRUNE_FAILURES,
    RetentionTask,
    cutoff_ts,
    prune_older_than,
)
from prospero.core.store.sqlite.events import SqliteEventStore
from tests.conformance.eventstore import ev
from tests.support import wait_until


def ago(days: float) -> str:
    return (datetime.now(UTC) - timedelta(days=days)).isoformat(timespec="microseconds")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    s = SqliteEventStore(tmp_path / "events.db")
    await s.open()
    await s.append_batch(
        [
            ev("a", 1, at=ago(40)),
            ev("a", 2, at=ago(31)),
            ev("a", 3, at=ago(29)),
            ev("b", 1, at=ago(0.01)),
        ]
    )
    yield s
    await s.close()


def test_cutoff_is_rfc3339_utc() -> None:
    now = datetime(2026, 3, 10, 12, 0, 0, tzinfo=UTC)
    assert cutoff_ts(30, now) == "2026-02-08T12:00:00.000000+00:00"


async def test_prune_older_than(store: SqliteEventStore) -> None:
    assert await prune_older_than(store, 30) == 2
    assert [e.seq for e in await store.replay("a")] == [3]
    assert await prune_older_than(store, 30) == 0
    with pytest.raises(ValueError):
        await prune_older_than(store, -1)


async def test_task_sweeps_immediately_then_periodically_and_stops(
    store: SqliteEventStore,
) -> None:
    metrics = Metrics()
    task = RetentionTask(store, 30, interval=0.02, metrics=metrics)
    task.start()
    try:
        await wait_until(lambda: task.sweeps >= 1, what="first sweep")
        assert metrics.get(EVENTS_PRUNED) == 2
        await wait_until(lambda: task.sweeps >= 3, what="periodic sweeps")
        assert task.last_pruned == 0
    finally:
        await task.stop()
    assert not task.running
    await task.stop()  # idempotent


async def test_failing_sweep_is_counted_and_retried(store: SqliteEventStore) -> None:
    metrics = Metrics()
    await store.close()  # every prune now fails with StoreError
    task = RetentionTask(store, 30, interval=0.02, metrics=metrics)
    task.start()
    try:
        await wait_until(lambda: metrics.get(PRUNE_FAILURES) >= 2, what="two failed sweeps")
        assert task.running
    finally:
        await task.stop()


def test_invalid_settings() -> None:
    s = SqliteEventStore("/nonexistent/never-opened.db")
    with pytest.raises(ValueError):
        RetentionTask(s, 0)
    with pytest.raises(ValueError):
        RetentionTask(s, 30, interval=0)
