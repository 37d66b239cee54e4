"""Real processes for the SIGKILL suites: a fake caliband *process* serving a scenario on the
Unix socket discovery expects, and prosperod processes started against it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

import pytest

from prospero.core.caliband_client import CalibandClient
from prospero.core.discovery import socket_path_for
from prospero.core.sources import canonical_root
from prospero.core.wire.control import AgentRecord, UnixEndpoint
from prospero.testkit.acp_scripts import AcpScript
from prospero.testkit.faults import Scenario
from tests.core.fleet_fixtures import make_git_repo
from tests.support import short_tmpdir

PYTHON = sys.executable
URL_RE = re.compile(r"listening on (http://[^\s\"]+)")
POLL_INTERVAL = 0.02

T = TypeVar("T")


def log_file(path: Path) -> IO[bytes]:
    return open(path, "wb")


async def poll(fn: Callable[[], T | None], timeout: float, what: str) -> T:
    """Bounded polling of a sync function for a truthy value."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(POLL_INTERVAL)


def transcript(rec: AgentRecord) -> list[bytes]:
    path = Path(rec.session_dir) / "stdout.ndjson"
    try:
        return path.read_bytes().splitlines()
    except OSError:
        return []


@dataclass
class Fleet:
    """A git workspace served by a fake caliband process; `procs` are stopped at the end."""

    tmp: Path
    root: str
    sock: str
    env: dict[str, str]
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)

    async def records(self) -> dict[str, AgentRecord]:
        return {r.id: r for r in await CalibandClient(UnixEndpoint(path=self.sock)).list()}

    async def start_prosperod(
        self, name: str, *args: str
    ) -> tuple[asyncio.subprocess.Process, str]:
        """`python -m prospero.daemon` on a free port with `args`; returns it and its URL."""
        log = self.tmp / f"prosperod-{name}.log"
        with log_file(log) as fh:
            proc = await asyncio.create_subprocess_exec(
                PYTHON, "-m", "prospero.daemon", "--no-autostart", "--addr", "127.0.0.1:0",
                "--poll-interval-ms", "200", "--log-level", "info", *args,
                stdout=asyncio.subprocess.DEVNULL, stderr=fh, env=self.env,
            )  # fmt: skip
        self.procs.append(proc)

        def url() -> str | None:
            m = URL_RE.search(log.read_text(errors="replace"))
            if proc.returncode is not None:
                raise AssertionError(f"prosperod {name} exited early:\n{log.read_text()[-3000:]}")
            return m.group(1) if m else None

        return proc, await poll(url, 60, f"prosperod {name} ready")


@contextlib.asynccontextmanager
async def fake_fleet(
    monkeypatch: pytest.MonkeyPatch,
    scenario: Scenario,
    *,
    stop: signal.Signals = signal.SIGKILL,
    acp_script: AcpScript | None = None,
) -> AsyncIterator[Fleet]:
    """The fake caliband process for `scenario` (its ACP agents play `acp_script`); at the end
    it gets SIGTERM and every other process `stop`, and the temp dirs go."""
    tmp = Path(short_tmpdir())
    runtime = short_tmpdir()
    root = canonical_root(str(make_git_repo(tmp / "app")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROSPERO_")}
    env.update(CALIBAN_DAEMON_RUNTIME_DIR=runtime, XDG_DATA_HOME=str(tmp / "xdg"))
    monkeypatch.setenv("CALIBAN_DAEMON_RUNTIME_DIR", runtime)
    sock = socket_path_for(root)
    Path(sock).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    scen = tmp / "scenario.json"
    scen.write_bytes(scenario.model_dump_json().encode())
    fleet = Fleet(tmp=tmp, root=root, sock=sock, env=env)
    extra: list[str] = []
    if acp_script is not None:
        acp_file = tmp / "acp-script.json"
        acp_file.write_bytes(acp_script.to_json())
        extra = ["--acp-script", str(acp_file)]
    cal = await asyncio.create_subprocess_exec(
        PYTHON, "-m", "prospero.testkit.fake_caliband", "--socket", sock,
        "--workspace-root", root, "--scenario", str(scen), "--data-base", str(tmp / "caliband"),
        *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env,
    )  # fmt: skip
    fleet.procs.append(cal)
    try:
        assert cal.stdout is not None
        ready = await asyncio.wait_for(cal.stdout.readline(), 60)
        assert ready.startswith(b"ready "), ready
        yield fleet
    finally:
        for p in reversed(fleet.procs):
            if p.returncode is None:
                p.send_signal(signal.SIGTERM if p is cal else stop)
                try:
                    await asyncio.wait_for(p.wait(), 20)
                except TimeoutError:
                    p.kill()
                    await p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)
