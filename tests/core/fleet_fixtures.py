"""Fixtures shared by LocalFleet and FleetManager tests: a git workspace served by a fake
caliband at the socket path discovery computes for it."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from prospero.core.bus import InProcessBus
from prospero.core.discovery import socket_path_for
from prospero.core.emitter import Emitter
from prospero.core.fleet.local import LocalFleet, LocalFleetConfig
from prospero.core.fleet.manager import DriverFactory, FleetConfig, FleetManager
from prospero.core.metrics import Metrics
from prospero.core.sources import canonical_root
from prospero.core.store.sqlite.events import SqliteConfigStore, SqliteEventStore
from prospero.core.wire.control import SpawnSpec
from prospero.testkit import scripts
from prospero.testkit.fake_caliband import FakeCaliband
from prospero.types.events import FleetEvent
from prospero.types.model import RegisteredWorkspace
from tests.support import short_tmpdir


def make_git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@e",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@e",
        "PATH": "/usr/bin:/bin",
    }
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True, env=env)
    (path / "README.md").write_text("# demo\n")
    subprocess.run(["git", "-C", str(path), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(path), "commit", "-qm", "init"], check=True, env=env)
    return path


def by_prompt(spec: SpawnSpec) -> Sequence[dict[str, Any] | str]:
    """Scripts chosen by a keyword in the prompt."""
    p = spec.initial_prompt
    if p.startswith("long"):
        return [scripts.turn_start(0), scripts.sleep(3600), scripts.run_end()]
    if p.startswith("tool"):
        return scripts.tool_run_script()
    if p.startswith("crash"):
        return scripts.crash_script(2, 1)
    if p.startswith("chat"):
        return scripts.interactive_script()
    return scripts.default_script()


@dataclass
class FleetEnv:
    root: Path
    fake: FakeCaliband
    workspace: RegisteredWorkspace
    sock: str
    script_for: Callable[[SpawnSpec], Sequence[dict[str, Any] | str]]
    extra: dict[str, Any] = field(default_factory=dict)

    async def restart_fake(self) -> FakeCaliband:
        self.fake = await FakeCaliband.start_unix(
            self.sock, root=self.root, script_for=self.script_for
        )
        return self.fake


@pytest.fixture
async def fleet_env(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FleetEnv]:
    runtime_dir = short_tmpdir()
    monkeypatch.setenv("CALIBAN_DAEMON_RUNTIME_DIR", runtime_dir)
    work = Path(short_tmpdir())
    root = make_git_repo(work / "app")
    canon = canonical_root(str(root))
    sock = socket_path_for(canon)
    Path(sock).parent.mkdir(parents=True, exist_ok=True)
    fake = await FakeCaliband.start_unix(sock, root=canon, script_for=by_prompt)
    env = FleetEnv(
        root=Path(canon),
        fake=fake,
        workspace=RegisteredWorkspace(name="app", root=canon),
        sock=sock,
        script_for=by_prompt,
    )
    try:
        yield env
    finally:
        await env.fake.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(runtime_dir, ignore_errors=True)


def local_fleet() -> LocalFleet:
    return LocalFleet(LocalFleetConfig(autostart=False, startup_timeout=2.0, request_timeout=5.0))


class ManagedStores:
    """The SQLite event and config stores on `db`, an Emitter over them and a FleetManager on
    LocalFleet: what the fleet and fault stacks share. Subclasses set `db` and `metrics`."""

    db: Path
    metrics: Metrics

    async def open_stores(self) -> None:
        self.store = SqliteEventStore(self.db)
        await self.store.open()
        self.config_store = SqliteConfigStore(self.db)
        await self.config_store.open()
        self.bus = InProcessBus()
        self.emitter = Emitter(self.store, self.bus, self.metrics)
        await self.emitter.start()

    def new_manager(
        self, config: FleetConfig, factories: dict[str, DriverFactory], **kw: Any
    ) -> FleetManager:
        return FleetManager(
            local_fleet(),
            self.config_store,
            self.store,
            self.emitter,
            self.metrics,
            config,
            driver_factories=factories,
            **kw,
        )

    async def close_stores(self, manager: FleetManager) -> None:
        await manager.stop()
        await self.emitter.close()
        await self.config_store.close()
        await self.store.close()

    async def events(self, key: str) -> list[FleetEvent]:
        await self.emitter.flush()
        return await self.store.replay(key)

    async def kinds(self, key: str) -> list[str]:
        return [e.kind.kind for e in await self.events(key)]
