"""A real prosperod-equivalent server for CLI tests, run in its own thread and event loop.

The CLI is a blocking HTTP client (and `CliRunner.invoke` is synchronous), so the server cannot
share the test's event loop: `LiveStack` runs Runtime + uvicorn (the API helper's `ApiServer`,
ephemeral port) + one FakeCaliband per workspace on a background loop, and exposes blocking
helpers for the tests. Workspaces are real git repos (worktree isolation needs a commit).

Caliband discovery is pointed at a short private runtime dir through the daemon's
`default_env` overlay (`CALIBAN_DAEMON_RUNTIME_DIR`), so the test process env is untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, Self, TypeVar

import httpx
import pytest
from typer.testing import CliRunner

from prospero.api.app import create_app
from prospero.api.server import ApiServer
from prospero.api.settings import ApiSettings
from prospero.cli.main import app as cli_app
from prospero.core.discovery import socket_path_for
from prospero.core.sources import canonical_root
from prospero.core.tokens import TokenTable
from prospero.core.wire.control import SpawnSpec
from prospero.daemon.runtime import DaemonConfig, Runtime
from prospero.testkit import scripts
from prospero.testkit.fake_caliband import FakeCaliband
from tests.api.conftest import budget_script
from tests.support import poll_until_sync, short_tmpdir

T = TypeVar("T")

RATED_MODEL = "claude-sonnet-4-6"  # in the default rate card: costs are computed


def cli_script_for(spec: SpawnSpec) -> scripts.Script:
    """The fake agent's script, chosen by a keyword in the prompt."""
    prompt = spec.initial_prompt.lower()
    if spec.interactive or "interactive" in prompt:
        return scripts.interactive_script("Ready when you are.")
    if "budget" in prompt:  # 600 tokens ($0.0042) a turn, 8 turns
        return budget_script(pause=0.3)
    if "slow" in prompt:
        # Stays running until killed: some output, then a long pause before RunEnd.
        return [
            *scripts.text_script(2, final=False),
            scripts.sleep(120),
            scripts.run_end("EndOfTurn"),
        ]
    if "paced" in prompt:
        # Finishes after a few seconds of live output (for follow/resume tests).
        out: scripts.Script = [scripts.turn_start(0, model=RATED_MODEL)]
        for i in range(40):
            out += [scripts.text_delta(f"chunk {i:03d}\n", 0, 0), scripts.sleep(0.05)]
        out += [
            scripts.turn_end(0, content=[scripts.text_block("paced")], output_tokens=40),
            scripts.run_end("EndOfTurn", turn_count=1, input_tokens=10, output_tokens=40),
        ]
        return out
    if "fail" in prompt:
        return [
            scripts.turn_start(0, model=RATED_MODEL),
            scripts.text_delta("Trying.", 0, 0),
            scripts.turn_end(0, content=[scripts.text_block("Trying.")]),
            scripts.run_end({"ProviderError": "ANTHROPIC_API_KEY is not set"}, turn_count=1),
        ]
    # Default: thinking, text, a Grep tool call with a result, a failing Bash call, an answer.
    script = scripts.tool_run_script(
        prompt=spec.initial_prompt,
        tool="Grep",
        tool_input={"pattern": "def main", "path": "src"},
        result_text="src/app.py:3:def main():\n",
        model=RATED_MODEL,
    )
    end = script.pop()  # RunEnd: add a failing tool in a third turn before it
    script += [
        scripts.turn_start(2, model=RATED_MODEL),
        scripts.tool_call_start("toolu_02", "Bash", 2),
        scripts.tool_call_input_delta("toolu_02", '{"command":"false"}', 2),
        scripts.tool_call_end("toolu_02", "exit status 1", is_error=True, turn_index=2),
        scripts.turn_end(2, stop_reason="tool_use", input_tokens=950, output_tokens=20),
    ]
    end["turn_count"] = 3
    script.append(end)
    return script


def git_repo(path: Path) -> Path:
    """A git repository with one commit (what worktree isolation needs)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "README.md").write_text(f"# {path.name}\n")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "HOME": str(path),
    }
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "init"]):
        subprocess.run(["git", "-c", "commit.gpgsign=false", *args], cwd=path, env=env, check=True)
    return path


class LiveStack:
    """Runtime + HTTP API + fake calibands on a background event loop."""

    def __init__(self, tmp: Path, tokens: dict[str, str] | None = None, **config: Any) -> None:
        self.tmp = tmp
        self.tokens = dict(tokens or {})
        self.config = config  # extra DaemonConfig fields (e.g. allow_acp=True)
        self.rundir = short_tmpdir()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="cli-stack", daemon=True)
        self.runtime: Runtime | None = None
        self.server: ApiServer | None = None
        self.fakes: dict[str, FakeCaliband] = {}
        self.url = ""

    # --- running things on the stack's loop ------------------------------------------------

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> None:
        self.thread.start()
        self.call(self._start())

    async def _start(self) -> None:
        # Autostart is off unless asked for; `default_env` given is laid over the runtime dir.
        extra: dict[str, Any] = {"autostart": False, **self.config}
        extra["default_env"] = {
            "CALIBAN_DAEMON_RUNTIME_DIR": self.rundir,
            **self.config.get("default_env", {}),
        }
        cfg = DaemonConfig(
            bind_host="127.0.0.1",
            port=0,
            data_dir=self.tmp / "data",
            host_label="cli-test",
            poll_interval=0.1,
            **extra,
        )
        self.runtime = Runtime(cfg)
        await self.runtime.start()
        settings = ApiSettings(
            tokens=TokenTable.from_plaintext(self.tokens), heartbeat_interval=1.0, access_log=False
        )
        self.server = ApiServer(
            create_app(self.runtime, settings), "127.0.0.1", 0, graceful_timeout=3
        )
        await self.server.start()
        self.url = self.server.url

    @contextlib.contextmanager
    def serving(self, *workspaces: str) -> Iterator[Self]:
        """Start the stack with `workspaces` added; stop it on exit (a module fixture's body)."""
        self.start()
        try:
            for name in workspaces:
                self.add_workspace(name)
            yield self
        finally:
            self.stop()

    def add_workspace(self, name: str, *, register: bool = True) -> str:
        root = canonical_root(str(git_repo(self.tmp / "repos" / name)))

        async def go() -> None:
            path = socket_path_for(root, {"CALIBAN_DAEMON_RUNTIME_DIR": self.rundir})
            self.fakes[name] = await FakeCaliband.start_unix(
                path, root=root, script_for=cli_script_for
            )
            if register:
                assert self.runtime is not None and self.runtime.manager is not None
                await self.runtime.manager.add_workspace(name, root)

        self.call(go())
        return root

    def stop(self) -> None:
        async def go() -> None:
            if self.server is not None:
                await self.server.stop()
            if self.runtime is not None:
                await self.runtime.stop()
            await asyncio.gather(*(f.stop() for f in self.fakes.values()), return_exceptions=True)

        try:
            self.call(go(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            with contextlib.suppress(Exception):
                self.loop.close()
            shutil.rmtree(self.rundir, ignore_errors=True)

    # --- blocking HTTP helpers for assertions ----------------------------------------------

    def get(self, path: str) -> httpx.Response:
        headers = {}
        if self.tokens:
            headers["Authorization"] = f"Bearer {next(iter(self.tokens.values()))}"
        return httpx.get(self.url + path, timeout=10.0, headers=headers)

    def agent(self, agent_id: str) -> dict[str, Any] | None:
        r = self.get(f"/api/agents/{agent_id}")
        return r.json() if r.status_code == 200 else None

    def events(self, agent_id: str) -> list[dict[str, Any]]:
        r = self.get(f"/api/agents/{agent_id}/events")
        assert r.status_code == 200, r.text
        return list(r.json())

    def wait_for(self, cond: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
        """Bounded polling (no fixed sleeps): returns cond()'s first truthy value."""
        return poll_until_sync(cond, timeout, what)

    def wait_status(self, agent_id: str, *statuses: str, timeout: float = 20.0) -> dict[str, Any]:
        return self.wait_for(
            lambda: (a := self.agent(agent_id)) is not None and a["status"] in statuses and a,
            timeout,
            f"{agent_id} in {statuses}",
        )

    def wait_finished(self, agent_id: str, timeout: float = 20.0) -> list[dict[str, Any]]:
        def done() -> list[dict[str, Any]] | None:
            evs = self.events(agent_id)
            return evs if any(e["kind"]["kind"] == "agent_finished" for e in evs) else None

        return self.wait_for(done, timeout, f"{agent_id} finished")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    with LiveStack(tmp_path_factory.mktemp("cli")).serving("alpha", "beta") as stack:
        yield stack


class Cli:
    """Runs the real CLI app in-process (typer's CliRunner) against a given address, with a
    config folder of its own (XDG_CONFIG_HOME: no context of the machine's user applies)."""

    def __init__(self, addr: str, config_home: Path | None = None) -> None:
        self.addr = addr
        self.runner = CliRunner()
        self.config_home = config_home or Path(short_tmpdir())

    def __call__(
        self,
        *args: str,
        addr: str | None = None,
        input: str | None = None,
        token: str = "",
        env: dict[str, str | None] | None = None,
    ) -> Any:
        full: dict[str, str | None] = {
            "PROSPERO_ADDR": addr if addr is not None else self.addr,
            "PROSPERO_API_TOKEN": token,
            "PROSPERO_CONTEXT": None,
            "PROSPERO_CLI_CONFIG": None,
            "XDG_CONFIG_HOME": str(self.config_home),
            "NO_COLOR": "1",
            **(env or {}),
        }
        return self.runner.invoke(cli_app, list(args), env=full, input=input)


@pytest.fixture(scope="module")
def cli(live: LiveStack, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    return Cli(live.url, tmp_path_factory.mktemp("xdg"))


def free_port() -> int:
    """A port nothing listens on (bound then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
