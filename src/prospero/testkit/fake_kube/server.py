"""`FakeKube`: the fake apiserver on a real socket, in the caller's asyncio loop.

    async with FakeKube(operator=True, endpoint=lambda task: "127.0.0.1:7443") as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path)   # kubectl --kubeconfig, any client
        kube.compact()        # forget history: a watch from an older revision gets 410
        kube.cut_watches()    # end every open watch stream
        kube.bookmark()       # a BOOKMARK now on watches that allow them

Plain HTTP on 127.0.0.1 (kubectl needs no TLS for an `http://` server). The CRDs shipped in
`crds/` (the same files as `deploy/crds/`) are installed at start unless `install_crds=False`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator
from importlib import resources as importlib_resources
from pathlib import Path
from types import TracebackType
from typing import Any

import uvicorn
import yaml

from prospero.core.aio import wait_for
from prospero.testkit.fake_kube import resources
from prospero.testkit.fake_kube.app import FakeKubeApp
from prospero.testkit.fake_kube.operator import EndpointFn, FakeOperator
from prospero.testkit.fake_kube.store import Store
from prospero.testkit.fake_kube.verbs import Kube, Params


def bundled_crds() -> list[dict[str, Any]]:
    folder = importlib_resources.files("prospero.testkit.fake_kube") / "crds"
    docs = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            docs.append(yaml.safe_load(entry.read_text()))
    return docs


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the owner of the loop handles signals


class FakeKube:
    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        bookmark_interval: float = 60.0,
        max_events: int = 10_000,
        install_crds: bool = True,
        operator: bool = False,
        endpoint: EndpointFn | None = None,
        step_delay: float = 0.0,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.kube = Kube(Store(max_events=max_events))
        if install_crds:
            for crd in bundled_crds():
                self.kube.create(resources.CRDS, "", crd, Params({"fieldManager": "fake-kube"}), "fake-kube")
        self.app = FakeKubeApp(self.kube, bookmark_interval=bookmark_interval)
        self.operator = FakeOperator(self.kube, endpoint=endpoint, step_delay=step_delay) if operator or endpoint else None
        self._sock: socket.socket | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        assert self._sock is not None, "not started"
        return int(self._sock.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def store(self) -> Store:
        return self.kube.store

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.requested_port))
        sock.listen(128)
        sock.setblocking(False)
        self._sock = sock
        self.app.server_address = f"{self.host}:{self.port}"
        config = uvicorn.Config(self.app, lifespan="off", ws="none", access_log=False, log_config=None, timeout_graceful_shutdown=1)
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="fake-kube")
        while not self._server.started:
            if self._task.done():
                raise RuntimeError(f"fake kube-apiserver failed to start: {self._task.exception()!r}")
            await asyncio.sleep(0.01)
        if self.operator is not None:
            await self.operator.start()

    async def stop(self) -> None:
        if self.operator is not None:
            await self.operator.stop()
        self.kube.store.close_watchers()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            try:
                await wait_for(asyncio.shield(self._task), 5)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._task
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()

    async def __aenter__(self) -> FakeKube:
        await self.start()
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    # test hooks ----------------------------------------------------------------------------

    def compact(self, rv: int | None = None) -> int:
        return self.kube.store.compact(rv)

    def cut_watches(self) -> None:
        self.kube.store.close_watchers()

    def bookmark(self) -> None:
        self.kube.store.bookmark_all()

    def kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake-kube", "cluster": {"server": self.url}}],
            "users": [{"name": "fake-kube", "user": {}}],
            "contexts": [{"name": "fake-kube", "context": {"cluster": "fake-kube", "user": "fake-kube", "namespace": namespace}}],
            "current-context": "fake-kube",
            "preferences": {},
        }

    def write_kubeconfig(self, directory: str | Path, namespace: str = "default") -> Path:
        path = Path(directory) / "kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.kubeconfig(namespace), sort_keys=False))
        path.chmod(0o600)
        return path
