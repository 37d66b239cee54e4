"""Shared helpers for the AcpDriver tests: scripted ACP peers on real sockets, targets, an
in-memory cursor store, a controllable permission broker."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from prospero.core.drivers.acp import AcpDriver
from prospero.core.drivers.base import DriverOptions, DriverTarget, EventSink
from prospero.core.metrics import Metrics
from prospero.core.permissions import PermissionOutcome, PermissionRequest, first_reject
from prospero.core.transport import NetworkSecurity
from prospero.core.wire.control import Endpoint
from prospero.testkit import acp_scripts as S
from prospero.testkit.certs import CertBundle
from prospero.testkit.fake_acp import FakeAcpAgent
from prospero.testkit.fake_acp_listener import AcpAgentListener
from prospero.types.model import AgentMeta
from tests.conformance.agent_driver import SESSION
from tests.support import short_tmpdir

TOKEN = "s3cret-acp"
LONG_CHUNKS = 400
OPTS = DriverOptions(include_thinking=True, backoff_base=0.01, backoff_cap=0.05, max_failures=4)


def new_agent_id(prefix: str = "acp") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def session_turn() -> S.Turn:
    """The conformance SESSION as ACP: the Read call's rawInput arrives late, in an update."""
    read, bash = SESSION["read"], SESSION["bash"]
    return [
        S.thought(SESSION["thinking"]),
        S.text(SESSION["text_before"]),
        S.tool_call(read["id"], read["name"], "read", status="pending"),
        S.tool_update(read["id"], raw_input=read["input"], status="in_progress"),
        S.tool_update(read["id"], status="completed", raw_output=read["result"]),
        S.tool_call(bash["id"], bash["name"], "execute", raw_input=bash["input"]),
        S.tool_update(bash["id"], status="failed", raw_output=bash["result"]),
        S.text(SESSION["text_after"]),
        S.usage(5200, 200_000, cost=0.0123),
        S.stop("end_turn"),
    ]


def long_texts() -> list[str]:
    return [f"chunk {i:05d}\n" for i in range(LONG_CHUNKS)]


class MemoryCursorStore:
    """The CursorStore seam, in memory (a restarted prosperod shares it)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.saves = 0

    async def save_cursor(self, key: str, data: bytes) -> None:
        self.saves += 1
        self.data[key] = data

    async def load_cursor(self, key: str) -> bytes | None:
        return self.data.get(key)


class ScriptedBroker:
    """A PermissionBroker the test controls: a fixed answer (`allow`, `reject`, `cancel`),
    or `hold` (never answers until `release()`)."""

    def __init__(self, mode: str = "allow") -> None:
        self.mode = mode
        self.requests: list[PermissionRequest] = []
        self._release = asyncio.Event()

    def release(self) -> None:
        self._release.set()

    async def decide(self, request: PermissionRequest) -> PermissionOutcome:
        self.requests.append(request)
        if self.mode == "hold":
            await self._release.wait()
        if self.mode == "allow":
            opt = next((o for o in request.options if o.allows), None)
            if opt is not None:
                return PermissionOutcome.select(opt.option_id, "user")
        if self.mode in ("reject", "hold"):
            rej = first_reject(request.options)
            if rej is not None:
                return PermissionOutcome.select(rej.option_id, "user")
        return PermissionOutcome.cancelled("user")


@dataclass
class Peer:
    """One scripted ACP agent behind a listener."""

    listener: AcpAgentListener
    endpoint: Endpoint
    security: NetworkSecurity | None = None
    resolves: int = 0

    @property
    def agent(self) -> FakeAcpAgent:
        assert self.listener.agent is not None, "no connection reached the agent yet"
        return self.listener.agent

    async def resolve(self) -> Endpoint:
        self.resolves += 1
        return self.endpoint


@dataclass
class Rig:
    """Peers, drivers and temp dirs of one test; `aclose()` cleans all up."""

    dir: str = field(default_factory=short_tmpdir)
    peers: list[Peer] = field(default_factory=list)
    drivers: list[AcpDriver] = field(default_factory=list)
    metrics: Metrics = field(default_factory=Metrics)

    async def peer(
        self,
        script: S.AcpScript | None = None,
        *,
        tls: CertBundle | None = None,
        token: str | None = TOKEN,
        agent_factory: Callable[[], FakeAcpAgent] | None = None,
        command: list[str] | None = None,
        **agent_kw: Any,
    ) -> Peer:
        name = new_agent_id("lst")
        if command is not None:
            listener = AcpAgentListener(name, command=command)
        else:
            factory = agent_factory or (lambda: FakeAcpAgent(script, **agent_kw))
            listener = AcpAgentListener(name, agent_factory=factory)
        security: NetworkSecurity | None = None
        if tls is not None:
            endpoint: Endpoint = await listener.serve_tcp(
                "127.0.0.1", 0, tls.server_context(), token
            )
            security = NetworkSecurity(ca_pem=tls.ca_pem, server_name="localhost", token=token)
        else:
            endpoint = await listener.serve_unix(f"{self.dir}/{len(self.peers)}.sock")
        p = Peer(listener, endpoint, security)
        self.peers.append(p)
        return p

    def target(
        self,
        peer: Peer,
        *,
        prompt: str | None = "do the thing",
        interactive: bool = False,
        agent_id: str | None = None,
        security: NetworkSecurity | None = None,
        model: str | None = None,
        posture: str | None = None,
    ) -> DriverTarget:
        agent_id = agent_id or new_agent_id()
        meta = AgentMeta(
            agent_id=agent_id,
            workspace="ws",
            spawned_here=True,
            drive_protocol="acp",
            posture=posture,  # type: ignore[arg-type]
            prompt=prompt,
        )
        return DriverTarget(
            agent_id=agent_id,
            workspace="ws",
            resolve_endpoint=peer.resolve,
            security=security if security is not None else peer.security,
            interactive=interactive,
            prompt=prompt,
            model=model,
            working_dir=self.dir,
            meta=meta,
        )

    def driver(
        self,
        target: DriverTarget,
        sink: EventSink,
        options: DriverOptions = OPTS,
        **kw: Any,
    ) -> AcpDriver:
        d = AcpDriver(target, sink, options, self.metrics, kw.pop("cursor_store", None), **kw)
        self.drivers.append(d)
        return d

    async def aclose(self) -> None:
        for d in self.drivers:
            await d.close()
        for p in self.peers:
            await p.listener.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    """A Rig closed after the test (import it into a test module to use it)."""
    r = Rig()
    try:
        yield r
    finally:
        await r.aclose()
