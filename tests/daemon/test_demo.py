"""`prospero demo` as a newcomer runs it: a real process, a free port, the CLI against it,
then SIGTERM and a clean exit."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from prospero.testkit.demo_scripts import DEMO_FLEET
from tests.support import poll_until_sync

CONSOLE_SCRIPT = Path(sys.executable).parent / "prospero"
BANNER = re.compile(r"Prospero demo running at (http://127\.0\.0\.1:\d+) — Ctrl-C to stop")



def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    return poll_until_sync(cond, timeout, what)


class DemoProcess:
    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PROSPERO_", "CALIBAN_"))}
        # `prospero demo` execs `python -m prospero.daemon.demo`: the same pid gets SIGTERM.
        self.proc = subprocess.Popen(
            [str(CONSOLE_SCRIPT), "demo", "--port", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, False), daemon=True).start()

    def _pump(self, stream: Any, is_out: bool) -> None:
        for line in stream:
            (self.stdout if is_out else self.stderr).append(line)
            if is_out:
                self.lines.put(line)

    def wait_banner(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"demo exited early: {''.join(self.stderr)}")
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            m = BANNER.search(line)
            if m:
                return m.group(1)
        raise AssertionError(f"no banner within {timeout}s: {''.join(self.stderr)}")

    def banner_text(self) -> str:
        return "".join(self.stdout)


@pytest.fixture
def demo() -> Iterator[DemoProcess]:
    d = DemoProcess()
    try:
        yield d
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(10)


def cli(url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROSPERO_")}
    env["NO_COLOR"] = "1"
    return subprocess.run(
        [str(CONSOLE_SCRIPT), "--addr", url, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_demo_serves_a_fleet_and_stops_cleanly(demo: DemoProcess) -> None:
    url = demo.wait_banner()

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=5).text == "ok"
        except httpx.HTTPError:
            return False

    wait_for(healthy, 20, "healthz")

    fleet = httpx.get(f"{url}/api/fleet", timeout=10).json()
    names = {w["name"] for w in fleet["workspaces"]}
    assert names == {"payments-api", "docs-site"}
    agents = {a["label"]: a for w in fleet["workspaces"] for a in w["agents"]}
    assert set(agents) == {a.label for a in DEMO_FLEET}
    assert agents["readme-summary"]["isolated"] is False
    assert agents["changelog-pairing"]["interactive"] is True
    data_dir = re.search(r"data dir\s+(\S+)", demo.banner_text())
    assert data_dir and Path(data_dir.group(1)).is_dir()
    for a in agents.values():
        assert a["id"] in demo.banner_text()

    # The CLI works against it. The four flows below are independent of each other, so they
    # run concurrently (each CLI call is a process paying ~1 s of imports, and the follows wait
    # for scripted agents at their pace): the same calls and assertions, ~2x less wall time.
    def cli_ls() -> None:
        res = cli(url, "ls", "-o", "json")
        assert res.returncode == 0, res.stderr
        assert {w["name"] for w in json.loads(res.stdout)["workspaces"]} == names

    # Follow runs to the end: a clean run with tools and costs, and a failed run.
    def follow_clean_run() -> None:
        res = cli(url, "follow", agents["refund-validation"]["id"])
        assert res.returncode == 0, res.stderr
        for needle in ("⚙ Grep", "✓ Grep", "⚙ Read", "⚙ Edit", "⚙ Bash", "✓ Bash  8 passed"):
            assert needle in res.stdout, res.stdout
        assert re.search(r"^\[finished\] EndOfTurn — \$\d+\.\d{4}, 5 turns, ", res.stdout, re.M)

    def follow_failed_run() -> None:
        res = cli(url, "follow", agents["migration-guide"]["id"])
        assert res.returncode == 0, res.stderr
        assert "[finished] ProviderError — " in res.stdout and "overloaded" in res.stdout

        flaky_id = agents["flaky-webhook-test"]["id"]
        flaky = httpx.get(f"{url}/api/agents/{flaky_id}/events", timeout=10)
        finished_tools = [e["kind"] for e in flaky.json() if e["kind"]["kind"] == "tool_finished"]
        assert any(not k["ok"] for k in finished_tools)  # a failed tool is part of the show

    # The interactive agent waits for input, answers, and finishes on end-input.
    def interactive() -> None:
        inter = agents["changelog-pairing"]["id"]
        wait_for(
            lambda: httpx.get(f"{url}/api/agents/{inter}", timeout=5).json()["status"] == "idle",
            30,
            "interactive agent idle",
        )
        assert cli(url, "send", inter, "Both, please").returncode == 0
        assert cli(url, "end-input", inter).returncode == 0
        res = cli(url, "follow", inter)
        assert res.returncode == 0, res.stderr
        assert "echo: Both, please" in res.stdout and "[finished] EndOfTurn" in res.stdout

    # Agents spawned during the demo play a scripted session too.
    def spawned_session() -> None:
        res = cli(url, "spawn", "payments-api", "Add a health endpoint", "-o", "json")
        assert res.returncode == 0, res.stderr
        new_id = json.loads(res.stdout)["agent_id"]
        res = cli(url, "follow", new_id)
        assert res.returncode == 0, res.stderr
        assert "Add a health endpoint" in res.stdout and "[finished] EndOfTurn — $" in res.stdout

    flows = (cli_ls, follow_clean_run, follow_failed_run, interactive, spawned_session)
    with ThreadPoolExecutor(max_workers=len(flows)) as pool:
        for f in [pool.submit(flow) for flow in flows]:
            f.result()  # re-raises a flow's assertion error

    demo.proc.send_signal(signal.SIGTERM)
    assert demo.proc.wait(30) == 0, "".join(demo.stderr)
    assert "Traceback" not in "".join(demo.stderr)
    assert not Path(data_dir.group(1)).exists()  # the temp data dir is cleaned up
