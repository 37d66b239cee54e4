"""ACP `authenticate`: which advertised method Prospero may use (acp.md §1-§3, issue 9
deliverable 7).

An agent that needs credentials answers `session/new` (or `session/load`) with JSON-RPC
`-32000` "Authentication required" and lists its `authMethods` in the `initialize` result.
Prospero authenticates only with a method the workspace has credentials for, decided from the
*names* of the environment variables the agent's environment holds (the workspace's provider
configuration; never their values), else the agent finishes at once with
`agent_finished{outcome: "auth_required"}` naming the advertised methods. The rule, in order:

1. the method id the workspace configuration names (`preferred`), when advertised;
2. an `env_var` method (unstable `type: "env_var"`, codex-acp) whose required `vars` are all
   present;
3. an agent-handled method whose id, name or description names a present credential variable,
   with `-` read as `_` and case ignored (codex-acp `openai-api-key` ↔ `OPENAI_API_KEY`,
   "Use CODEX_API_KEY" ↔ `CODEX_API_KEY`).

`terminal` methods (an interactive login) are never chosen.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

from acp import schema as s

from prospero.core.drivers.base import DriverTarget
from prospero.core.provider_env import resolve_env
from prospero.types.model import RegisteredWorkspace

AUTH_REQUIRED_CODE = -32000
AUTH_REQUIRED_OUTCOME = "auth_required"
_CREDENTIAL = re.compile(r"(API_KEY|TOKEN|SECRET|_KEY)$")


def method_label(m: Any) -> str:
    name = getattr(m, "name", "") or ""
    mid = getattr(m, "id", "") or ""
    return f"{mid} ({name})" if name and name != mid else mid


def describe_methods(methods: Sequence[Any]) -> str:
    return ", ".join(method_label(m) for m in methods) or "none"


def _norm(text: str) -> str:
    return re.sub(r"[^A-Z0-9]+", "_", text.upper())


def pick_method(
    methods: Sequence[Any], env_names: Collection[str], preferred: str | None = None
) -> str | None:
    """The id of the method to authenticate with, or None (see the module docstring)."""
    present = {n for n in env_names if n}
    if preferred:
        for m in methods:
            if getattr(m, "id", None) == preferred and not isinstance(m, s.TerminalAuthMethod):
                return preferred
    for m in methods:
        if isinstance(m, s.EnvVarAuthMethod):
            required = [v.name for v in m.vars if not getattr(v, "optional", False)]
            if required and all(name in present for name in required):
                return str(m.id)
    creds = sorted(n for n in present if _CREDENTIAL.search(n.upper()))
    for m in methods:
        if isinstance(m, s.TerminalAuthMethod | s.EnvVarAuthMethod):
            continue
        mid = str(getattr(m, "id", ""))
        about = " ".join((mid, getattr(m, "name", "") or "", getattr(m, "description", "") or ""))
        words = "_" + _norm(about) + "_"
        if mid and any(f"_{_norm(c)}_" in words for c in creds):
            return mid
    return None


class WorkspaceLister(Protocol):
    async def list_workspaces(self) -> list[RegisteredWorkspace]: ...


def workspace_credentials(
    config_store: WorkspaceLister, default_env: Mapping[str, str] | None = None
) -> Callable[[DriverTarget], Awaitable[Collection[str]]]:
    """A `credentials=` lookup for `acp_driver_factory`: the names of the variables set in
    the agent's environment as caliband gets it (`provider_env.resolve_env` of the agent's
    workspace; the values never leave it)."""

    async def lookup(target: DriverTarget) -> Collection[str]:
        for ws in await config_store.list_workspaces():
            if ws.name == target.workspace:
                env = resolve_env(ws.config, default_env)
                return sorted(k for k, v in env.items() if v)
        return ()

    return lookup
