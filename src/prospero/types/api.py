"""HTTP API DTOs (prospero-surface.md §1.3). The FleetManager speaks these too."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from prospero.types.k8s import (
    K8sIsolation,
    K8sSource,
    ProviderInfo,
    WorkspaceConfig,
    WorkspaceReconcile,
)
from prospero.types.model import (
    DriveProtocol,
    Posture,
    RepoProviderConfig,
    Source,
    WorkspaceHealth,
)
from prospero.types.text import AbsolutePath, FreeText, Name


class SpawnRequest(BaseModel):
    """Body of POST /api/workspaces/{ws}/agents. Only `isolation: "shared"` disables worktrees."""

    model_config = ConfigDict(extra="forbid")

    prompt: FreeText = Field(min_length=1, max_length=1_000_000)
    label: Name | None = Field(default=None, max_length=200)
    model: Name | None = Field(default=None, max_length=200)
    isolation: Name | None = None
    tool_allowlist: list[Name] | None = None
    interactive: bool = False
    frontmatter_path: Name | None = None
    provider_ref: Name | None = None
    drive_protocol: DriveProtocol = "ndjson"
    posture: Posture | None = None
    budget_usd: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description="Stop the agent once its turns cost more than this many dollars.",
    )
    budget_tokens: int | None = Field(
        default=None,
        gt=0,
        le=10**12,
        description="Stop the agent once its turns used more tokens (input + output) than this.",
    )

    @property
    def isolated(self) -> bool:
        return self.isolation != "shared"


class SpawnedResponse(BaseModel):
    agent_id: str
    workspace: str
    isolated: bool
    created: bool = True
    drive_protocol: DriveProtocol = "ndjson"


class RespawnedResponse(BaseModel):
    agent_id: str


class AgentInputBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: FreeText = Field(min_length=1, max_length=1_000_000)


class AdoptBody(BaseModel):
    """`POST /api/agents/{id}/adopt`: drive an agent this control plane did not spawn."""

    model_config = ConfigDict(extra="forbid")
    # The protocol to drive it with; default: what caliband's record says (else NDJSON).
    drive_protocol: DriveProtocol | None = None


class AddWorkspaceBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    # Local: absolute; must be an existing directory (400 otherwise). k8s: absent (a
    # workspace is a Workspace CR; its sources are in `config.sources`).
    root: AbsolutePath = ""
    config: WorkspaceConfig = Field(default_factory=WorkspaceConfig)


class WorkspaceSummary(BaseModel):
    name: str
    root: str
    sources: list[Source] = Field(default_factory=list)
    health: WorkspaceHealth
    agent_count: int = 0
    config: RepoProviderConfig = Field(default_factory=RepoProviderConfig)
    warnings: list[str] = Field(
        default_factory=list,
        description=(
            "What will stop this workspace's spawns although its config was accepted, with "
            "what to do (local backend: a provider key variable missing from prosperod's "
            "environment). Omitted when there is none."
        ),
    )
    # The k8s backend's tail (its Workspace CR); omitted entirely for a local workspace.
    display_name: str | None = None
    source_specs: list[K8sSource] | None = None
    providers: list[ProviderInfo] | None = None
    default_provider: str | None = None
    isolation: K8sIsolation | None = None
    status: WorkspaceReconcile | None = None


K8S_SUMMARY_TAIL = (
    "display_name",
    "source_specs",
    "providers",
    "default_provider",
    "isolation",
    "status",
)


class Readiness(BaseModel):
    ready: bool
    store_writable: bool
    workspaces_total: int
    workspaces_healthy: int
    workspaces_unreachable: int


class Capabilities(BaseModel):
    admin: bool = True
    async_workspace_ops: bool = False
    drive_protocols: list[DriveProtocol] = Field(default_factory=lambda: ["ndjson"])  # type: ignore[arg-type]


class MetricsSnapshot(BaseModel):
    """GET /api/metrics: process-lifetime counters (`active_attaches` is a gauge). The five
    upstream names are always present; every other counter/gauge is included too."""

    model_config = ConfigDict(extra="allow")

    events_appended: int = 0
    append_failures: int = 0
    unknown_frames: int = 0
    repos_polled: int = 0
    active_attaches: int = 0


class ErrorEnvelope(BaseModel):
    """Every error the API answers: `{"error": "<message>", "kind": "<code>"}`."""

    model_config = ConfigDict(extra="forbid")

    error: str = Field(description="Human-readable message.")
    kind: str = Field(
        description=(
            "Machine-readable code: not_found, invalid_request, invalid_state, conflict, "
            "unauthorized, forbidden, cross_origin, host_not_allowed, rate_limited, "
            "request_timeout, payload_too_large, unsupported_media_type, unreachable, "
            "internal, …"
        )
    )


ErrorBody = ErrorEnvelope  # the former name


class UsageOutcomes(BaseModel):
    done: int = 0
    failed: int = 0
    killed: int = 0
    crashed: int = 0
    # Runs Prospero stopped at their budget (not counted in `killed`).
    budget_exceeded: int = 0


class UsageBucket(BaseModel):
    day: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    turns: int = 0
    runs: int = 0
    outcomes: UsageOutcomes = Field(default_factory=UsageOutcomes)


class UsageGroup(BaseModel):
    workspace: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    turns: int = 0
    runs: int = 0
    outcomes: UsageOutcomes = Field(default_factory=UsageOutcomes)
    series: list[UsageBucket] = Field(default_factory=list)


class UsageReport(BaseModel):
    since: str
    until: str
    groups: list[UsageGroup] = Field(default_factory=list)


DrainMode = Literal["kill", "graceful"]
