"""A real prosperod stack for API tests: Runtime + uvicorn on 127.0.0.1:<ephemeral> + a fake
caliband on the Unix socket discovery expects (CALIBAN_DAEMON_RUNTIME_DIR is a short temp dir,
autostart is off)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from prospero.api.app import create_app
from prospero.api.server import ApiServer
from prospero.api.settings import ApiSettings
from prospero.core.discovery import socket_path_for
from prospero.core.sources import canonical_root
from prospero.core.tokens import TokenTable
from prospero.core.wire.control import SpawnSpec
from prospero.daemon.runtime import DaemonConfig, Runtime
from prospero.testkit import scripts
from prospero.testkit.fake_caliband import FakeCaliband
from tests.support import short_tmpdir, wait_until

BIG_CHUNK = 100_000


def big_script(n: int, size: int = BIG_CHUNK, *, interactive: bool = False) -> scripts.Script:
    """`n` output chunks of `size` bytes each (distinct), then RunEnd: floods a slow reader.
    Interactive: the flood starts only after EndInput (so a reader can subscribe first)."""
    out: scripts.Script = [scripts.turn_start(0)]
    if interactive:
        out.append(scripts.wait_input())
    for i in range(n):
        out.append(scripts.text_delta(f"{i:06d}" + "x" * (size - 7) + "\n", 0, 0))
    out.append(scripts.turn_end(0, content=[scripts.text_block("big")], output_tokens=n))
    out.append(scripts.run_end("EndOfTurn", turn_count=1))
    return out


BUDGET_MODEL = "claude-sonnet-4-5"  # priced by the rate card: $3 / $15 per million tokens
BUDGET_TURN = (400, 200)  # tokens in, out per turn: 600 tokens, $0.0042


def budget_script(turns: int = 8, pause: float = 1.0) -> scripts.Script:
    """`turns` turns of BUDGET_TURN usage on a priced model, `pause` s apart, then RunEnd."""
    out: scripts.Script = []
    for t in range(turns):
        out.append(scripts.turn_start(t, model=BUDGET_MODEL))
        out.append(scripts.text_delta(f"turn {t}\n", t, 0))
        out.append(
            scripts.turn_end(
                t,
                content=[scripts.text_block(f"turn {t}")],
                input_tokens=BUDGET_TURN[0],
                output_tokens=BUDGET_TURN[1],
            )
        )
        out.append(scripts.sleep(pause))
    out.append(scripts.run_end("EndOfTurn", turn_count=turns))
    return out


def script_for(spec: SpawnSpec) -> scripts.Script:
    """Pick the fake agent's script from the spawn label."""
    label = spec.label or ""
    if label == "budget":
        return budget_script()
    if label.startswith("big-"):
        return big_script(int(label.split("-", 1)[1]), interactive=spec.interactive)
    if label == "tools":
        return scripts.tool_run_script()
    if label == "interactive" or spec.interactive:
        return scripts.interactive_script()
    if label == "slow":
        # Runs until killed/drained: one line, then a long pause before RunEnd.
        return [
            *scripts.text_script(1, final=False),
            scripts.sleep(60),
            scripts.run_end("EndOfTurn"),
        ]
    if label == "crash":
        return scripts.crash_script(2, code=3)
    if label.startswith("long-"):
        return scripts.long_script(int(label.split("-", 1)[1]), per_turn=200)
    return scripts.text_script(3)


@dataclass
class Stack:
    tmp: Path
    root: Path
    runtime: Runtime
    server: ApiServer
    client: httpx.AsyncClient
    fakes: dict[str, FakeCaliband] = field(default_factory=dict)
    roots: dict[str, Path] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def fake(self) -> FakeCaliband:
        return self.fakes["ws"]

    async def add_workspace(
        self, name: str, *, fake: bool = True, line_delay: float = 0.0, register: bool = True
    ) -> Path:
        root = self.tmp / name
        root.mkdir(exist_ok=True)
        canon = canonical_root(str(root))
        if fake:
            self.fakes[name] = await FakeCaliband.start_unix(
                socket_path_for(canon), root=canon, script_for=script_for, line_delay=line_delay
            )
        self.roots[name] = root
        if register:
            assert self.runtime.manager is not None
            await self.runtime.manager.add_workspace(name, str(root))
        return root

    async def spawn(self, label: str | None = None, ws: str = "ws", **body: Any) -> str:
        payload: dict[str, Any] = {"prompt": "do the thing", "isolation": "shared", **body}
        if label is not None:
            payload["label"] = label
        r = await self.client.post(f"/api/workspaces/{ws}/agents", json=payload)
        assert r.status_code == 201, r.text
        return str(r.json()["agent_id"])

    async def history(self, agent_id: str) -> list[dict[str, Any]]:
        r = await self.client.get(f"/api/agents/{agent_id}/events")
        assert r.status_code == 200, r.text
        return list(r.json())

    async def wait_finished(self, agent_id: str, within: float = 20.0) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []

        async def done() -> bool:
            nonlocal events
            events = await self.history(agent_id)
            return any(e["kind"]["kind"] == "agent_finished" for e in events)

        await wait_until(done, within, interval=0.05, what=f"{agent_id} finished")
        return events

    async def wait_status(self, agent_id: str, *statuses: str, within: float = 20.0) -> None:
        async def ok() -> bool:
            r = await self.client.get(f"/api/agents/{agent_id}")
            return r.status_code == 200 and r.json()["status"] in statuses

        await wait_until(ok, within, interval=0.05, what=f"{agent_id} in {statuses}")


StackFactory = Callable[..., Awaitable[Stack]]


def token_table(tokens: dict[str, str] | TokenTable | None) -> TokenTable:
    """A fixture's `tokens=`: plaintext `name -> token` (admin, legacy) or a TokenTable."""
    if isinstance(tokens, TokenTable):
        return tokens
    return TokenTable.from_plaintext(tokens or {})


@pytest.fixture
async def make_stack(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> AsyncIterator[StackFactory]:
    rundir = short_tmpdir()
    monkeypatch.setenv("CALIBAN_DAEMON_RUNTIME_DIR", rundir)
    stacks: list[Stack] = []

    async def factory(
        *,
        tokens: dict[str, str] | TokenTable | None = None,
        heartbeat: float = 15.0,
        bus_buffer: int = 1024,
        workspace: bool = True,
        line_delay: float = 0.0,
        client_token: str | None = None,
        api: dict[str, Any] | None = None,
        **config: Any,
    ) -> Stack:
        tmp = tmp_path / f"stack{len(stacks)}"
        tmp.mkdir()
        cfg = DaemonConfig(
            bind_host="127.0.0.1",
            port=0,
            data_dir=tmp / "data",
            autostart=False,
            poll_interval=0.05,
            api_tokens=dict(tokens) if isinstance(tokens, dict) else {},
            bus_buffer=bus_buffer,
            **config,
        )
        runtime = Runtime(cfg)
        await runtime.start()
        settings = ApiSettings(
            tokens=token_table(tokens),
            heartbeat_interval=heartbeat,
            **(api or {}),  # more ApiSettings knobs (auth_failure_limit, session_ttl, ...)
        )
        server = ApiServer(create_app(runtime, settings), "127.0.0.1", 0, graceful_timeout=3)
        await server.start()
        headers = {"Authorization": f"Bearer {client_token}"} if client_token else {}
        headers["X-Prospero-Client"] = "test"  # body-less POSTs pass the OriginGuard
        client = httpx.AsyncClient(base_url=server.url, timeout=20.0, headers=headers)
        stack = Stack(tmp=tmp, root=tmp / "ws", runtime=runtime, server=server, client=client)
        stacks.append(stack)
        if workspace:
            await stack.add_workspace("ws", line_delay=line_delay)
        return stack

    yield factory

    for s in reversed(stacks):
        with contextlib.suppress(Exception):
            await s.client.aclose()
        await s.server.stop()
        await s.runtime.stop()
        for f in s.fakes.values():
            await f.stop()
    shutil.rmtree(rundir, ignore_errors=True)


@pytest.fixture
async def stack(make_stack: StackFactory) -> Stack:
    return await make_stack()


# ------------------------------------------------------------------------------ SSE client


@dataclass
class SseMessage:
    event: str | None
    data: str
    id: str | None

    def json(self) -> Any:
        return orjson.loads(self.data)


class SseReader:
    """Minimal SSE parser over an httpx streaming response (records comments too)."""

    def __init__(self, resp: httpx.Response) -> None:
        self.resp = resp
        self.comments: list[str] = []
        self._lines = resp.aiter_lines()

    async def next(self) -> SseMessage | None:
        """The next message, or None when the stream ends."""
        event: str | None = None
        data: list[str] = []
        mid: str | None = None
        async for line in self._lines:
            if line == "":
                if data or event is not None:
                    return SseMessage(event, "\n".join(data), mid)
                continue
            if line.startswith(":"):
                self.comments.append(line[1:].strip())
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            elif name == "event":
                event = value
            elif name == "id":
                mid = value
        return None


def sse_headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"Accept": "text/event-stream", **(extra or {})}


def envelope(resp: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error", "kind"}, body
    assert body["kind"] == kind, body
    assert isinstance(body["error"], str) and body["error"]
    return dict(body)
