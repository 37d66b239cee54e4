"""A live prosperod for contract tests, in a thread of its own.

Schemathesis drives the API with blocking `requests` calls from the test's thread, so the
stack (Runtime + uvicorn on 127.0.0.1:<ephemeral> + a fake caliband, like tests/api/conftest.py)
runs its own event loop in a background thread. Authentication is on: an `admin` token from a
hashed tokens file, sent on every request.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prospero.api.app import create_app
from prospero.api.server import ApiServer
from prospero.api.settings import ApiSettings
from prospero.core.discovery import socket_path_for
from prospero.core.sources import canonical_root
from prospero.core.tokens import Scope, TokenTable, add_token
from prospero.daemon.runtime import DaemonConfig, Runtime
from prospero.testkit.fake_caliband import FakeCaliband
from tests.api.conftest import script_for
from tests.support import short_tmpdir

START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0


class LiveStack:
    """prosperod (auth on: one admin token) with one registered workspace `ws` served by a
    fake caliband."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.url = ""
        self.token = ""
        self.agent_ids: list[str] = []
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="live-prosperod", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT):
            raise RuntimeError("the live stack did not start in time")
        if self.error is not None:
            raise RuntimeError("the live stack failed to start") from self.error

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(STOP_TIMEOUT)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # reported by start()
            self.error = e
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        tokens_file = self.tmp / "tokens"
        tokens_file.touch(mode=0o600)
        self.token = add_token(tokens_file, "contract", Scope.admin)
        cfg = DaemonConfig(
            bind_host="127.0.0.1",
            port=0,
            data_dir=self.tmp / "data",
            autostart=False,
            poll_interval=0.05,
        )
        runtime = Runtime(cfg)
        await runtime.start()
        fakes: list[FakeCaliband] = []
        server: ApiServer | None = None
        try:
            root = self.tmp / "ws"
            root.mkdir()
            canon = canonical_root(str(root))
            fakes.append(
                await FakeCaliband.start_unix(
                    socket_path_for(canon), root=canon, script_for=script_for
                )
            )
            assert runtime.manager is not None
            await runtime.manager.add_workspace("ws", str(root))
            # No auth-failure limit: the run's wrong sign-in tokens (POST /api/session) would
            # otherwise get this client 429 on everything after them (tests/api covers 429).
            settings = ApiSettings(
                tokens=TokenTable(tokens_file), heartbeat_interval=0.2, auth_failure_limit=0
            )
            server = ApiServer(create_app(runtime, settings), "127.0.0.1", 0, graceful_timeout=3)
            await server.start()
            self.url = server.url
            self._ready.set()
            await self._stop.wait()
        finally:
            if server is not None:
                await server.stop()
            await runtime.stop()
            for f in fakes:
                await f.stop()


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    rundir = short_tmpdir()
    saved = os.environ.get("CALIBAN_DAEMON_RUNTIME_DIR")
    os.environ["CALIBAN_DAEMON_RUNTIME_DIR"] = rundir
    stack = LiveStack(tmp_path_factory.mktemp("contract"))
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
        if saved is None:
            os.environ.pop("CALIBAN_DAEMON_RUNTIME_DIR", None)
        else:
            os.environ["CALIBAN_DAEMON_RUNTIME_DIR"] = saved
        shutil.rmtree(rundir, ignore_errors=True)


def auth_headers(stack: LiveStack) -> dict[str, Any]:
    return {"Authorization": f"Bearer {stack.token}", "X-Prospero-Client": "schemathesis"}


class Tally:
    """What the contract run did, for its one-line summary."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.operations: set[str] = set()
        self.requests = 0
        self.statuses: Counter[int] = Counter()
        self.failures: list[str] = []

    def record(self, operation: str, status: int) -> None:
        with self.lock:
            self.operations.add(operation)
            self.requests += 1
            self.statuses[status] += 1

    def fail(self, operation: str, error: BaseException) -> None:
        with self.lock:
            self.failures.append(f"{operation}: {error}")

    def line(self) -> str:
        classes = Counter(f"{s // 100}xx" for s in self.statuses.elements())
        spread = ", ".join(f"{k} {v}" for k, v in sorted(classes.items()))
        return (
            f"schemathesis: {len(self.operations)} operations, {self.requests} examples sent "
            f"({spread}), {len(self.failures)} failures"
        )


TALLY = Tally()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TALLY.requests:
        terminalreporter.write_line(TALLY.line())
