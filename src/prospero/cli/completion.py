"""Shell completion of agent ids and workspace names (`prospero --install-completion`).

Each callback asks prosperod (the server and token the command line, environment or context
name) with a short timeout and completes nothing when it cannot: completion never hangs the
shell for long and never prints a traceback.
"""

from __future__ import annotations

from typing import Any

import httpx
import typer

from prospero.cli.app import Settings
from prospero.cli.client import Client
from prospero.types.api import WorkspaceSummary
from prospero.types.model import FleetSnapshot

# Connecting and answering: a completion waits at most about 2 s for a server that is down
# or stuck.
COMPLETION_TIMEOUT = httpx.Timeout(1.5, connect=0.5)


def _client(ctx: typer.Context) -> Client:
    root = ctx.find_root().params
    own = ctx.params
    settings = Settings(addr=root.get("addr"), token=root.get("token"), context=root.get("context"))
    url, token = settings.target(own.get("addr"), own.get("token"))
    return Client(url, token, timeout=COMPLETION_TIMEOUT)


def _safely(ctx: typer.Context, fetch: Any) -> list[tuple[str, str]]:
    try:
        with _client(ctx) as c:
            return list(fetch(c))
    except Exception:  # no server, a bad config, a surprising reply: complete nothing
        return []


def complete_agent_id(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    def fetch(c: Client) -> list[tuple[str, str]]:
        fleet = c.get_model("/api/fleet", FleetSnapshot)
        return [
            (a.id, " ".join(x for x in (w.name, a.status.value, a.label or "") if x))
            for w in fleet.workspaces
            for a in w.agents
            if a.id.startswith(incomplete)
        ]

    return _safely(ctx, fetch)


def complete_workspace(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    def fetch(c: Client) -> list[tuple[str, str]]:
        rows = c.get_model("/api/workspaces", list[WorkspaceSummary])
        return [(w.name, w.root) for w in rows if w.name.startswith(incomplete)]

    return _safely(ctx, fetch)
