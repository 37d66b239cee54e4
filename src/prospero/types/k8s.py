"""Workspace config and views for the k8s backend's config plane (issue 13; prospero-surface.md
§1.3 `WorkspaceConfig` / `WorkspaceSummary`, caliband-wire.md §8.1 `Workspace`).

`WorkspaceConfig` is the one body of `POST /api/workspaces` (`config`) and
`PUT /api/workspaces/{name}/config` for both backends: `RepoProviderConfig`'s flat fields plus the
k8s-only ones. The local backend takes the flat fields (unknown keys ignored, as before) and
refuses the k8s-only ones with 400; the k8s backend takes `env` and the k8s-only fields and
refuses unknown keys (422) and the local-only ones (400: a provider's key is a Secret there).

The nested k8s models forbid extra keys and refuse empty names (422, with the field's path);
what needs the whole config (≥1 source, ≥1 provider, unique names, `default_provider` naming a
provider) is checked by the k8s admin (`core/fleet/k8s_workspaces.py`) as `invalid_config`
(400), before anything reaches the API server.

Secrets are only named (`credentials_ref`); a view says `has_credentials`, never the ref.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from prospero.types.model import RepoProviderConfig
from prospero.types.text import Name

K8S_ONLY_FIELDS = ("display_name", "sources", "providers", "default_provider", "isolation")
LOCAL_ONLY_FIELDS = ("provider", "base_url", "api_key_from_env", "caliband")


class K8sSource(BaseModel):
    """A source of a Workspace CR: a git repository checked out at `path` in the pod."""

    model_config = ConfigDict(extra="forbid")

    name: Name = Field(min_length=1, max_length=253)
    repo: Name = Field(min_length=1, max_length=4096)
    ref: Name = Field(default="main", min_length=1, max_length=255)  # absent ⇒ main
    path: Name = Field(min_length=1, max_length=4096)


class SecretKeyRef(BaseModel):
    """A key of a Secret in the workspace's namespace: named here, read only by the operator."""

    model_config = ConfigDict(extra="forbid")

    secret_name: Name = Field(min_length=1, max_length=253)
    key: Name = Field(min_length=1, max_length=253)


class K8sProvider(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name = Field(min_length=1, max_length=253)
    kind: Name = Field(min_length=1, max_length=100)
    base_url: Name | None = Field(default=None, max_length=4096)
    model: Name | None = Field(default=None, max_length=253)
    credentials_ref: SecretKeyRef | None = None


class K8sIsolation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runtime_class: Name | None = Field(default=None, min_length=1, max_length=253)
    # The operator's worktree strategy (e.g. `per-source`).
    worktrees: Name | None = Field(default=None, min_length=1, max_length=100)


class WorkspaceConfig(RepoProviderConfig):
    """`RepoProviderConfig` plus the k8s-only fields (see the module docstring)."""

    # Unknown keys are kept (not ignored) so the k8s backend can refuse them by name; the local
    # backend drops them, as it always has.
    model_config = ConfigDict(extra="allow")

    display_name: Name | None = Field(default=None, min_length=1, max_length=253)
    sources: list[K8sSource] | None = None
    providers: list[K8sProvider] | None = None
    default_provider: Name | None = Field(default=None, min_length=1, max_length=253)
    isolation: K8sIsolation | None = None

    def k8s_fields_set(self) -> list[str]:
        return [f for f in K8S_ONLY_FIELDS if getattr(self, f) is not None]

    def local_fields_set(self) -> list[str]:
        return [f for f in LOCAL_ONLY_FIELDS if getattr(self, f) is not None]

    def unknown_fields(self) -> list[str]:
        return sorted(self.model_extra or {})

    def local(self) -> RepoProviderConfig:
        """The flat part (every `RepoProviderConfig` field), for the local backend."""
        return RepoProviderConfig.model_validate(
            {f: getattr(self, f) for f in RepoProviderConfig.model_fields}
        )


class ProviderInfo(BaseModel):
    """A Workspace CR's provider as the API shows it: whether it names a Secret, not which."""

    name: str
    kind: str
    base_url: str | None = None
    model: str | None = None
    has_credentials: bool = False


class WorkspaceReconcile(BaseModel):
    """A Workspace CR's reconciliation as the operator reports it (`status`). `phase` is
    `Pending` until the operator has written a status; it is about the spec `generation` only
    when `observed_generation` equals it (`current`)."""

    phase: str
    message: str | None = None
    generation: int | None = None
    observed_generation: int | None = None

    @property
    def current(self) -> bool:
        return self.generation is not None and self.observed_generation == self.generation


class K8sWorkspaceView(BaseModel):
    """A Workspace CR, read back (core → API)."""

    name: str
    display_name: str
    sources: list[K8sSource] = Field(default_factory=list)
    providers: list[ProviderInfo] = Field(default_factory=list)
    default_provider: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    isolation: K8sIsolation | None = None
    # Prospero's own settings, kept as annotations of the CR (not in the CRD's spec).
    daily_budget_usd: float | None = None
    daily_budget_tokens: int | None = None
    status: WorkspaceReconcile

    def config(self) -> RepoProviderConfig:
        """The flat config the FleetManager reads (env and the daily caps)."""
        return RepoProviderConfig(
            env=dict(self.env),
            daily_budget_usd=self.daily_budget_usd,
            daily_budget_tokens=self.daily_budget_tokens,
        )


class WorkspaceAccepted(BaseModel):
    """202 body of a k8s workspace write: the CR as applied (or deleted); the operator
    reconciles it asynchronously (poll `GET /api/workspaces` for `status`)."""

    name: str
    status: WorkspaceReconcile
