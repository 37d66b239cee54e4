"""What the route handlers need from the running stack, looked up on `app.state`.

The API must not import `prospero.daemon` (layering), so the runtime is described by a
Protocol: anything with a started FleetManager, event store, bus and metrics will do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from fastapi import Request

from prospero.api import metrics_fleet
from prospero.api.settings import ApiSettings
from prospero.api.sse import StreamHub
from prospero.core.bus import Bus
from prospero.core.errors import ProsperoError
from prospero.core.fleet.manager import FleetManager
from prospero.core.metrics import Metrics
from prospero.core.store.base import EventStore

log = logging.getLogger(__name__)


class AppRuntime(Protocol):
    """The slice of `prospero.daemon.runtime.Runtime` the API uses."""

    manager: FleetManager | None
    store: Any  # EventStore once started
    bus: Any  # Bus
    metrics: Metrics


class NotReady(ProsperoError):
    kind = "unreachable"

    def __init__(self) -> None:
        super().__init__("prosperod is starting or stopping")


class ApiState:
    """Per-app state: the runtime, settings, open SSE streams and background tasks."""

    def __init__(self, runtime: AppRuntime, settings: ApiSettings) -> None:
        self.runtime = runtime
        self.settings = settings
        self.hub = StreamHub(settings, runtime.metrics)
        metrics_fleet.install(runtime.metrics, runtime)  # the fleet's gauges, read at scrape
        self.background: set[asyncio.Task[Any]] = set()
        # Called by shutdown(), in order: services mounted in the app (the MCP endpoint).
        self.closers: list[Callable[[], Awaitable[None]]] = []

    @property
    def manager(self) -> FleetManager:
        mgr = self.runtime.manager
        if mgr is None:
            raise NotReady()
        return mgr

    @property
    def store(self) -> EventStore:
        store = self.runtime.store
        if store is None:
            raise NotReady()
        return store  # type: ignore[no-any-return]

    @property
    def bus(self) -> Bus:
        return self.runtime.bus  # type: ignore[no-any-return]

    @property
    def metrics(self) -> Metrics:
        return self.runtime.metrics

    def spawn_background(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self.background.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self.background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("background task %s failed: %s", name, t.exception())

        task.add_done_callback(done)

    async def shutdown(self) -> None:
        """End SSE streams, stop mounted services and cancel background work (the HTTP
        server is draining)."""
        self.hub.close_all()
        for close in self.closers:
            try:
                await close()
            except Exception:
                log.exception("closing %r failed", close)
        tasks = list(self.background)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def api_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state
