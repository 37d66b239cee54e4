"""asyncio helpers.

`wait_for` is `asyncio.wait_for` without Python 3.11's lost cancellation: there, when the
awaited operation completes at the moment the calling task is cancelled, `asyncio.wait_for`
returns the result and drops the cancellation, so a task told to stop goes on (and may wait
forever for something nobody will send). Built on `asyncio.timeout`, which re-raises an outside
cancellation and turns only its own into `TimeoutError`. Python 3.12 fixed `asyncio.wait_for`
by building it the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_for(aw: Awaitable[T], timeout: float | None) -> T:
    """Await `aw`; after `timeout` seconds (None = no limit) cancel it and raise TimeoutError."""
    if timeout is None:
        return await aw
    async with asyncio.timeout(max(0.0, timeout)):
        return await aw
