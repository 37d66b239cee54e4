"""How the FleetManager reads an agent: the provider's record (`ListedAgent`) overlaid with
Prospero's own metadata (AgentMeta, issue 9 contract 3).

A backend's listing echoes only what the backend itself keeps (caliband: its own spec
fields), so the drive protocol Prospero asked for, the permission posture and "spawned by this
control plane" come from the AgentMeta store, never from the echo. An agent without metadata
(discovered: spawned by someone else, or before this store existed) is NDJSON unless the
listed record says otherwise, and its posture is the workspace default (resolved when a
decision is made).
"""

from __future__ import annotations

from prospero.core.fleet.records import ListedAgent
from prospero.types.events import run_result
from prospero.types.model import Agent, AgentMeta, AgentStatus, DriveProtocol


def outcome_status(outcome: str) -> AgentStatus:
    """The terminal status an agent_finished outcome reads as (`run_result`, the mapping
    /api/usage counts outcomes with)."""
    return AgentStatus(run_result(outcome))


def drive_protocol(rec: ListedAgent, meta: AgentMeta | None) -> DriveProtocol:
    """The protocol Prospero drives the agent with: its own record of the spawn, else what
    the listed record says (caliban >= 0.14 echoes `drive_protocol`), else NDJSON."""
    return meta.drive_protocol if meta is not None else rec.spec.drive_protocol


def drivable(rec: ListedAgent, meta: AgentMeta | None) -> bool:
    """NDJSON agents are always read (reading is passive); an ACP agent is driven only by
    the control plane that spawned or adopted it: driving means prompting it."""
    if drive_protocol(rec, meta) == "ndjson":
        return True
    return meta is not None and meta.drivable


def effective_status(rec: ListedAgent, meta: AgentMeta | None) -> AgentStatus:
    """caliband's status, except for an agent whose driver recorded its end: an ACP worker
    stays `running` in caliband after its session ended (until released), and the release
    itself marks it `killed`; the agent reads as its outcome instead. A worker that exited
    by itself keeps caliband's verdict (`done` / `failed`)."""
    if meta is None or meta.outcome is None:
        return rec.status
    if not rec.status.terminal:
        return outcome_status(meta.outcome)
    if rec.status is AgentStatus.killed and meta.drive_protocol == "acp":
        return outcome_status(meta.outcome)
    return rec.status


def agent_view(workspace: str, rec: ListedAgent, meta: AgentMeta | None) -> Agent:
    return Agent(
        id=rec.id,
        name=rec.name,
        workspace=workspace,
        status=effective_status(rec, meta),
        started_at=rec.started_at,
        isolated=rec.spec.worktree,
        interactive=rec.spec.interactive,
        session_dir=rec.session_dir,
        drive_protocol=drive_protocol(rec, meta),
        posture=meta.posture if meta is not None else None,
        model=rec.spec.model,
        label=rec.spec.label,
        spawned_here=meta is not None and meta.spawned_here,
        adopted=meta is not None and meta.adopted,
        outcome=meta.outcome if meta is not None else None,
        budget_usd=meta.budget_usd if meta is not None else None,
        budget_tokens=meta.budget_tokens if meta is not None else None,
    )
