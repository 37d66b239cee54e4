"""K8sWorkspaces: the k8s backend's config plane, over `Workspace` CRs (issue 13;
prospero-surface.md §5 "Config plane", caliband-wire.md §8.1).

Prospero is a pure editor of a Workspace's `spec`; the operator owns `status` and reconciles
asynchronously, so a write answers with the CR's phase as it stands (202 at the API).

- `apply(name, config, create=...)`: validate (`workspace_spec`: `invalid_config` before anything
  reaches the API server, not the apiserver's 422), then server-side apply as field manager
  `prospero`, forced. The spec is built whole from the config, so a field the new config omits
  is removed (Prospero owned it): PUT replaces wholesale, as it does for the local backend.
  `create=True` (POST) refuses a different existing spec (409, like a local name registered at
  another root) and leaves an identical one alone; `create=False` (PUT) needs the CR to exist.
- `delete(name)`: idempotent; returns whether the CR was there.
- `get(name)` / `views()`: the CRs as `K8sWorkspaceView` (credentials reduced to
  `has_credentials`; `status.phase` `Pending` until the operator has written one), each decoded
  on its own (a skewed CR is skipped and counted, as for CalibanTasks).
- `list_workspaces()`: the FleetManager's registry under k8s (ADR 0013): one
  `RegisteredWorkspace` per Workspace CR, rootless.

Secrets are only named (`providers[].credentialsRef {secretName, key}`); this module never reads
a Secret (nor asks for any resource but Workspaces). Errors are translated as K8sFleet's are.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from lightkube import AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType
from pydantic import ValidationError

from prospero.core.errors import (
    Conflict,
    InvalidConfig,
    NotFound,
    ProtocolError,
    WorkspaceNotFound,
)
from prospero.core.fleet.k8s import K8sFleet
from prospero.core.fleet.k8s_tasks import kube_errors
from prospero.core.wire.k8s import (
    FIELD_MANAGER,
    GROUP,
    VERSION,
    WORKSPACE_KIND,
    WORKSPACE_PLURAL,
    CredentialsRef,
    EnvVar,
    IsolationSpec,
    ObjectMeta,
    ProviderSpec,
    SourceSpec,
    Workspace,
    WorkspaceSpec,
    decode_items,
)
from prospero.types.k8s import (
    K8sIsolation,
    K8sSource,
    K8sWorkspaceView,
    ProviderInfo,
    WorkspaceAccepted,
    WorkspaceConfig,
    WorkspaceReconcile,
)
from prospero.types.model import RegisteredWorkspace, RepoProviderConfig, Source

log = logging.getLogger(__name__)

WorkspaceResource = create_namespaced_resource(GROUP, VERSION, WORKSPACE_KIND, WORKSPACE_PLURAL)

# A Workspace CR's name is a DNS-1123 subdomain (Prospero's own names also allow upper case and
# `_`, which the API server would refuse with a 422).
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _duplicates(names: list[str]) -> list[str]:
    return sorted({n for n in names if names.count(n) > 1})


def workspace_spec(name: str, config: WorkspaceConfig) -> WorkspaceSpec:
    """The Workspace spec a config stands for, or `InvalidConfig` saying what is wrong."""
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise InvalidConfig(
            f"workspace name {name!r} cannot name a Workspace CR: under the k8s backend a "
            "workspace name is lower-case letters, digits, '-' and '.', starting and ending "
            "with a letter or digit"
        )
    if unknown := config.unknown_fields():
        raise InvalidConfig(f"unknown field(s) in the workspace config: {', '.join(unknown)}")
    if local := config.local_fields_set():
        raise InvalidConfig(
            f"{', '.join(local)}: local-backend field(s); under the k8s backend a workspace's "
            "providers are `providers` [{name, kind, base_url?, model?, credentials_ref?}] and "
            "a provider's key is a Secret it names (credentials_ref {secret_name, key})"
        )
    if not config.sources:
        raise InvalidConfig(
            "a k8s workspace needs at least one source: sources [{name, repo, path, ref?}]"
        )
    if not config.providers:
        raise InvalidConfig(
            "a k8s workspace needs at least one provider: providers [{name, kind, ...}]"
        )
    if dup := _duplicates([s.name for s in config.sources]):
        raise InvalidConfig(f"source name(s) used twice: {', '.join(dup)}")
    provider_names = [p.name for p in config.providers]
    if dup := _duplicates(provider_names):
        raise InvalidConfig(f"provider name(s) used twice: {', '.join(dup)}")
    if config.default_provider is not None and config.default_provider not in provider_names:
        raise InvalidConfig(
            f"default_provider {config.default_provider!r} is not one of the providers "
            f"({', '.join(provider_names)})"
        )
    isolation = None
    if config.isolation is not None and (
        config.isolation.runtime_class or config.isolation.worktrees
    ):
        isolation = IsolationSpec(
            runtime_class=config.isolation.runtime_class, worktrees=config.isolation.worktrees
        )
    return WorkspaceSpec(
        display_name=config.display_name or name,
        sources=[
            SourceSpec(name=s.name, repo=s.repo, ref=s.ref, path=s.path) for s in config.sources
        ],
        providers=[
            ProviderSpec(
                name=p.name,
                kind=p.kind,
                base_url=p.base_url,
                model=p.model,
                credentials_ref=(
                    CredentialsRef(
                        secret_name=p.credentials_ref.secret_name, key=p.credentials_ref.key
                    )
                    if p.credentials_ref is not None
                    else None
                ),
            )
            for p in config.providers
        ],
        default_provider=config.default_provider,
        env=[EnvVar(name=k, value=v) for k, v in sorted(config.env.items())] or None,
        isolation=isolation,
    )


# Prospero-only settings of a workspace (the daily caps, issue 15) are not Workspace spec fields
# (the CRD is caliban's, and an API server prunes what its schema does not declare): they are
# annotations of the CR, applied by field manager `prospero` with the spec, so a PUT without
# them removes them and every replica reads them with the CR.
ANNOTATION_PREFIX = "prospero.caliban-ai.dev/"
DAILY_USD = ANNOTATION_PREFIX + "daily-budget-usd"
DAILY_TOKENS = ANNOTATION_PREFIX + "daily-budget-tokens"


def workspace_annotations(config: WorkspaceConfig) -> dict[str, str]:
    out: dict[str, str] = {}
    if config.daily_budget_usd is not None:
        out[DAILY_USD] = repr(float(config.daily_budget_usd))
    if config.daily_budget_tokens is not None:
        out[DAILY_TOKENS] = str(int(config.daily_budget_tokens))
    return out


def _ours(cr: Workspace) -> dict[str, str]:
    return {
        k: v for k, v in (cr.metadata.annotations or {}).items() if k.startswith(ANNOTATION_PREFIX)
    }


def daily_caps_of(cr: Workspace) -> tuple[float | None, int | None]:
    """The CR's daily caps; a value that does not parse (edited by hand) is left out, logged."""
    ours = _ours(cr)
    caps: dict[str, Any] = {}
    for key, field in ((DAILY_USD, "daily_budget_usd"), (DAILY_TOKENS, "daily_budget_tokens")):
        if key in ours:
            try:
                caps[field] = getattr(RepoProviderConfig.model_validate({field: ours[key]}), field)
            except ValidationError:
                log.warning(
                    "Workspace %s: annotation %s=%r is not a valid cap: ignored",
                    cr.metadata.name,
                    key,
                    ours[key],
                )
    return caps.get("daily_budget_usd"), caps.get("daily_budget_tokens")


def reconcile_of(cr: Workspace) -> WorkspaceReconcile:
    status = cr.status
    return WorkspaceReconcile(
        phase=(status.phase if status is not None else "") or "Pending",
        message=status.message if status is not None else None,
        generation=cr.metadata.generation,
        observed_generation=status.observed_generation if status is not None else None,
    )


def view_of(cr: Workspace) -> K8sWorkspaceView:
    spec = cr.spec
    iso = spec.isolation
    worktrees = iso.worktrees if iso is not None else None
    usd, tokens = daily_caps_of(cr)
    return K8sWorkspaceView(
        name=cr.metadata.name,
        display_name=spec.display_name,
        sources=[K8sSource(name=s.name, repo=s.repo, ref=s.ref, path=s.path) for s in spec.sources],
        providers=[
            ProviderInfo(
                name=p.name,
                kind=p.kind,
                base_url=p.base_url,
                model=p.model,
                has_credentials=p.credentials_ref is not None,
            )
            for p in spec.providers
        ],
        default_provider=spec.default_provider,
        env={e.name: e.value for e in spec.env or []},
        isolation=(
            K8sIsolation(
                runtime_class=iso.runtime_class,
                # an older CRD declared a boolean; shown as the operator's words
                worktrees=str(worktrees).lower() if isinstance(worktrees, bool) else worktrees,
            )
            if iso is not None
            else None
        ),
        daily_budget_usd=usd,
        daily_budget_tokens=tokens,
        status=reconcile_of(cr),
    )


class K8sWorkspaces:
    """The Workspace CRs of one namespace (see the module docstring)."""

    def __init__(self, namespace: str, api: Callable[[], AsyncClient]) -> None:
        self.namespace = namespace
        self._api = api
        self.skipped_crs = 0  # CRs the last listing skipped (schema skew)
        self._sources: dict[str, list[Source]] = {}

    @classmethod
    def for_fleet(cls, fleet: K8sFleet) -> K8sWorkspaces:
        """Sharing the fleet's namespace and API client (one connection pool, one config)."""
        return cls(fleet.namespace, fleet._api)

    # --- reads ------------------------------------------------------------------------------

    async def _get(self, name: str) -> Workspace | None:
        try:
            with kube_errors(f"get Workspace {name}"):
                obj = await self._api().get(WorkspaceResource, name, namespace=self.namespace)
        except NotFound:  # the API server's 404, translated
            return None
        got, _ = decode_items(Workspace, [obj.to_dict()])  # type: ignore[no-untyped-call]
        if not got:
            raise ProtocolError(f"Workspace {name} does not match this Prospero's CRD mirror")
        return got[0]

    async def get(self, name: str) -> K8sWorkspaceView | None:
        cr = await self._get(name)
        return view_of(cr) if cr is not None else None

    async def views(self) -> list[K8sWorkspaceView]:
        raw: list[dict[str, Any]] = []
        with kube_errors("list Workspaces"):
            async for obj in self._api().list(WorkspaceResource, namespace=self.namespace):
                raw.append(obj.to_dict())  # type: ignore[no-untyped-call]
        crs, self.skipped_crs = decode_items(Workspace, raw)
        views = sorted((view_of(cr) for cr in crs), key=lambda v: v.name)
        self._sources = {
            v.name: [Source(name=s.name, path=s.path) for s in v.sources] for v in views
        }
        return views

    async def list_workspaces(self) -> list[RegisteredWorkspace]:
        """The registry under k8s: one rootless workspace per Workspace CR, in name order."""
        return [
            RegisteredWorkspace(name=v.name, root="", config=v.config()) for v in await self.views()
        ]

    def sources(self, name: str) -> list[Source]:
        """The workspace's sources as the last listing read them (name, path in the pod)."""
        return list(self._sources.get(name, []))

    # --- writes -----------------------------------------------------------------------------

    async def apply(self, name: str, config: WorkspaceConfig, *, create: bool) -> WorkspaceAccepted:
        spec = workspace_spec(name, config)
        annotations = workspace_annotations(config)
        existing = await self._get(name)
        if existing is None and not create:
            raise WorkspaceNotFound(name)
        if existing is not None and create:
            if existing.spec.to_wire() != spec.to_wire() or _ours(existing) != annotations:
                raise Conflict(
                    f"workspace '{name}' exists with another config (PUT "
                    f"/api/workspaces/{name}/config replaces it)"
                )
            return WorkspaceAccepted(name=name, status=reconcile_of(existing))  # a no-op
        cr = Workspace(metadata=ObjectMeta(name=name, namespace=self.namespace), spec=spec)
        body = cr.to_wire()
        body.pop("status", None)
        body["metadata"] = {"name": name, "namespace": self.namespace}
        if annotations:
            body["metadata"]["annotations"] = annotations
        with kube_errors(f"apply Workspace {name}"):
            applied = await self._api().patch(
                WorkspaceResource,
                name,
                body,
                namespace=self.namespace,
                patch_type=PatchType.APPLY,
                field_manager=FIELD_MANAGER,
                force=True,
            )
        got, _ = decode_items(Workspace, [applied.to_dict()])  # type: ignore[no-untyped-call]
        if not got:
            raise ProtocolError(f"the applied Workspace {name} does not match this mirror")
        self._sources[name] = [Source(name=s.name, path=s.path) for s in spec.sources]
        return WorkspaceAccepted(name=name, status=reconcile_of(got[0]))

    async def delete(self, name: str) -> bool:
        """Delete the CR; False when there was none (not an error: deletes are idempotent)."""
        self._sources.pop(name, None)
        try:
            with kube_errors(f"delete Workspace {name}"):
                await self._api().delete(WorkspaceResource, name, namespace=self.namespace)
        except NotFound:  # the API server's 404, translated: already gone
            return False
        return True
