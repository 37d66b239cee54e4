"""LocalFleet: one caliband per workspace, reached over its Unix socket (discovered, optionally
autostarted) or over one configured TCP + TLS + token endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from prospero.core.caliband_client import CalibandClient
from prospero.core.discovery import ensure_caliband
from prospero.core.errors import CalibandUnreachable, TransportError
from prospero.core.provider_env import resolve_env
from prospero.core.transport import NetworkSecurity, close_writer, open_endpoint
from prospero.core.wire.control import AgentRecord, Endpoint, SpawnedReply, SpawnSpec
from prospero.types.model import RegisteredWorkspace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CalibandNetworkConfig:
    """A single networked caliband that replaces Unix discovery for every workspace."""

    endpoint: Endpoint
    security: NetworkSecurity | None = None


@dataclass
class LocalFleetConfig:
    autostart: bool = True
    caliband_bin: str = "caliband"
    default_env: dict[str, str] = field(default_factory=dict)
    startup_timeout: float = 10.0
    request_timeout: float = 10.0
    network: CalibandNetworkConfig | None = None


class LocalFleet:
    name = "local"

    def __init__(
        self, config: LocalFleetConfig | None = None, process_env: Mapping[str, str] | None = None
    ) -> None:
        self.config = config or LocalFleetConfig()
        self._process_env = process_env
        self._clients: dict[str, CalibandClient] = {}
        # Per workspace: the last `list` reply line and its records. An identical reply (an
        # idle fleet) returns the same records without decoding ~0.5 KB per agent again.
        self._listings: dict[str, tuple[bytes, list[AgentRecord]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def security(self, ws: RegisteredWorkspace) -> NetworkSecurity | None:
        return self.config.network.security if self.config.network else None

    async def _client(self, ws: RegisteredWorkspace) -> CalibandClient:
        client = self._clients.get(ws.name)
        if client is not None:
            return client
        lock = self._locks.setdefault(ws.name, asyncio.Lock())
        async with lock:
            client = self._clients.get(ws.name)
            if client is not None:
                return client
            net = self.config.network
            if net is not None:
                client = CalibandClient(
                    net.endpoint, net.security, timeout=self.config.request_timeout
                )
            else:
                env = resolve_env(ws.config, self.config.default_env, self._process_env)
                endpoint = await ensure_caliband(
                    ws.root,
                    autostart=self.config.autostart,
                    binary=self.config.caliband_bin,
                    env=env,
                    timeout=self.config.startup_timeout,
                )
                client = CalibandClient(endpoint, None, timeout=self.config.request_timeout)
            self._clients[ws.name] = client
            return client

    async def list_agents(self, ws: RegisteredWorkspace) -> list[AgentRecord]:
        client = await self._client(ws)
        cached = self._listings.get(ws.name)
        try:
            line, records = await client.list_unless(cached[0] if cached else None)
        except (CalibandUnreachable, TransportError):
            self._clients.pop(ws.name, None)  # rediscover (and maybe autostart) next time
            self._listings.pop(ws.name, None)
            raise
        if records is None:
            assert cached is not None
            return list(cached[1])
        self._listings[ws.name] = (line, records)
        return list(records)

    async def spawn(self, ws: RegisteredWorkspace, spec: SpawnSpec) -> SpawnedReply:
        return await (await self._client(ws)).spawn(spec)

    async def attach(self, ws: RegisteredWorkspace, agent_id: str) -> Endpoint:
        return await (await self._client(ws)).attach(agent_id)

    async def kill(self, ws: RegisteredWorkspace, agent_id: str) -> None:
        await (await self._client(ws)).kill(agent_id)

    async def respawn(self, ws: RegisteredWorkspace, agent_id: str) -> str:
        return await (await self._client(ws)).respawn(agent_id)

    async def remove(self, ws: RegisteredWorkspace, agent_id: str, force: bool = False) -> None:
        await (await self._client(ws)).rm(agent_id, force)

    async def restart(self, ws: RegisteredWorkspace) -> None:
        """Shut the workspace's caliband down so discovery restarts it with the new env."""
        if self.config.network is not None:
            return  # a shared networked caliband is not ours to restart
        try:
            client = await self._client(ws)
        except (CalibandUnreachable, TransportError):
            return
        with contextlib.suppress(CalibandUnreachable, TransportError):
            await client.shutdown()
        self._clients.pop(ws.name, None)
        self._listings.pop(ws.name, None)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.startup_timeout
        while loop.time() < deadline:
            try:
                _r, w = await open_endpoint(client.endpoint, None)
            except TransportError:
                return
            await close_writer(w)
            await asyncio.sleep(0.05)
        log.warning("caliband for %s still accepts connections after shutdown", ws.name)

    async def forget(self, ws_name: str) -> None:
        self._clients.pop(ws_name, None)
        self._listings.pop(ws_name, None)

    async def close(self) -> None:
        self._clients.clear()
        self._listings.clear()
