"""The `prospero` Typer app and what every command shares: the global options (--addr,
--token, --output), the settings they make, the client and consoles, JSON output and the
error handling that turns failures into one line and an exit code. The commands register
themselves on `app` (`prospero.cli.main` imports them)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.exceptions import TyperException

from prospero.cli.client import DEFAULT_ADDR, Client, CliError

F = TypeVar("F", bound=Callable[..., Any])

# Exceptions the CLI framework turns into usage messages / exit codes itself. Typer >= 0.2x
# vendors click (its exceptions derive from TyperException); older ones use click's own.
_PASSTHROUGH: tuple[type[BaseException], ...] = (typer.Exit, typer.Abort, TyperException)
try:
    import click

    _PASSTHROUGH += (click.exceptions.ClickException, click.exceptions.Exit)
except ImportError:  # pragma: no cover
    pass


class OutputFormat(StrEnum):
    text = "text"
    json = "json"


class DriveProtocolOpt(StrEnum):
    ndjson = "ndjson"
    acp = "acp"


class PostureOpt(StrEnum):
    supervised = "supervised"
    autonomous = "autonomous"


@dataclass
class Settings:
    addr: str = DEFAULT_ADDR
    token: str | None = None
    output: OutputFormat = OutputFormat.text


app = typer.Typer(
    name="prospero",
    help="Control a fleet of caliban coding agents through prosperod.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

OutputOpt = Annotated[
    OutputFormat | None,
    typer.Option("--output", "-o", help="Output format: text (default) or json (raw API JSON)."),
]


AddrOpt = Annotated[
    str | None,
    typer.Option(
        "--addr", help="URL of prosperod (also accepted before the command).", hidden=True
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", help="Bearer token (also accepted before the command).", hidden=True),
]


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _err_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _settings(ctx: typer.Context) -> Settings:
    root = ctx.find_root()
    obj = root.obj
    if isinstance(obj, Settings):
        return obj
    return Settings()


def _client(ctx: typer.Context, addr: str | None = None, token: str | None = None) -> Client:
    s = _settings(ctx)
    return Client(addr or s.addr, token or s.token)


def _fmt(ctx: typer.Context, output: OutputFormat | None) -> OutputFormat:
    return output or _settings(ctx).output


def _abs_path(p: str) -> str:
    return str(Path(os.path.expanduser(p)).absolute()) if p else p


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def handle_errors(fn: F) -> F:
    """One line on stderr and a non-zero exit for every expected failure."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CliError as e:
            sys.stdout.flush()
            _err_console().print(f"[red]error:[/red] {escape(e.message)}")
            raise typer.Exit(e.code) from None
        except KeyboardInterrupt:
            sys.stdout.flush()
            raise typer.Exit(130) from None
        except BrokenPipeError:
            # `prospero follow ID | head`: the reader left; exit quietly like other tools.
            with contextlib.suppress(Exception):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            raise typer.Exit(141) from None
        except _PASSTHROUGH:
            raise
        except Exception as e:  # a bug or a surprising reply: still one line, no traceback
            if os.environ.get("PROSPERO_DEBUG"):
                raise
            sys.stdout.flush()
            _err_console().print(
                f"[red]error:[/red] unexpected failure: {escape(type(e).__name__)}: {escape(str(e))}"
                " (set PROSPERO_DEBUG=1 for a traceback)"
            )
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


@app.callback()
def _root(
    ctx: typer.Context,
    addr: Annotated[
        str,
        typer.Option(
            "--addr",
            envvar="PROSPERO_ADDR",
            help="URL of prosperod.",
            show_default=True,
        ),
    ] = DEFAULT_ADDR,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="PROSPERO_API_TOKEN",
            help="Bearer token for prosperod's API.",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        OutputFormat,
        typer.Option("--output", "-o", help="Default output format for every command."),
    ] = OutputFormat.text,
) -> None:
    """Control a fleet of caliban coding agents through prosperod."""
    ctx.obj = Settings(addr=addr, token=token or None, output=output)
