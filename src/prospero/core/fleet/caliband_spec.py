"""caliband's SpawnSpec and the seam's AgentSpec, each way: what LocalFleet sends its calibands
and reads back from their listings, and what K8sFleet asks a pod's caliband to run."""

from __future__ import annotations

from prospero.core.fleet.records import AgentSpec
from prospero.core.wire.control import SpawnSpec


def agent_spec_from_wire(spec: SpawnSpec) -> AgentSpec:
    """caliband's echo of a spawn (its own fields: no posture) as the seam's spec."""
    return AgentSpec(
        prompt=spec.initial_prompt,
        label=spec.label,
        frontmatter_path=spec.frontmatter_path,
        model=spec.model,
        provider=spec.provider,
        tool_allowlist=tuple(spec.tool_allowlist) if spec.tool_allowlist is not None else None,
        worktree=spec.isolation_worktree,
        inherit_hooks=spec.inherit_hooks,
        interactive=spec.interactive,
        source=spec.source,
        drive_protocol=spec.drive_protocol,
    )


def wire_spec(spec: AgentSpec) -> SpawnSpec:
    """The SpawnSpec caliband is sent for `spec`: its posture is not among caliband's fields."""
    return SpawnSpec(
        label=spec.label,
        frontmatter_path=spec.frontmatter_path,
        initial_prompt=spec.prompt,
        model=spec.model,
        provider=spec.provider,
        tool_allowlist=list(spec.tool_allowlist) if spec.tool_allowlist is not None else None,
        isolation_worktree=spec.worktree,
        inherit_hooks=spec.inherit_hooks,
        interactive=spec.interactive,
        source=spec.source,
        drive_protocol=spec.drive_protocol,
    )
