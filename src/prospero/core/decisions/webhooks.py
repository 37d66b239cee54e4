"""Decision webhooks: a POST to every configured URL when a decision becomes pending and when
it is resolved."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import httpx

from prospero.core.aio import wait_for
from prospero.core.decisions.names import (
    DECISION_WEBHOOK_DELIVERIES,
    DECISION_WEBHOOK_DROPPED,
    DECISION_WEBHOOK_FAILURES,
    DECISION_WEBHOOK_RETRIES,
)
from prospero.core.decisions.views import summary_of
from prospero.core.metrics import Metrics
from prospero.types.decisions import Decision
from prospero.types.events import now_ts

log = logging.getLogger(__name__)


class WebhookNotifier:
    """POSTs `{"event", "summary", "decision", "sent_at"}` to every URL when a decision
    becomes pending and when it is resolved. One FIFO worker per URL (order kept per URL);
    bounded retries with exponential backoff on network errors, 5xx, 408 and 429; other
    answers fail at once. Never blocks the caller: `notify` only enqueues (a full queue drops
    the notification, counted). Failures are logged and counted."""

    def __init__(
        self,
        urls: Sequence[str],
        metrics: Metrics,
        *,
        attempts: int = 4,
        backoff: float = 0.5,
        backoff_cap: float = 30.0,
        timeout: float = 5.0,
        max_queue: int = 1000,
    ) -> None:
        self.urls = [u for u in urls if u]
        self.metrics = metrics
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.backoff_cap = backoff_cap
        self.timeout = timeout
        self.max_queue = max_queue
        self._queues: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._client: httpx.AsyncClient | None = None

    def start(self) -> None:
        if not self.urls or self._client is not None:
            return
        self._client = httpx.AsyncClient(
            timeout=self.timeout,
            trust_env=False,
            headers={"User-Agent": "prosperod", "Content-Type": "application/json"},
        )
        for url in self.urls:
            q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=self.max_queue)
            self._queues[url] = q
            self._workers.append(asyncio.create_task(self._worker(url, q), name="decision-webhook"))

    def notify(self, event: str, decision: Decision) -> None:
        if not self._queues:
            return
        body = {
            "event": event,
            "summary": summary_of(decision),
            "decision": decision.model_dump(mode="json"),
            "sent_at": now_ts(),
        }
        for url, q in self._queues.items():
            try:
                q.put_nowait(body)
            except asyncio.QueueFull:
                self.metrics.inc(DECISION_WEBHOOK_DROPPED)
                log.warning("decision webhook %s: queue full, notification dropped", url)

    async def _worker(self, url: str, q: asyncio.Queue[dict[str, Any]]) -> None:
        while True:
            body = await q.get()
            try:
                await self._deliver(url, body)
            except asyncio.CancelledError:
                raise
            except Exception:  # a worker must survive anything
                self.metrics.inc(DECISION_WEBHOOK_FAILURES)
                log.exception("decision webhook %s: delivery failed", url)
            finally:
                q.task_done()

    async def _deliver(self, url: str, body: dict[str, Any]) -> None:
        client = self._client
        assert client is not None
        last = ""
        for attempt in range(self.attempts):
            if attempt:
                self.metrics.inc(DECISION_WEBHOOK_RETRIES)
                await asyncio.sleep(min(self.backoff_cap, self.backoff * 2 ** (attempt - 1)))
            try:
                resp = await client.post(url, json=body)
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if resp.status_code < 300:
                self.metrics.inc(DECISION_WEBHOOK_DELIVERIES)
                return
            last = f"HTTP {resp.status_code}"
            if resp.status_code < 500 and resp.status_code not in (408, 429):
                break
        self.metrics.inc(DECISION_WEBHOOK_FAILURES)
        log.warning(
            "decision webhook %s: giving up on %s for decision %s: %s",
            url,
            body.get("event"),
            (body.get("decision") or {}).get("id"),
            last,
        )

    async def close(self, drain: float = 3.0) -> None:
        """Deliver what is queued (bounded by `drain` seconds), then stop."""
        if self._queues:
            with contextlib.suppress(TimeoutError):
                await wait_for(asyncio.gather(*(q.join() for q in self._queues.values())), drain)
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()
        self._queues.clear()
        if self._client is not None:
            await self._client.aclose()
            self._client = None
