"""Prospero's read model of the fleet (caliband-wire.md §7, prospero-surface.md §1.3)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict

from prospero.types.text import ENV_NAME_PATTERN, FreeText, Name


class AgentStatus(StrEnum):
    spawning = "spawning"
    running = "running"
    idle = "idle"
    killed = "killed"
    done = "done"
    failed = "failed"
    crashed = "crashed"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def active(self) -> bool:
        return self in (AgentStatus.spawning, AgentStatus.running)


_TERMINAL = frozenset(
    {AgentStatus.killed, AgentStatus.done, AgentStatus.failed, AgentStatus.crashed}
)

DriveProtocol = Literal["ndjson", "acp"]
Posture = Literal["supervised", "autonomous"]


class Healthy(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    state: Literal["healthy"] = "healthy"


class Unreachable(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    state: Literal["unreachable"] = "unreachable"
    reason: str = ""


WorkspaceHealth = Annotated[Healthy | Unreachable, Field(discriminator="state")]


def _env_schema(schema: JsonDict) -> None:
    """`env` in JSON Schema: names as `propertyNames` (non-empty, no `=`, no control
    character; refused with 400/422), values as free text (pydantic would otherwise describe
    the key rule as `patternProperties`, which leaves other names allowed)."""
    values = schema.pop("patternProperties", None)
    if isinstance(values, dict) and values:
        schema["additionalProperties"] = next(iter(values.values()))
    schema["propertyNames"] = {"minLength": 1, "pattern": ENV_NAME_PATTERN}


def _patch_env_schema(schema: JsonDict) -> None:
    """`env` of a patch (an object or null): the object branch as `_env_schema` puts it."""
    branches = schema.get("anyOf")
    for branch in branches if isinstance(branches, list) else []:
        if isinstance(branch, dict) and branch.get("type") == "object":
            _env_schema(branch)


class CalibandEndpointConfig(BaseModel):
    """A workspace's own networked caliband (local backend), instead of prosperod's default
    (`--caliband-addr`, else Unix discovery of the root's caliband). Files are named, never
    read into the config: the token stays in its file and is never stored or echoed. Checked
    at add/config time (a bad `host:port`, a relative or unreadable file: 400, nothing
    stored)."""

    model_config = ConfigDict(extra="forbid")

    addr: Name = Field(
        min_length=1,
        max_length=300,
        description="HOST:PORT (or [v6]:PORT) of caliband's TCP listener",
    )
    ca_file: Name | None = Field(
        default=None,
        max_length=4096,
        description="absolute path of a PEM CA to verify caliband with (enables TLS)",
    )
    token_file: Name | None = Field(
        default=None,
        max_length=4096,
        description="absolute path of the bearer token file (needs ca_file); read when dialling",
    )
    server_name: Name | None = Field(
        default=None, max_length=253, description="TLS server name (default: caliband)"
    )
    source: Name | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description=(
            "the caliban source (a directory of caliband's workspace root) this workspace's "
            "spawns run in, for a workspace whose root is that source (absent: caliband's root)"
        ),
    )


class RepoProviderConfig(BaseModel):
    """Per-workspace provider config. Optional keys are omitted on output."""

    model_config = ConfigDict(extra="ignore")

    provider: Name | None = None
    base_url: Name | None = None
    api_key_from_env: Name | None = None
    env: dict[Name, FreeText] = Field(default_factory=dict, json_schema_extra=_env_schema)
    caliband: CalibandEndpointConfig | None = Field(
        default=None,
        description=(
            "local backend: this workspace's own networked caliband (absent: prosperod's "
            "default, --caliband-addr or the root's caliband over its Unix socket)"
        ),
    )
    daily_budget_usd: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description=(
            "a cap on the workspace's spend per UTC day, in dollars (all its agents' priced "
            "turns): at 80 % a budget_warning, on crossing it the running agents are stopped "
            "(outcome budget_exceeded) and spawns are refused until the next UTC day"
        ),
    )
    daily_budget_tokens: int | None = Field(
        default=None,
        gt=0,
        le=10**12,
        description="the same cap in tokens (input + output) per UTC day",
    )


# Fields only Prospero reads (never passed to caliband): changing them does not restart the
# workspace's caliband.
PROSPERO_ONLY_FIELDS = frozenset({"daily_budget_usd", "daily_budget_tokens"})


def caliband_facing(config: RepoProviderConfig) -> dict[str, object]:
    """What of `config` reaches the workspace's caliband (a change here restarts it)."""
    return config.model_dump(exclude=set(PROSPERO_ONLY_FIELDS))


class RepoProviderConfigPatch(BaseModel):
    """`PATCH /api/workspaces/{name}/config`: a JSON merge patch (RFC 7396) of a local
    workspace's `RepoProviderConfig`. A field given replaces the current one, `null` clears
    it, a field left out is kept; `env` merges by variable (a variable given `null` is
    removed; `"env": null` clears them all)."""

    model_config = ConfigDict(extra="forbid")

    provider: Name | None = None
    base_url: Name | None = None
    api_key_from_env: Name | None = None
    env: dict[Name, FreeText | None] | None = Field(
        default=None, json_schema_extra=_patch_env_schema
    )
    caliband: CalibandEndpointConfig | None = None
    daily_budget_usd: float | None = Field(default=None, gt=0, le=1_000_000)
    daily_budget_tokens: int | None = Field(default=None, gt=0, le=10**12)

    def apply(self, config: RepoProviderConfig) -> RepoProviderConfig:
        """`config` with this patch applied."""
        data = config.model_dump()
        for key in self.model_fields_set - {"env"}:
            value = getattr(self, key)
            data[key] = value.model_dump() if isinstance(value, BaseModel) else value
        if "env" in self.model_fields_set:
            env: dict[str, str] = {} if self.env is None else dict(config.env)
            for name, value in (self.env or {}).items():
                if value is None:
                    env.pop(name, None)
                else:
                    env[name] = value
            data["env"] = env
        return RepoProviderConfig.model_validate(data)


class Source(BaseModel):
    name: str
    path: str


class Agent(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str
    name: str
    workspace: str
    status: AgentStatus
    started_at: str
    isolated: bool = False
    interactive: bool = False
    session_dir: str = ""
    drive_protocol: DriveProtocol = "ndjson"
    posture: Posture | None = None
    model: str | None = None
    label: str | None = None
    # Whether this control plane spawned (or adopted) the agent, and the final outcome its
    # driver recorded (null while it runs, or when Prospero never saw the end).
    spawned_here: bool = False
    adopted: bool = False
    outcome: str | None = None
    # The caps it was spawned with (null: none): dollars, tokens (input + output).
    budget_usd: float | None = None
    budget_tokens: int | None = None
    # Filled by the API for each response (never stored, never from caliband).
    owner: str | None = Field(
        default=None,
        description=(
            "Clustered: the id of the replica holding the agent's lease now (keyed by the "
            "agent id): the one that drives it, or last drove it while it keeps the lease. "
            "Null when no replica holds it, and always on a standalone prosperod."
        ),
    )
    pending_decisions: int = Field(
        default=0,
        description=(
            "Filled by GET /api/fleet and GET /api/agents/{id}: the agent's permission "
            "decisions waiting for a human "
            "(more than 0: it is awaiting approval, whatever its status says)."
        ),
    )


class AgentMeta(BaseModel):
    """What Prospero itself knows about an agent, kept in its own store (never read back from
    caliband's echo of the SpawnSpec, which carries only caliband's own fields).

    Written at spawn (`spawned_here`), or when a user adopts an agent this control plane did
    not spawn (`adopted`). `outcome` is the agent's final outcome once its driver finished
    (an ACP session that ended reads as finished although caliband still lists its worker)."""

    model_config = ConfigDict(extra="ignore")

    agent_id: str
    workspace: str
    spawned_here: bool = False
    drive_protocol: DriveProtocol = "ndjson"
    posture: Posture | None = None
    prompt: str | None = None
    adopted: bool = False
    created_at: str = ""
    outcome: str | None = None
    budget_usd: float | None = None
    budget_tokens: int | None = None

    @property
    def budgeted(self) -> bool:
        return self.budget_usd is not None or self.budget_tokens is not None

    @property
    def drivable(self) -> bool:
        """An ACP agent is driven only by the control plane that spawned or adopted it."""
        return self.spawned_here or self.adopted


class Workspace(BaseModel):
    name: str
    root: str
    sources: list[Source] = Field(default_factory=list)
    health: WorkspaceHealth = Field(default_factory=Healthy)
    config: RepoProviderConfig = Field(default_factory=RepoProviderConfig)
    agents: list[Agent] = Field(default_factory=list)


class FleetSnapshot(BaseModel):
    host: str
    workspaces: list[Workspace] = Field(default_factory=list)


class RegisteredWorkspace(BaseModel):
    """A workspace as the config store keeps it."""

    name: str
    root: str
    config: RepoProviderConfig = Field(default_factory=RepoProviderConfig)


class GracefulDrain(BaseModel):
    timeout_ms: int = 30_000


class DrainPolicy(BaseModel):
    """`kill` (immediate) or graceful: end input, wait up to timeout, then kill."""

    graceful: GracefulDrain | None = None
