"""Arguments and options several commands share, and the parsing of their values."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from prospero.cli.completion import complete_agent_id, complete_workspace

T = TypeVar("T")


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


def renamed(new: T | None, old: T | None, new_flag: str, old_flag: str) -> T | None:
    """The value of an option renamed from `old_flag` to `new_flag` (one name per concept
    across commands). The old spelling is kept as a hidden alias so scripts keep working; using
    it says so on stderr, and giving both is a usage error."""
    if old is None:
        return new
    if new is not None:
        raise typer.BadParameter(
            f"{old_flag} is the former name of {new_flag}: give only {new_flag}",
            param_hint=old_flag,
        )
    typer.echo(f"warning: {old_flag} is deprecated: use {new_flag}", err=True)
    return old


def deprecated(flag: str, new_flag: str) -> Any:
    """The hidden option keeping a renamed flag's old spelling (see `renamed`)."""
    return typer.Option(flag, hidden=True, help=f"Deprecated: {new_flag}.", show_default=False)
