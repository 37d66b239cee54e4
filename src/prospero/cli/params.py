"""Arguments and options several commands share, and the parsing of their values."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from prospero.cli.completion import complete_agent_id, complete_workspace


class DriveProtocolOpt(StrEnum):
    ndjson = "ndjson"
    acp = "acp"


class PostureOpt(StrEnum):
    supervised = "supervised"
    autonomous = "autonomous"


AgentIdArg = Annotated[
    str,
    typer.Argument(
        metavar="ID",
        help="Agent id, or any unique prefix of it.",
        autocompletion=complete_agent_id,
        show_default=False,
    ),
]
WorkspaceArg = Annotated[
    str,
    typer.Argument(metavar="WORKSPACE", help="Workspace name.", autocompletion=complete_workspace),
]
WorkspaceFilterOpt = Annotated[
    str | None,
    typer.Option("--workspace", help="Only this workspace's.", autocompletion=complete_workspace),
]


def abs_path(p: str) -> str:
    return str(Path(os.path.expanduser(p)).absolute()) if p else p


def parse_timeout(value: str, option: str = "--timeout") -> float | None:
    """Seconds, or `none` (also `never`, `0`, empty) for no timeout."""
    if value.strip().lower() in ("none", "never", "0", ""):
        return None
    try:
        secs = float(value)
    except ValueError:
        raise typer.BadParameter(
            f"expected seconds or 'none', got {value!r}", param_hint=option
        ) from None
    if secs < 0:
        raise typer.BadParameter("must be >= 0", param_hint=option)
    return secs
