"""`prospero`: the command-line client of prosperod (prospero-surface.md §2; docs/cli.md).

A thin HTTP client, never a second control path: every command maps to API calls. `demo`
is the one exception in shape only: it replaces this process with the demo daemon.

The command modules register their commands on `app` (`cli.app`) when imported, here, in
the order `--help` lists them (by panel: Agents, Fleet, Workspaces, Decisions, Setup). They
import `app`, never this module, so imports point one way.
"""

from __future__ import annotations

import importlib

from prospero.cli.app import app

COMMAND_MODULES = (
    "agents",  # spawn, kill, adopt, respawn, rm, send, end-input, cancel
    "follow",  # follow, logs
    "listing",  # ls, get, describe, status, usage
    "cluster",
    "workspaces",  # workspace add | list | config | rm
    "decisions",  # decisions, approve, deny, policy show | set
    "automations",  # automation create | list | show | enable | disable | delete | run | ...
    "notifications",  # notify add | list | show | enable | disable | remove | test | log
    "contexts",  # context add | use | ls | current | rm
    "tokens",  # token new | list
    "demo",
)
for _name in COMMAND_MODULES:
    importlib.import_module(f"prospero.cli.{_name}")

__all__ = ["app", "main"]


def main() -> None:
    app(prog_name="prospero")


if __name__ == "__main__":
    main()
