"""What crosses the FleetProvider seam (`provider.py`): Prospero's own types, not a backend's.

- `AgentSpec`: what an agent is spawned with — the spawn request a provider receives, and what
  a listed agent was spawned with as far as its backend remembers it.
- `ListedAgent`: an agent as a provider lists it.
- `SpawnOutcome`: what a spawn answers.
- An agent's address is the transport's `Address` (`core/transport.py`: `UnixAddress` |
  `TcpAddress`), so the drivers and the transport, below this package, share it without
  importing the fleet.

Each backend translates at its own boundary: LocalFleet from caliband's control wire
(`wire.control`: `AgentRecord`, `SpawnSpec`, `SpawnedReply`, its endpoint models), K8sFleet
from the CalibanTask CRs (`wire.k8s`, `k8s_records.py`) and its pods' caliband listings. Their
errors cross as Prospero's (`FleetUnreachable`, `AgentNotFound`, `InvalidState`,
`ProtocolError`, ...).

Frozen dataclasses rather than pydantic models: nothing here is parsed — every value is built
by a provider from input already validated (caliband's decoded reply, the CR mirror, the API's
`SpawnRequest`) — so validation would only cost (a listing builds one per agent per changed
poll); frozen, so a provider's cached listing can be handed to the manager, and a record kept
in its registry, without either side changing the other's (K8sFleet's pod overlay builds a new
record instead of patching one); and compared by value (the manager's "did the listing change").
"""

from __future__ import annotations

from dataclasses import dataclass

from prospero.core.transport import Address
from prospero.types.model import AgentStatus, DriveProtocol, Posture


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """What an agent is spawned with.

    As a spawn request: everything the manager asks of the provider, the permission posture
    included. A backend that keeps the posture carries it (K8sFleet: the CR's
    `spec.task.permissionPosture`, which the operator admits); one that does not (LocalFleet:
    caliband has no such field) simply does not send it — Prospero's own record of it is its
    AgentMeta either way.

    As part of a `ListedAgent`: what the backend says the agent was spawned with. The manager
    reads the posture and the requested protocol from its AgentMeta, not from here (a
    backend's echo only fills in for an agent spawned elsewhere)."""

    prompt: str
    label: str | None = None
    # caliban's agent definition file (its directory: an ACP session's cwd fallback)
    frontmatter_path: str | None = None
    model: str | None = None
    provider: str | None = None
    tool_allowlist: tuple[str, ...] | None = None
    worktree: bool = False  # run in its own git worktree
    inherit_hooks: bool = True
    interactive: bool = False
    source: str | None = None  # which of the workspace's sources it runs in
    drive_protocol: DriveProtocol = "ndjson"
    posture: Posture | None = None


@dataclass(frozen=True, slots=True)
class ListedAgent:
    """An agent as a provider lists it. `address`: where its data path is reached, or None
    while the backend does not know it yet (K8sFleet: only `attach` asks the pod). Drivers
    always resolve the address through `FleetProvider.attach`."""

    id: str
    name: str
    status: AgentStatus
    started_at: str
    spec: AgentSpec
    address: Address | None = None
    session_dir: str = ""  # the agent's store dir (its transcript), "" when not known here
    working_dir: str = ""


@dataclass(frozen=True, slots=True)
class SpawnOutcome:
    """A spawn's answer. `created` False when an identical spawn found the agent there already
    (K8sFleet: the CR named from the spawn's hash existed), so the manager records no second
    `agent_spawned` nor new metadata; a backend whose every spawn makes an agent (LocalFleet)
    always answers True. `address` as in `ListedAgent`."""

    id: str
    address: Address | None
    created: bool = True
