"""K8sFleet's translation between CalibanTask CRs (`wire.k8s`), the seam's records
(`records.py`) and what a CR's pod caliband is told and answers (`wire.control`).

- A CR lists as a `ListedAgent` (`listed_from_task`): id and name the CR name, status from
  `status.phase` (§8.2), spec from the CR (`agent_spec_from_task`), and no address: the
  per-agent address is only known once `attach` has asked the pod's caliband.
- The pod's own `list` overlays the CR's perpetual `Running` (`with_pod_truth`): its record
  supplies `status` and `interactive`.
- A spawn request becomes the CR to apply (`task_for_spawn`), named from a hash of
  (workspace, prompt, label); the CR becomes the SpawnSpec its empty pod's caliband is asked
  to run (`pod_spawn_spec`, §8.3 step 2).
"""

from __future__ import annotations

import dataclasses

from prospero.core.errors import InvalidConfig
from prospero.core.fleet.caliband_spec import wire_spec
from prospero.core.fleet.records import AgentSpec, ListedAgent
from prospero.core.wire.control import AgentRecord, SpawnSpec
from prospero.core.wire.k8s import (
    CalibanTask,
    CalibanTaskSpec,
    ObjectMeta,
    TaskBody,
    WorkspaceRef,
    phase_to_status,
    task_name,
)


def validate_endpoint(addr: str) -> None:
    """`status.calibandEndpoint` must be a bare `host:port`."""
    if not addr.strip():
        raise InvalidConfig("CalibanTask status.calibandEndpoint is empty")
    if "://" in addr:
        raise InvalidConfig(
            f"CalibanTask status.calibandEndpoint must be a bare host:port, not a URL: {addr!r}"
        )
    if any(c.isspace() for c in addr):
        raise InvalidConfig(f"CalibanTask status.calibandEndpoint contains whitespace: {addr!r}")


def incarnation(task: CalibanTask) -> str:
    """One run of a CR name: a re-applied CR (respawn) is a new object with a new uid."""
    return task.metadata.uid or task.metadata.creation_timestamp or ""


def _resolved_provider(task: CalibanTask) -> tuple[str | None, str | None]:
    """(provider kind, model) the operator resolved from the Workspace, if it has."""
    status = task.status
    provider = status.resolved_workspace.provider if status and status.resolved_workspace else None
    return (provider.kind, provider.model) if provider else (None, None)


def agent_spec_from_task(task: CalibanTask) -> AgentSpec:
    """What the CR says its agent was spawned with (the posture as the CR requested it)."""
    kind, model = _resolved_provider(task)
    tools = task.spec.tools
    return AgentSpec(
        prompt=task.spec.task.prompt,
        label=task.name,
        model=model,
        provider=kind,
        tool_allowlist=tuple(tools) if tools is not None else None,
        worktree=False,
        inherit_hooks=True,
        interactive=bool(task.spec.task.interactive),
        drive_protocol=task.drive_protocol,
        posture=task.spec.task.permission_posture,
    )


def pod_spawn_spec(task: CalibanTask) -> SpawnSpec:
    """The SpawnSpec a CR stands for (§8.3 step 2): what the pod's caliband is asked to run."""
    return wire_spec(agent_spec_from_task(task))


def listed_from_task(task: CalibanTask) -> ListedAgent:
    return ListedAgent(
        id=task.name,
        name=task.name,
        status=phase_to_status(task.phase),
        started_at=task.metadata.creation_timestamp or "",
        spec=agent_spec_from_task(task),
        address=None,
        session_dir="",
    )


def with_pod_truth(listed: ListedAgent, pod: AgentRecord) -> ListedAgent:
    """The CR's record with what its pod's caliband lists of the agent: status, interactive."""
    return dataclasses.replace(
        listed,
        status=pod.status,
        spec=dataclasses.replace(listed.spec, interactive=pod.spec.interactive),
    )


def task_for_spawn(namespace: str, workspace: str, spec: AgentSpec) -> CalibanTask:
    """The CR a spawn applies: named from (workspace, prompt, label); `driveProtocol` always
    written, `permissionPosture` when one is given, `interactive` only when true."""
    return CalibanTask(
        metadata=ObjectMeta(
            name=task_name(workspace, spec.prompt, spec.label), namespace=namespace
        ),
        spec=CalibanTaskSpec(
            workspace_ref=WorkspaceRef(name=workspace),
            task=TaskBody(
                prompt=spec.prompt,
                interactive=True if spec.interactive else None,
                drive_protocol=spec.drive_protocol,
                permission_posture=spec.posture,
            ),
            tools=list(spec.tool_allowlist) if spec.tool_allowlist is not None else None,
        ),
    )
