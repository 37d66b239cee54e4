"""The workspace permission policy: an ordered rule list (allow / deny / ask by tool kind,
title glob, command glob, path glob; the first matching rule wins), the option that carries
out an `allow` / `reject`, and the per-workspace cache of the stored policies."""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from dataclasses import dataclass
from typing import Any

from prospero.core.errors import StoreError
from prospero.core.store.decisions import DecisionStore
from prospero.types.decisions import PolicyPatch, PolicyRule, WorkspacePolicy
from prospero.types.events import DecisionToolCall
from prospero.types.model import Posture

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PolicyMatch:
    rule: PolicyRule
    name: str

    @property
    def action(self) -> str:
        return self.rule.action


def _glob(value: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern)


def command_of(value: Any) -> str | None:
    """`rawInput.command` (or `cmd`) as one string; an argv list is joined with spaces."""
    if not isinstance(value, dict):
        return None
    for key in ("command", "cmd"):
        cmd = value.get(key)
        if isinstance(cmd, str):
            return cmd
        if isinstance(cmd, list) and all(isinstance(p, str) for p in cmd):
            return " ".join(cmd)
    return None


def paths_of(value: Any) -> list[str]:
    """The file paths a tool input names (`path`, `file_path`, `filePath`, `notebook_path`,
    `paths`)."""
    if not isinstance(value, dict):
        return []
    out: list[str] = []
    for key in ("path", "file_path", "filePath", "notebook_path"):
        p = value.get(key)
        if isinstance(p, str) and p:
            out.append(p)
    many = value.get("paths")
    if isinstance(many, list):
        out.extend(p for p in many if isinstance(p, str) and p)
    return out


def rule_matches(rule: PolicyRule, tc: DecisionToolCall) -> bool:
    if rule.kind is not None and not _glob(tc.kind or "other", rule.kind):
        return False
    if rule.title is not None and not _glob(tc.title, rule.title):
        return False
    if rule.command is not None:
        cmd = command_of(tc.input)
        if cmd is None or not _glob(cmd, rule.command):
            return False
    if rule.path is not None:
        pattern = rule.path
        if not any(_glob(p, pattern) for p in paths_of(tc.input)):
            return False
    return True


def rule_name(workspace: str, index: int, rule: PolicyRule) -> str:
    return rule.name or f"{workspace}#{index + 1}"


def evaluate_policy(
    policy: WorkspacePolicy, workspace: str, tc: DecisionToolCall
) -> PolicyMatch | None:
    """The first rule of the workspace's ordered list that matches the tool call."""
    for i, rule in enumerate(policy.rules):
        if rule_matches(rule, tc):
            return PolicyMatch(rule, rule_name(workspace, i, rule))
    return None


class WorkspacePolicies:
    """The workspaces' policies; writes (set, patch) are serialised in this process so a
    patch applies to the policy it read.

    Standalone (`cache=True`), this process is the only writer: each policy is read from the
    store once and cached. Clustered (`cache=False`), any replica may set a policy, so every
    read goes to the shared store (a policy is read once per permission request and once
    per spawn; a cached copy would never see another replica's write). Patches are not
    serialised across replicas: two replicas patching one workspace's policy at the same
    moment can each apply theirs to the policy both read, and the later write wins."""

    def __init__(self, store: DecisionStore, *, cache: bool = True) -> None:
        self.store = store
        self.cache = cache
        self._policies: dict[str, WorkspacePolicy] = {}
        self._lock = asyncio.Lock()

    async def get(self, workspace: str) -> WorkspacePolicy:
        cached = self._policies.get(workspace) if self.cache else None
        if cached is not None:
            return cached
        stored = await self.store.get_policy(workspace)
        policy = stored or WorkspacePolicy()
        if self.cache:
            self._policies[workspace] = policy
        return policy

    async def set(self, workspace: str, policy: WorkspacePolicy) -> WorkspacePolicy:
        async with self._lock:
            return await self._set(workspace, policy)

    async def _set(self, workspace: str, policy: WorkspacePolicy) -> WorkspacePolicy:
        await self.store.put_policy(workspace, policy)
        if self.cache:
            self._policies[workspace] = policy
        log.info(
            "workspace %s: permission policy set (%d rules, posture %s, timeout %s)",
            workspace,
            len(policy.rules),
            policy.posture or "default",
            policy.timeout_s,
        )
        return policy

    async def patch(self, workspace: str, patch: PolicyPatch) -> WorkspacePolicy:
        async with self._lock:
            return await self._set(workspace, patch.apply(await self.get(workspace)))

    async def default_posture(self, workspace: str) -> Posture | None:
        """The workspace's default posture (None = not set)."""
        try:
            return (await self.get(workspace)).posture
        except StoreError as e:
            log.warning("workspace %s: cannot read the permission policy: %s", workspace, e)
            return None
