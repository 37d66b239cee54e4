"""LocalFleet: one caliband per workspace, reached over its Unix socket (discovered, optionally
autostarted) or over one configured TCP + TLS + token endpoint.

Its boundary translates caliband's control wire into the seam's types (`records.py`) and back:
`AgentRecord` -> `ListedAgent`, `AgentSpec` -> `SpawnSpec` (without the posture: caliband has no
such field, and keeps no key it does not know), `SpawnedReply` -> `SpawnOutcome` (always
`created`: every caliband spawn makes an agent), endpoints -> `Address`; and caliband's
unreachability (`CalibandUnreachable`, any `TransportError`) -> `FleetUnreachable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prospero.core.caliband_client import CalibandClient
from prospero.core.discovery import ensure_caliband
from prospero.core.errors import FleetUnreachable, TransportError
from prospero.core.fleet.provider import ChangeListener
from prospero.core.fleet.records import AgentSpec, ListedAgent, SpawnOutcome
from prospero.core.provider_env import resolve_env
from prospero.core.transport import (
    Address,
    NetworkSecurity,
    address_of,
    close_writer,
    open_endpoint,
)
from prospero.core.wire.control import AgentRecord, Endpoint, SpawnSpec
from prospero.types.model import RegisteredWorkspace

log = logging.getLogger(__name__)


def agent_spec_from_wire(spec: SpawnSpec) -> AgentSpec:
    """caliband's echo of a spawn (its own fields: no posture) as the seam's spec."""
    return AgentSpec(
        prompt=spec.initial_prompt,
        label=spec.label,
        frontmatter_path=spec.frontmatter_path,
        model=spec.model,
        provider=spec.provider,
        tool_allowlist=tuple(spec.tool_allowlist) if spec.tool_allowlist is not None else None,
        worktree=spec.isolation_worktree,
        inherit_hooks=spec.inherit_hooks,
        interactive=spec.interactive,
        source=spec.source,
        drive_protocol=spec.drive_protocol,
    )


def wire_spec(spec: AgentSpec) -> SpawnSpec:
    """The SpawnSpec caliband is sent for `spec`: its posture is not among caliband's fields."""
    return SpawnSpec(
        label=spec.label,
        frontmatter_path=spec.frontmatter_path,
        initial_prompt=spec.prompt,
        model=spec.model,
        provider=spec.provider,
        tool_allowlist=list(spec.tool_allowlist) if spec.tool_allowlist is not None else None,
        isolation_worktree=spec.worktree,
        inherit_hooks=spec.inherit_hooks,
        interactive=spec.interactive,
        source=spec.source,
        drive_protocol=spec.drive_protocol,
    )


def listed_from_wire(rec: AgentRecord) -> ListedAgent:
    return ListedAgent(
        id=rec.id,
        name=rec.name,
        status=rec.status,
        started_at=rec.started_at,
        spec=agent_spec_from_wire(rec.spec),
        address=address_of(rec.endpoint),
        session_dir=rec.session_dir,
        working_dir=rec.working_dir,
    )


@contextlib.contextmanager
def _reaching_caliband() -> Iterator[None]:
    """caliband's unreachability as the seam's: `CalibandUnreachable` (dial, timeout, EOF
    before the reply, discovery or autostart failing) and any other TransportError."""
    try:
        yield
    except TransportError as e:
        raise FleetUnreachable(str(e)) from e


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
        # idle fleet) returns the same records without decoding ~0.5 KB per agent again (nor
        # translating them: the manager skips a record it already applied by identity).
        self._listings: dict[str, tuple[bytes, list[ListedAgent]]] = {}
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

    async def list_agents(self, ws: RegisteredWorkspace) -> list[ListedAgent]:
        with _reaching_caliband():
            client = await self._client(ws)
        cached = self._listings.get(ws.name)
        try:
            line, records = await client.list_unless(cached[0] if cached else None)
        except TransportError as e:
            self._clients.pop(ws.name, None)  # rediscover (and maybe autostart) next time
            self._listings.pop(ws.name, None)
            raise FleetUnreachable(str(e)) from e
        if records is None:
            assert cached is not None
            return list(cached[1])
        listed = [listed_from_wire(r) for r in records]
        self._listings[ws.name] = (line, listed)
        return list(listed)

    async def spawn(self, ws: RegisteredWorkspace, spec: AgentSpec) -> SpawnOutcome:
        with _reaching_caliband():
            reply = await (await self._client(ws)).spawn(wire_spec(spec))
        return SpawnOutcome(id=reply.id, address=address_of(reply.endpoint), created=True)

    async def attach(self, ws: RegisteredWorkspace, agent_id: str) -> Address:
        with _reaching_caliband():
            return address_of(await (await self._client(ws)).attach(agent_id))

    async def kill(self, ws: RegisteredWorkspace, agent_id: str) -> None:
        with _reaching_caliband():
            await (await self._client(ws)).kill(agent_id)

    async def respawn(self, ws: RegisteredWorkspace, agent_id: str) -> str:
        with _reaching_caliband():
            return await (await self._client(ws)).respawn(agent_id)

    async def remove(self, ws: RegisteredWorkspace, agent_id: str, force: bool = False) -> None:
        with _reaching_caliband():
            await (await self._client(ws)).rm(agent_id, force)

    async def restart(self, ws: RegisteredWorkspace) -> None:
        """Shut the workspace's caliband down so discovery restarts it with the new env."""
        if self.config.network is not None:
            return  # a shared networked caliband is not ours to restart
        try:
            client = await self._client(ws)
        except TransportError:  # CalibandUnreachable included: nothing to shut down
            return
        with contextlib.suppress(TransportError):
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

    def on_changed(self, listener: ChangeListener | None) -> None:
        """Never called: caliband has no push, so the manager's timer polls."""

    async def forget(self, ws_name: str) -> None:
        self._clients.pop(ws_name, None)
        self._listings.pop(ws_name, None)

    async def close(self) -> None:
        self._clients.clear()
        self._listings.clear()
