"""Shared test helpers: bounded polling instead of sleeps, short socket dirs, fixture paths."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from prospero.core.bus import BusItem, InProcessBus

REPO = Path(__file__).resolve().parents[1]
# Recorded caliband frames (copied from the spec's fixtures; the tests never read outside the repo).
FIXTURES = Path(os.environ.get("PROSPERO_FIXTURES", REPO / "tests" / "fixtures" / "caliband"))


def fixture_lines(name: str) -> list[str]:
    return [ln for ln in (FIXTURES / name).read_text().splitlines() if ln.strip()]


def short_tmpdir() -> str:
    """A short directory for Unix sockets (sun_path is limited to ~107 bytes)."""
    return tempfile.mkdtemp(prefix="pr-", dir="/tmp")


async def wait_until(
    cond: Callable[[], bool | Awaitable[bool]],
    timeout: float = 10.0,
    interval: float = 0.01,
    what: str = "",
) -> None:
    """Poll `cond` until it is truthy; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        res = cond()
        if asyncio.iscoroutine(res) or isinstance(res, Awaitable):
            res = await res  # type: ignore[misc]
        if res:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {what or cond}")
        await asyncio.sleep(interval)


def poll_until_sync(cond: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    """Blocking variant of `wait_until` for synchronous tests: returns cond()'s first truthy
    value, polling every 50 ms; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {what or cond}")
        time.sleep(0.05)  # poll interval


class CollectingBus(InProcessBus):
    """An InProcessBus that also keeps every published item, in order (`items`)."""

    def __init__(self) -> None:
        super().__init__(buffer=100_000)
        self.items: list[BusItem] = []

    def publish(self, item: BusItem) -> None:
        self.items.append(item)
        super().publish(item)
