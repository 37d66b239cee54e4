"""One notification POST with bounded retries: exponential backoff with jitter on network
errors, 5xx, 408 and 429 (a `Retry-After` in seconds is honoured up to the cap); any other
answer ends it at once (2xx delivered, else failed)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

RETRYABLE = frozenset({408, 429})


@dataclass
class Outcome:
    delivered: bool
    attempts: int
    http_status: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    backoff: float = 0.5
    backoff_cap: float = 30.0


def _retry_after(resp: httpx.Response, cap: float) -> float | None:
    value = resp.headers.get("retry-after", "").strip()
    if not value.isdigit():
        return None
    return min(float(value), cap)


async def post(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    policy: RetryPolicy,
    *,
    on_retry: Callable[[], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Outcome:
    data = orjson.dumps(body)
    out = Outcome(False, 0)
    for attempt in range(1, max(1, policy.attempts) + 1):
        out.attempts = attempt
        wait: float | None = None
        try:
            resp = await client.post(url, content=data)
        except httpx.HTTPError as e:
            out.http_status, out.error = (
                None,
                f"{type(e).__name__}: {e}" if str(e) else type(e).__name__,
            )
        else:
            out.http_status = resp.status_code
            if 200 <= resp.status_code < 300:
                out.delivered, out.error = True, None
                return out
            out.error = f"HTTP {resp.status_code}: {resp.text[:200]}".rstrip(": ")
            if resp.status_code < 500 and resp.status_code not in RETRYABLE:
                return out
            wait = _retry_after(resp, policy.backoff_cap)
        if attempt == policy.attempts:
            break
        if wait is None:
            base = min(policy.backoff_cap, policy.backoff * 2 ** (attempt - 1))
            wait = base * (0.5 + random.random() / 2)
        if on_retry is not None:
            on_retry()
        await sleep(wait)
    return out
