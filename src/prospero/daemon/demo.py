"""`prospero demo`: prosperod serving a scripted fleet, for a first look without caliban.

    python -m prospero.daemon.demo [--port 7878] [--host 127.0.0.1] [--data-dir DIR]

What it sets up:

- a data dir (a temp dir, or `--data-dir` to keep history between runs) holding the event
  store and two workspaces that are real git repos (`payments-api`, `docs-site`);
- one fake caliband per workspace (`prospero.testkit.FakeCaliband`) listening on the Unix
  socket discovery expects, under a short private `CALIBAN_DAEMON_RUNTIME_DIR` (autostart is
  off, so no real caliband is ever started);
- prosperod itself (the same `serve()` as the real daemon), with the workspaces registered and
  the agents of `prospero.testkit.demo_scripts.DEMO_FLEET` spawned: text, thinking, tool calls
  with results, a failing tool, a failed run, a long run to `follow`, and an interactive agent
  waiting for input. Agents spawned later (API, CLI, dashboard) play a scripted session too.
- ACP (ADR 0011; the demo runs with `allow_acp` on): the fake calibands serve ACP agents with a
  scripted ACP peer (`acp_script_for`); the fleet includes an ACP agent (`DEMO_ACP_FLEET`,
  seeded when prosperod has an ACP driver), and `prospero spawn WS "..." --drive-protocol acp`
  works (the banner suggests it with `--posture supervised`: the scripted agent asks to edit a
  file, and under the default posture, autonomous, that request is denied).
- Permission decisions (ADR 0006): the ACP agent `acp-supervised-edit` is spawned with posture
  `supervised`; it stops on its permission request to edit a file until someone answers it:
  `prospero decisions` lists the request, `prospero approve ID` lets the agent finish (the
  audit shows who approved), `prospero deny ID` makes it skip the edit.

It prints the URL and runs until Ctrl-C / SIGTERM, then shuts down cleanly and removes what it
created (except a `--data-dir`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prospero.api.server import ApiServer
from prospero.core.discovery import socket_path_for
from prospero.core.errors import ProsperoError
from prospero.core.sources import canonical_root
from prospero.daemon.config import ConfigError, parse_host_list, parse_public_url
from prospero.daemon.main import EXIT_FAILURE, serve, setup_logging
from prospero.daemon.runtime import DaemonConfig, Runtime
from prospero.testkit.demo_scripts import (
    DEMO_ACP_FLEET,
    DEMO_FLEET,
    DEMO_WORKSPACES,
    acp_script_for,
    script_for,
)
from prospero.testkit.fake_caliband import FakeCaliband
from prospero.types.api import SpawnRequest

log = logging.getLogger("prospero.demo")

DEFAULT_PORT = 7878
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Prospero Demo",
    "GIT_AUTHOR_EMAIL": "demo@prospero.invalid",
    "GIT_COMMITTER_NAME": "Prospero Demo",
    "GIT_COMMITTER_EMAIL": "demo@prospero.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


class DemoError(Exception):
    pass


def _git(cwd: Path, *args: str) -> None:
    env = {**os.environ, **GIT_ENV, "HOME": str(cwd)}  # ignore the user's ~/.gitconfig
    try:
        res = subprocess.run(
            ["git", "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError as e:
        raise DemoError("the demo needs `git` on PATH (workspaces are git repositories)") from e
    if res.returncode != 0:
        raise DemoError(f"git {' '.join(args)} failed in {cwd}: {res.stderr.strip()}")


def make_workspace_repo(root: Path, files: dict[str, str]) -> None:
    """A git repo with the given files and one commit (kept as is if it already exists)."""
    if (root / ".git").exists():
        return
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    # The fake caliband makes per-agent worktrees under .caliban/; keep them out of `status`.
    (root / ".gitignore").write_text(".caliban/\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "Initial commit")


class Demo:
    """Owns the demo's directories and fake calibands around one prosperod `serve()`."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        data_dir: str | None = None,
        poll_interval: float = 1.0,
        out: Any = None,
        allowed_hosts: Sequence[str] = (),
        public_url: str | None = None,
        api_tokens_file: str | None = None,
    ) -> None:
        self.host = host
        self.api_tokens_file = Path(api_tokens_file).absolute() if api_tokens_file else None
        self.allowed_hosts = list(allowed_hosts)
        self.public_url = public_url
        self.port = port
        self.poll_interval = poll_interval
        self.out = out or sys.stdout
        self._own_data_dir = data_dir is None
        self.data_dir = Path(
            data_dir if data_dir is not None else tempfile.mkdtemp(prefix="prospero-demo-")
        ).absolute()
        # Unix socket paths are limited to ~107 bytes: keep the runtime dir short.
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="pd-", dir="/tmp"))
        self.fakes: dict[str, FakeCaliband] = {}
        self.roots: dict[str, str] = {}
        self.spawned: list[tuple[str, str, str]] = []  # (agent id, workspace, label)
        self._stopping = False
        self._ready = False
        self._watchers: list[asyncio.Task[None]] = []

    async def start_fakes(self) -> None:
        os.environ["CALIBAN_DAEMON_RUNTIME_DIR"] = str(self.runtime_dir)
        for name, files in DEMO_WORKSPACES.items():
            repo = self.data_dir / "workspaces" / name
            await asyncio.to_thread(make_workspace_repo, repo, files)
            root = canonical_root(str(repo))
            self.roots[name] = root
            fake_data = self.runtime_dir / f"cal-{name}"
            path = socket_path_for(root)
            fake = await FakeCaliband.start_unix(
                path,
                root=root,
                script_for=script_for,
                acp_script_for=acp_script_for,
                data_dir=fake_data,
            )
            self.fakes[name] = fake
            self._watchers.append(
                asyncio.create_task(self._relisten(fake, path), name=f"demo-relisten-{name}")
            )

    async def _relisten(self, fake: FakeCaliband, path: str) -> None:
        """Stand in for autostart: prosperod asks a workspace's caliband to shut down when its
        provider config changes (`prospero workspace config`), expecting a restart; listen
        again on the same socket, keeping the agents."""
        while not self._stopping:
            await asyncio.sleep(0.25)
            if self._stopping or fake.accepting:
                continue
            await asyncio.sleep(0.5)  # let prosperod see the socket go away first
            if self._stopping:
                return
            try:
                await fake.listen_unix(path)
            except OSError as e:
                log.warning("demo: cannot restart the fake caliband on %s: %s", path, e)
                return

    async def seed(self, runtime: Runtime) -> None:
        mgr = runtime.manager
        assert mgr is not None
        for name, root in self.roots.items():
            await mgr.add_workspace(name, root)
        fleet = list(DEMO_FLEET)
        if "acp" not in mgr.driver_factory_names():
            log.info("demo: no ACP driver in this build; not seeding the ACP agents")
            fleet = [a for a in fleet if a.drive_protocol != "acp"]
        for a in fleet:
            req = SpawnRequest(
                prompt=a.prompt,
                label=a.label,
                model=a.model,
                isolation="shared" if a.shared_tree else None,
                interactive=a.interactive,
                drive_protocol=a.drive_protocol,
                posture=a.posture,
            )
            try:
                res = await mgr.spawn(a.workspace, req)
            except ProsperoError as e:
                log.warning("demo: spawning %s failed: %s", a.label, e)
                continue
            self.spawned.append((res.agent_id, a.workspace, a.label))

    def banner(self, url: str, paths: set[str] | None = None) -> str:
        lines = [f"Prospero demo running at {url} — Ctrl-C to stop", ""]
        lines.append(f"  data dir   {self.data_dir}")
        if self.api_tokens_file is not None:
            lines.append(
                f"  API tokens {self.api_tokens_file}  (sign in to the dashboard with one; "
                "the CLI takes --token or PROSPERO_API_TOKEN)"
            )
        addr = "" if url == f"http://127.0.0.1:{DEFAULT_PORT}" else f" --addr {url}"
        paths = paths or set()
        if "/" in paths:
            lines.append(f"  dashboard  {url}/")
        if "/docs" in paths:
            lines.append(f"  API docs   {url}/docs  (OpenAPI: {url}/openapi.json)")
        lines.append("")
        lines.append("  agents:")
        for agent_id, ws, label in self.spawned:
            lines.append(f"    {agent_id}  {ws:<13} {label}")
        lines.append("")
        lines.append("  try:")
        lines.append(f"    prospero{addr} ls")
        if self.spawned:
            long_run = next((i for i, _w, lb in self.spawned if lb == "httpx-upgrade"), None)
            lines.append(f"    prospero{addr} follow {long_run or self.spawned[0][0]}")
            inter = next((i for i, _w, lb in self.spawned if lb == "changelog-pairing"), None)
            if inter:
                lines.append(f'    prospero{addr} send {inter} "Both, please"')
                lines.append(f"    prospero{addr} end-input {inter}")
            acp_labels = {a.label for a in DEMO_ACP_FLEET}
            acp_agent = next((i for i, _w, lb in self.spawned if lb in acp_labels), None)
            if acp_agent:
                lines.append(f"    prospero{addr} follow {acp_agent}   # an ACP agent")
            if any(lb == "acp-supervised-edit" for _i, _w, lb in self.spawned):
                lines.append(
                    f"    prospero{addr} decisions          # a supervised agent waits for you"
                )
                lines.append(f"    prospero{addr} approve DECISION_ID")
        lines.append(f'    prospero{addr} spawn payments-api "Add a health endpoint"')
        if any(lb in {a.label for a in DEMO_ACP_FLEET} for _i, _w, lb in self.spawned):
            # Supervised: it asks before it edits, and waits for the answer. Under the default
            # posture (autonomous) nobody would be asked: every edit denied.
            lines.append(
                f'    prospero{addr} spawn payments-api "Add a health endpoint" '
                "--drive-protocol acp --posture supervised"
            )
            lines.append(
                f"        # an ACP agent that asks before each edit: prospero{addr} decisions "
                "lists it, approve DECISION_ID lets it edit"
            )
        lines.append(f"    prospero{addr} usage")
        return "\n".join(lines)

    async def stop(self) -> None:
        self._stopping = True
        for t in self._watchers:
            t.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        await asyncio.gather(*(f.stop() for f in self.fakes.values()), return_exceptions=True)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
        if self._own_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    async def run(self, stop_event: asyncio.Event | None = None) -> int:
        try:
            await self.start_fakes()
        except DemoError as e:
            print(f"prospero demo: {e}", file=sys.stderr)
            await self.stop()
            return EXIT_FAILURE
        config = DaemonConfig(
            bind_host=self.host,
            port=self.port,
            data_dir=self.data_dir,
            host_label="demo",
            poll_interval=self.poll_interval,
            autostart=False,
            allowed_hosts=self.allowed_hosts,
            public_url=self.public_url,
            api_tokens_file=self.api_tokens_file,
            allow_acp=True,
        )
        runtime = Runtime(config)

        async def on_ready(server: ApiServer) -> None:
            await self.seed(runtime)
            self._ready = True
            paths = {str(getattr(r, "path", "")) for r in server.app.routes}
            print(self.banner(server.url, paths), file=self.out, flush=True)

        try:
            code = await serve(config, runtime=runtime, stop_event=stop_event, on_ready=on_ready)
        finally:
            await self.stop()
        if code != 0 and not self._ready:
            print(
                f"prospero demo: prosperod did not start (see above); if port {self.port} is "
                "taken, pick another one: prospero demo --port 0",
                file=sys.stderr,
            )
        return code


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="prospero demo",
        description="Run prosperod with fake calibands serving a scripted demo fleet.",
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="HTTP port (0 = any free)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--data-dir", default=None, help="keep demo data here (default: a temp dir)")
    p.add_argument("--poll-interval", type=float, default=1.0, help="fleet poll cadence (s)")
    p.add_argument("--log-level", default="warning", help="log level (default warning)")
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="HOST",
        help="serve this Host name besides loopback (repeatable; `*.example.com`)",
    )
    p.add_argument("--public-url", default=None, help="the URL browsers reach the demo at")
    p.add_argument(
        "--api-tokens-file",
        default=None,
        metavar="FILE",
        help="require scoped API tokens from this file (prospero token new ... --tokens-file FILE)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging("text", args.log_level)
    try:
        allowed = parse_host_list(args.allowed_host, "--allowed-host")
        public_url = parse_public_url(args.public_url, "--public-url") if args.public_url else None
    except ConfigError as e:
        print(f"prospero demo: {e}", file=sys.stderr)
        return 2
    demo = Demo(
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        poll_interval=args.poll_interval,
        allowed_hosts=allowed,
        public_url=public_url,
        api_tokens_file=args.api_tokens_file,
    )
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(demo.run())
    return 130


if __name__ == "__main__":
    sys.exit(main())
