"""The FleetProvider seam: who owns agent lifecycles (LocalFleet: calibands; K8sFleet:
CalibanTask CRs).

A provider never emits events and keeps no snapshot; the FleetManager above it polls, diffs,
attaches drivers and emits.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from prospero.core.transport import NetworkSecurity
from prospero.core.wire.control import AgentRecord, Endpoint, SpawnedReply, SpawnSpec
from prospero.types.k8s import K8sWorkspaceView, WorkspaceAccepted, WorkspaceConfig
from prospero.types.model import Posture, RegisteredWorkspace, Source


class SpawnOutcome(SpawnedReply):
    """A spawn's reply with what the backend knows of the agent's novelty: `created` False when
    an identical spawn found the agent there already (K8sFleet: the CR named from the spawn's
    hash existed), so the manager records no second `agent_spawned`. Providers that always
    create (LocalFleet: caliband's `spawned`) return a plain SpawnedReply."""

    created: bool = True


@runtime_checkable
class FleetProvider(Protocol):
    name: str

    async def list_agents(self, ws: RegisteredWorkspace) -> list[AgentRecord]:
        """Raises CalibandUnreachable (-> workspace unreachable) or ProtocolError."""
        ...

    async def spawn(self, ws: RegisteredWorkspace, spec: SpawnSpec) -> SpawnedReply: ...

    async def attach(self, ws: RegisteredWorkspace, agent_id: str) -> Endpoint: ...

    async def kill(self, ws: RegisteredWorkspace, agent_id: str) -> None: ...

    async def respawn(self, ws: RegisteredWorkspace, agent_id: str) -> str: ...

    async def remove(self, ws: RegisteredWorkspace, agent_id: str, force: bool = False) -> None: ...

    async def restart(self, ws: RegisteredWorkspace) -> None:
        """Apply a changed workspace config (local: shutdown caliband, rediscover)."""
        ...

    async def forget(self, ws_name: str) -> None:
        """Drop cached clients for a removed workspace (does not stop anything)."""
        ...

    def security(self, ws: RegisteredWorkspace) -> NetworkSecurity | None:
        """Transport security for this workspace's per-agent endpoints."""
        ...

    async def close(self) -> None: ...


class PostureSpawner(Protocol):
    """A provider whose backend carries the agent's permission posture from its spawn on
    (K8sFleet: the CR's `spec.task.permissionPosture`, which the operator admits). It is handed
    to the FleetManager explicitly (`posture_spawner=`, the provider itself); a provider that is
    not one (LocalFleet) never sees the posture, which stays Prospero's alone (AgentMeta)."""

    async def spawn(
        self, ws: RegisteredWorkspace, spec: SpawnSpec, *, posture: Posture | None = None
    ) -> SpawnedReply: ...


class WorkspaceAdmin(Protocol):
    """Workspaces defined outside Prospero's config store (K8sWorkspaces: the `Workspace` CRs),
    handed to the FleetManager explicitly (`workspace_admin=`). It is then the manager's
    registry: every workspace it lists is polled, and writes go through it (answered 202: the
    backend reconciles them asynchronously). Without one (LocalFleet), the registry is the
    config store."""

    async def list_workspaces(self) -> list[RegisteredWorkspace]:
        """The registry, in name order."""
        ...

    def sources(self, name: str) -> list[Source]:
        """The workspace's sources as last listed (for the snapshot)."""
        ...

    async def views(self) -> list[K8sWorkspaceView]: ...

    async def apply(
        self, name: str, config: WorkspaceConfig, *, create: bool
    ) -> WorkspaceAccepted: ...

    async def delete(self, name: str) -> bool:
        """Idempotent: False when there was nothing to delete."""
        ...
