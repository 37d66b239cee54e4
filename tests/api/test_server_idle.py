"""The HTTP server does not wake an idle prosperod (api/server.py `_Server`): no 10 Hz main-loop
tick, yet the Date header is right to the second and `should_exit` still stops it at once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import pytest
import uvicorn

from prospero.api import server as api_server
from prospero.api.server import _Server, bind_socket
from prospero.core.aio import wait_for
from tests.support import wait_until

STOP_TIMEOUT = 10.0  # generous bound on a clean stop (never a timing assertion)


async def _hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-app", b"1")]})
    await send({"type": "http.response.body", "body": b"ok"})


@dataclass
class Served:
    server: _Server
    url: str
    task: asyncio.Task[None]
    ticks: list[int]


@pytest.fixture
async def served(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    ticks: list[int] = []
    original = uvicorn.Server.on_tick

    async def counting_tick(self: uvicorn.Server, counter: int) -> bool:
        ticks.append(counter)
        return await original(self, counter)

    monkeypatch.setattr(api_server._Server, "on_tick", counting_tick)
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = uvicorn.Config(_hello, lifespan="off", log_config=None, server_header=False)
    srv = _Server(config)
    task = asyncio.create_task(srv.serve(sockets=[sock]))
    await wait_until(lambda: srv.started or task.done(), what="server started")
    try:
        yield Served(srv, f"http://127.0.0.1:{port}", task, ticks)
    finally:
        srv.should_exit = True
        with contextlib.suppress(Exception):
            await wait_for(task, STOP_TIMEOUT)
        sock.close()


async def test_date_header_is_right_to_the_second_without_a_tick(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        before = int(time.time())
        r = await client.get("/")
        after = time.time()
        assert r.status_code == 200 and r.text == "ok"
        assert r.headers["x-app"] == "1" and "server" not in r.headers
        first = int(parsedate_to_datetime(r.headers["date"]).timestamp())
        assert before <= first <= after

        # A request in a later second gets that second's date, though nothing ticked.
        async def later_second() -> bool:
            lo = int(time.time())
            resp = await client.get("/")
            hi = time.time()
            stamp = int(parsedate_to_datetime(resp.headers["date"]).timestamp())
            assert lo <= stamp <= hi
            return stamp > first

        await wait_until(later_second, timeout=STOP_TIMEOUT, interval=0.05, what="a new Date")
    assert served.ticks == []  # uvicorn's 10 Hz main loop never ran
    assert not served.server.should_exit and not served.task.done()


async def test_should_exit_stops_the_server(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        assert (await client.get("/")).status_code == 200
    served.server.should_exit = True
    assert served.server.should_exit
    await wait_for(asyncio.shield(served.task), STOP_TIMEOUT)  # serve() returned: shut down
    with pytest.raises(httpx.TransportError):
        async with httpx.AsyncClient(base_url=served.url) as client:
            await client.get("/")
    assert served.ticks == []
