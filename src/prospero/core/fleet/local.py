"""LocalFleet: each workspace's caliband, reached over the workspace's own TCP + TLS + token
endpoint (`config.caliband`), else prosperod's default one (`--caliband-addr`), else the root's
caliband over its Unix socket (discovered, optionally autostarted). One client per distinct
endpoint: workspaces on one networked caliband share it.

A workspace lists only the agents whose working directory lies in its root (whole path
components on normalised paths; of two nested roots on one caliband, the deeper one takes the
agent), so two workspaces on one shared caliband see their own agents each. A record without a
working directory (legacy calibands, a caliband without a root) cannot be placed and is listed
in every workspace of its caliband, as before.

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
from dataclasses import dataclass, field, replace

from prospero.core.caliband_client import CalibandClient
from prospero.core.caliband_net import CalibandNetworkConfig, network_config, root_contains
from prospero.core.discovery import ensure_caliband
from prospero.core.errors import FleetUnreachable, InvalidConfig, TransportError
from prospero.core.fleet.caliband_spec import agent_spec_from_wire, wire_spec
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
from prospero.core.wire.control import AgentRecord
from prospero.types.model import CalibandEndpointConfig, RegisteredWorkspace

log = logging.getLogger(__name__)


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


__all__ = ["CalibandNetworkConfig", "LocalFleet", "LocalFleetConfig"]

# A distinct caliband: ("tcp", addr, ca_file, token_file, server_name) for a workspace's own
# endpoint, ("default",) for prosperod's --caliband-addr, ("unix", socket path) for a discovered one.
EndpointKey = tuple[str | None, ...]


def _own_key(cfg: CalibandEndpointConfig) -> EndpointKey:
    return ("tcp", cfg.addr, cfg.ca_file, cfg.token_file, cfg.server_name)


@dataclass
class _Binding:
    """Which caliband a workspace was last bound to, under which endpoint config and root."""

    caliband: CalibandEndpointConfig | None
    root: str
    key: EndpointKey


@dataclass
class LocalFleetConfig:
    autostart: bool = True
    caliband_bin: str = "caliband"
    default_env: dict[str, str] = field(default_factory=dict)
    startup_timeout: float = 10.0
    request_timeout: float = 10.0
    network: CalibandNetworkConfig | None = None  # the default for workspaces without their own


class LocalFleet:
    name = "local"

    def __init__(
        self, config: LocalFleetConfig | None = None, process_env: Mapping[str, str] | None = None
    ) -> None:
        self.config = config or LocalFleetConfig()
        self._process_env = process_env
        # One client per distinct caliband, and each workspace's binding to one.
        self._clients: dict[EndpointKey, CalibandClient] = {}
        self._bindings: dict[str, _Binding] = {}
        # Per workspace: the last `list` reply line, the other roots on its caliband it was
        # filtered against, and its records. An identical reply (an idle fleet) returns the
        # same records without decoding ~0.5 KB per agent again (nor translating them: the
        # manager skips a record it already applied by identity).
        self._listings: dict[str, tuple[bytes, tuple[str, ...], list[ListedAgent]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def security(self, ws: RegisteredWorkspace) -> NetworkSecurity | None:
        own = ws.config.caliband
        if own is not None:
            client = self._clients.get(_own_key(own))
            if client is not None:
                return client.security
            try:
                return network_config(own).security
            except InvalidConfig as e:  # its files went missing since add/config time
                raise FleetUnreachable(str(e)) from e
        return self.config.network.security if self.config.network else None

    def _bound(self, ws: RegisteredWorkspace) -> _Binding | None:
        """The workspace's binding, unless its endpoint config changed since (then unbound)."""
        b = self._bindings.get(ws.name)
        if b is not None and (b.caliband != ws.config.caliband or b.root != ws.root):
            self._unbind(ws.name)
            return None
        return b

    def _unbind(self, ws_name: str) -> None:
        b = self._bindings.pop(ws_name, None)
        self._listings.pop(ws_name, None)
        if b is not None and not any(o.key == b.key for o in self._bindings.values()):
            self._clients.pop(b.key, None)  # its last workspace: dial afresh next time

    def _others_on(self, ws: RegisteredWorkspace, key: EndpointKey) -> tuple[str, ...]:
        """The roots of the other workspaces bound to the caliband `key`."""
        return tuple(
            sorted(b.root for n, b in self._bindings.items() if n != ws.name and b.key == key)
        )

    async def _client(self, ws: RegisteredWorkspace) -> CalibandClient:
        b = self._bound(ws)
        if b is not None:
            return self._clients[b.key]
        lock = self._locks.setdefault(ws.name, asyncio.Lock())
        async with lock:
            b = self._bound(ws)
            if b is not None:
                return self._clients[b.key]
            own = ws.config.caliband
            net = self.config.network
            key: EndpointKey
            if own is not None:
                key = _own_key(own)
                client = self._clients.get(key)
                if client is None:
                    try:
                        mine = network_config(own)  # its files read again: rotated tokens
                    except InvalidConfig as e:
                        raise FleetUnreachable(str(e)) from e
                    client = CalibandClient(
                        mine.endpoint, mine.security, timeout=self.config.request_timeout
                    )
            elif net is not None:
                key = ("default",)
                client = self._clients.get(key) or CalibandClient(
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
                key = ("unix", endpoint.path)
                client = self._clients.get(key) or CalibandClient(
                    endpoint, None, timeout=self.config.request_timeout
                )
            self._clients[key] = client
            self._bindings[ws.name] = _Binding(ws.config.caliband, ws.root, key)
            return client

    async def list_agents(self, ws: RegisteredWorkspace) -> list[ListedAgent]:
        with _reaching_caliband():
            client = await self._client(ws)
        key = self._bindings[ws.name].key
        others = self._others_on(ws, key)
        cached = self._listings.get(ws.name)
        try:
            line, records = await client.list_unless(
                cached[0] if cached is not None and cached[1] == others else None
            )
        except TransportError as e:
            self._unbind(ws.name)  # rediscover (and maybe autostart) next time
            raise FleetUnreachable(str(e)) from e
        if records is None:
            assert cached is not None
            return list(cached[2])
        listed = [listed_from_wire(r) for r in records if _places(r, ws.root, others)]
        self._listings[ws.name] = (line, others, listed)
        return list(listed)

    async def spawn(self, ws: RegisteredWorkspace, spec: AgentSpec) -> SpawnOutcome:
        own = ws.config.caliband
        if own is not None and own.source is not None and spec.source is None:
            spec = replace(spec, source=own.source)  # run in the workspace's root
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
        """Apply a changed config: a networked caliband (the workspace's own or the default)
        is only dialled afresh (not ours to restart); a discovered one is shut down so that
        discovery restarts it with the new env."""
        self._unbind(ws.name)
        if ws.config.caliband is not None or self.config.network is not None:
            return
        try:
            client = await self._client(ws)
        except TransportError:  # CalibandUnreachable included: nothing to shut down
            return
        with contextlib.suppress(TransportError):
            await client.shutdown()
        self._unbind(ws.name)
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
        self._unbind(ws_name)

    async def close(self) -> None:
        self._clients.clear()
        self._bindings.clear()
        self._listings.clear()


def _places(rec: AgentRecord, root: str, others: tuple[str, ...]) -> bool:
    """Whether `rec` belongs to the workspace at `root`, given the other roots on its
    caliband: its working directory lies in `root` and in no deeper root of those; a record
    without one is listed everywhere (it cannot be placed)."""
    wd = rec.working_dir
    if not wd:
        return True
    if not root_contains(root, wd):
        return False
    return not any(o != root and root_contains(root, o) and root_contains(o, wd) for o in others)
