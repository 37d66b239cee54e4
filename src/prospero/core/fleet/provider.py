"""The FleetProvider seam: who owns agent lifecycles (LocalFleet: calibands; K8sFleet:
CalibanTask CRs).

A provider never emits events and keeps no snapshot; the FleetManager above it polls, diffs,
attaches drivers and emits. The seam speaks Prospero's types (`records.py`: `AgentSpec`,
`ListedAgent`, `SpawnOutcome`; the transport's `Address`) and Prospero's errors: each backend
translates its own records and failures at its boundary (a backend that cannot be reached:
`FleetUnreachable`; an unknown agent: `AgentNotFound`; an operation its state refuses:
`InvalidState`; an answer it cannot accept: `ProtocolError`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from prospero.core.fleet.records import AgentSpec, ListedAgent, SpawnOutcome
from prospero.core.transport import Address, NetworkSecurity
from prospero.types.k8s import K8sWorkspaceView, WorkspaceAccepted, WorkspaceConfig
from prospero.types.model import RegisteredWorkspace, Source

__all__ = [
    "AgentSpec",
    "ChangeListener",
    "FleetProvider",
    "ListedAgent",
    "SpawnOutcome",
    "WorkspaceAdmin",
]

ChangeListener = Callable[[str], None]
"""`changed(workspace_name)`: the backend saw that workspace's agents change."""


@runtime_checkable
class FleetProvider(Protocol):
    name: str

    async def list_agents(self, ws: RegisteredWorkspace) -> list[ListedAgent]:
        """Raises FleetUnreachable (-> the workspace reads unreachable) or ProtocolError. A
        listing that did not change may return the very records of the last one (the manager
        skips an unchanged record by identity)."""
        ...

    async def spawn(self, ws: RegisteredWorkspace, spec: AgentSpec) -> SpawnOutcome:
        """Spawn `spec` (its posture kept only by a backend that carries one)."""
        ...

    async def attach(self, ws: RegisteredWorkspace, agent_id: str) -> Address:
        """The agent's current address, for its driver to dial."""
        ...

    async def kill(self, ws: RegisteredWorkspace, agent_id: str) -> None: ...

    async def respawn(self, ws: RegisteredWorkspace, agent_id: str) -> str: ...

    async def remove(self, ws: RegisteredWorkspace, agent_id: str, force: bool = False) -> None: ...

    async def restart(self, ws: RegisteredWorkspace) -> None:
        """Apply a changed workspace config (local: shutdown caliband, rediscover)."""
        ...

    async def forget(self, ws_name: str) -> None:
        """Drop cached clients for a removed workspace (does not stop anything)."""
        ...

    def on_changed(self, listener: ChangeListener | None) -> None:
        """Register the one `listener` (None: unregister) a backend with push calls, on the
        event loop and without blocking, with a workspace's name when it learns that the
        workspace's agents changed (K8sFleet: a watch event of one of its CalibanTasks), so
        the manager polls it at once instead of at its next timer. A hint, never the only
        signal: the manager's timer still polls (a lost push heals). LocalFleet never calls
        it: caliband has no push."""
        ...

    def security(self, ws: RegisteredWorkspace) -> NetworkSecurity | None:
        """Transport security for this workspace's per-agent endpoints."""
        ...

    async def close(self) -> None: ...


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
