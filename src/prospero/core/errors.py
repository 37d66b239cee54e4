"""Typed errors of the core. The API layer maps `kind` to HTTP (prospero-surface.md §1.1)."""

from __future__ import annotations


class ProsperoError(Exception):
    kind = "internal"


class NotFound(ProsperoError):
    kind = "not_found"


class AgentNotFound(NotFound):
    def __init__(self, agent_id: str) -> None:
        super().__init__(f"agent '{agent_id}' not found")
        self.agent_id = agent_id


class WorkspaceNotFound(NotFound):
    def __init__(self, name: str) -> None:
        super().__init__(f"workspace '{name}' not found")
        self.name = name


class InvalidState(ProsperoError):
    kind = "invalid_state"

    def __init__(self, op: str, agent_id: str, status: str, why: str = "") -> None:
        msg = f"cannot {op} agent '{agent_id}' in state '{status}'"
        super().__init__(f"{msg}: {why}" if why else msg)
        self.op, self.agent_id, self.status = op, agent_id, status


class Conflict(ProsperoError):
    kind = "conflict"


class BudgetReached(ProsperoError):
    """A spawn refused because its workspace has spent its daily cap (409)."""

    kind = "budget_exceeded"


class ProviderMisconfigured(ProsperoError):
    kind = "provider_misconfigured"


class InvalidConfig(ProsperoError):
    kind = "invalid_config"


class Unsupported(ProsperoError):
    """The operation does not exist for this driver or backend."""

    kind = "unsupported"


class TransportError(ProsperoError):
    """Could not reach the peer: refused, TLS failure, wrong token (silent drop), EOF."""

    kind = "unreachable"


class CalibandUnreachable(TransportError):
    """caliband's control endpoint cannot be reached (the control client, discovery). It stays
    below the FleetProvider seam: LocalFleet turns it into FleetUnreachable."""


class FleetUnreachable(ProsperoError):
    """The FleetProvider seam's error for "this workspace's backend cannot be reached": its
    caliband (LocalFleet), the Kubernetes API server or an agent's pod caliband (K8sFleet).
    Each provider translates its own transport failures into it at its boundary; the manager
    marks the workspace unreachable, the API answers 503."""

    kind = "unreachable"


class ProtocolError(ProsperoError):
    """The peer answered something we cannot accept: non-JSON, wrong reply kind, internal."""

    kind = "protocol"


class StoreError(ProsperoError):
    kind = "internal"


class SeqConflict(StoreError):
    pass


class FenceLost(StoreError):
    """An append carried a lease (`store.base.Fence`) that is no longer this replica's: another
    replica took it over (or it expired). Nothing of the batch was written. `keys`: the lease
    keys that failed."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(f"lease(s) no longer held: {', '.join(keys)}")
        self.keys = keys
