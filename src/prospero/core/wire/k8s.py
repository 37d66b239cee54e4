"""Mirrors of the caliban operator's CRDs (caliband-wire.md §8.1; issue 13): `CalibanTask` and
`Workspace`, group `caliban.caliban-ai.dev`, version `v1alpha1`, namespaced.

Mirrored, not depended on: keys are camelCase on the wire (aliases), unknown keys are ignored
(`status.conditions` and whatever a newer operator adds), and `status.phase` is a plain string
so an unknown phase still decodes (`phase_to_status` gives it a terminal fallback). A list is
decoded item by item (`decode_items`): one schema-skewed CR is skipped and counted, never fatal
to the listing it came in.

Prospero writes `spec` only (server-side apply, field manager `prospero`); the operator owns
`status`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from prospero.types.model import AgentStatus, DriveProtocol, Posture

log = logging.getLogger(__name__)

GROUP = "caliban.caliban-ai.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
TASK_KIND = "CalibanTask"
TASK_PLURAL = "calibantasks"
WORKSPACE_KIND = "Workspace"
WORKSPACE_PLURAL = "workspaces"
FIELD_MANAGER = "prospero"


class _Cr(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, alias_generator=to_camel)

    def to_wire(self) -> dict[str, Any]:
        """camelCase keys, unset optionals omitted (what a server-side apply should own)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# --- shared -----------------------------------------------------------------------------------


class ObjectMeta(_Cr):
    name: str
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    annotations: dict[str, str] | None = None


class IsolationSpec(_Cr):
    runtime_class: str | None = None
    # The operator's worktree strategy (e.g. `per-source`), a string as in deploy/crds/ (the
    # config plane writes it from `isolation.worktrees`); a boolean (an older CRD) still decodes.
    worktrees: str | bool | None = None


class SourceSpec(_Cr):
    name: str
    repo: str
    ref: str = "main"
    path: str


class CredentialsRef(_Cr):
    secret_name: str
    key: str


class ProviderSpec(_Cr):
    name: str
    kind: str
    base_url: str | None = None
    model: str | None = None
    credentials_ref: CredentialsRef | None = None


class EnvVar(_Cr):
    name: str
    value: str = ""


# --- CalibanTask ------------------------------------------------------------------------------


class WorkspaceRef(_Cr):
    name: str


class TaskBody(_Cr):
    """`spec.task`. Prospero writes `interactive` only when true, `driveProtocol` only when it is
    not the default `ndjson`, and never `agentType`."""

    prompt: str
    agent_type: str | None = None
    interactive: bool | None = None
    drive_protocol: DriveProtocol | None = None
    permission_posture: Posture | None = None


class CalibanTaskSpec(_Cr):
    workspace_ref: WorkspaceRef
    provider_ref: str | None = None
    task: TaskBody
    isolation: IsolationSpec | None = None
    tools: list[str] | None = None


class SandboxRef(_Cr):
    name: str


class ResolvedWorkspace(_Cr):
    sources: list[SourceSpec] = []
    provider: ProviderSpec | None = None
    env: list[EnvVar] = []
    isolation: IsolationSpec | None = None


class CalibanTaskStatus(_Cr):
    phase: str = ""
    caliband_endpoint: str | None = None
    sandbox_ref: SandboxRef | None = None
    resolved_workspace: ResolvedWorkspace | None = None
    # The posture the operator admitted (it may refuse the one asked for in spec.task).
    permission_posture: Posture | None = None


class CalibanTask(_Cr):
    api_version: str = API_VERSION
    kind: str = TASK_KIND
    metadata: ObjectMeta
    spec: CalibanTaskSpec
    status: CalibanTaskStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def phase(self) -> str:
        return self.status.phase if self.status is not None else ""

    @property
    def drive_protocol(self) -> DriveProtocol:
        """Absent ⇒ ndjson (issue 13)."""
        return self.spec.task.drive_protocol or "ndjson"

    @property
    def permission_posture(self) -> Posture | None:
        """What the agent runs under: the operator-admitted posture when it reported one,
        else the one Prospero asked for in `spec.task`."""
        admitted = self.status.permission_posture if self.status is not None else None
        return admitted or self.spec.task.permission_posture

    def apply_body(self) -> dict[str, Any]:
        """The object Prospero server-side applies: identity and spec, never status."""
        body = self.to_wire()
        body.pop("status", None)
        meta = body["metadata"]
        body["metadata"] = {k: meta[k] for k in ("name", "namespace") if k in meta}
        return body


# --- Workspace --------------------------------------------------------------------------------


class WorkspaceSpec(_Cr):
    display_name: str
    sources: list[SourceSpec] = []
    providers: list[ProviderSpec] = []
    default_provider: str | None = None
    env: list[EnvVar] | None = None
    isolation: IsolationSpec | None = None


class WorkspaceStatus(_Cr):
    phase: str = ""
    observed_generation: int | None = None
    message: str | None = None


class Workspace(_Cr):
    api_version: str = API_VERSION
    kind: str = WORKSPACE_KIND
    metadata: ObjectMeta
    spec: WorkspaceSpec
    status: WorkspaceStatus | None = None


# --- helpers ----------------------------------------------------------------------------------


def task_name(workspace: str, prompt: str, label: str | None) -> str:
    """`ct-` + the first 16 hex of SHA-256(workspace ‖ 0x00 ‖ prompt ‖ 0x00 ‖ label?): the same
    (workspace, prompt, label) always names the same CR, so a re-submitted spawn is idempotent
    (model, tools, interactive, protocol do not take part)."""
    h = hashlib.sha256()
    h.update(workspace.encode())
    h.update(b"\x00")
    h.update(prompt.encode())
    h.update(b"\x00")
    if label is not None:
        h.update(label.encode())
    return "ct-" + h.hexdigest()[:16]


_PHASES: dict[str, AgentStatus] = {
    "": AgentStatus.spawning,
    "Pending": AgentStatus.spawning,
    "Provisioning": AgentStatus.spawning,
    "Running": AgentStatus.running,
    "Draining": AgentStatus.idle,
    "Completed": AgentStatus.done,
    "Failed": AgentStatus.failed,
}


def phase_to_status(phase: str) -> AgentStatus:
    """§8.2. An unknown non-empty phase is terminal (`failed`, logged): a phase this mirror is
    too old to name is likelier a new way to finish than a new way to start."""
    status = _PHASES.get(phase)
    if status is None:
        log.warning("unrecognised CalibanTask phase %r: reported as failed", phase)
        return AgentStatus.failed
    return status


M = TypeVar("M", bound=BaseModel)


def decode_items(model: type[M], items: Iterable[Mapping[str, Any]]) -> tuple[list[M], int]:
    """Decode each item on its own: `(decoded, skipped)`. A skewed item is logged and counted."""
    out: list[M] = []
    skipped = 0
    for item in items:
        try:
            out.append(model.model_validate(item))
        except ValidationError as e:
            skipped += 1
            name = (
                (item.get("metadata") or {}).get("name", "?") if isinstance(item, Mapping) else "?"
            )
            log.warning(
                "skipping %s %r that does not match this mirror: %s",
                model.__name__,
                name,
                e.errors(include_url=False)[:3],
            )
    return out, skipped
