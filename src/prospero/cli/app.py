"""The `prospero` Typer app and what every command shares: the global options (--addr/--server,
--token, --context, --output, --version), the settings they make (with the named contexts of
`cli.config`), the client and consoles, and the error handling that turns failures into one
line and the exit code of their kind (`cli.exits`).

Imports point one way: `main` imports the command modules, which import this module (and
`params`, `render`, `output`, `client`); nothing here imports a command module.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.exceptions import TyperException

from prospero.cli import config, exits
from prospero.cli.client import DEFAULT_ADDR, Client, CliError, normalize_addr
from prospero.cli.output import OutputFormat

F = TypeVar("F", bound=Callable[..., Any])

# Exceptions the CLI framework turns into usage messages / exit codes itself. Typer >= 0.2x
# vendors click (its exceptions derive from TyperException); older ones use click's own.
_PASSTHROUGH: tuple[type[BaseException], ...] = (typer.Exit, typer.Abort, TyperException)
try:
    import click

    _PASSTHROUGH += (click.exceptions.ClickException, click.exceptions.Exit)
except ImportError:  # pragma: no cover
    pass

ADDR_ENV = "PROSPERO_ADDR"
TOKEN_ENV = "PROSPERO_API_TOKEN"


def version() -> str:
    import prospero

    return prospero.__version__


@dataclass
class Settings:
    """The root options as given; `target()` resolves them against the config file."""

    addr: str | None = None
    token: str | None = None
    context: str | None = None
    output: OutputFormat = OutputFormat.text

    def target(self, addr: str | None = None, token: str | None = None) -> tuple[str, str | None]:
        """(server URL, token): a command's own --addr/--token, else the root ones (or
        PROSPERO_ADDR / PROSPERO_API_TOKEN), else the selected context's, else the default.
        A context's token goes only to that context's server, never to an --addr given
        instead."""
        addr = addr or self.addr
        token = token or self.token
        # The file is read when it may matter: an explicit --context, no server given (the
        # current context may name one), or no token given (the context may hold it).
        wanted = bool(self.context) or addr is None or token is None
        ctx = config.selected(config.load(), self.context) if wanted else None
        if ctx is not None:
            same = addr is None or normalize_addr(addr) == normalize_addr(ctx.server)
            if addr is None:
                addr = ctx.server
            if token is None and same:
                token = ctx.read_token()
        return addr or DEFAULT_ADDR, token or None


EPILOG = (
    "Agent ids may be shortened to any unique prefix. Output: -o text (default), wide, json "
    "or yaml. Server: --addr/--server or PROSPERO_ADDR, else the current context "
    "(prospero context --help). " + exits.help_text()
)

app = typer.Typer(
    name="prospero",
    help="Control a fleet of caliban coding agents through prosperod.",
    epilog=EPILOG,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

OutputOpt = Annotated[
    OutputFormat | None,
    typer.Option(
        "--output",
        "-o",
        help="text (default), wide (more columns), json or yaml (the API's data).",
    ),
]
AddrOpt = Annotated[
    str | None,
    typer.Option(
        "--addr",
        "--server",
        help="URL of prosperod (also accepted before the command).",
        hidden=True,
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
    obj = ctx.find_root().obj
    if isinstance(obj, Settings):
        return obj
    return Settings()


def _client(ctx: typer.Context, addr: str | None = None, token: str | None = None) -> Client:
    url, tok = _settings(ctx).target(addr, token)
    return Client(url, tok)


def _fmt(ctx: typer.Context, output: OutputFormat | None) -> OutputFormat:
    return output or _settings(ctx).output


def handle_errors(fn: F) -> F:
    """One line on stderr and the exit code of its kind for every expected failure."""

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
            raise typer.Exit(exits.INTERRUPTED) from None
        except BrokenPipeError:
            # `prospero follow ID | head`: the reader left; exit quietly like other tools.
            with contextlib.suppress(Exception):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            raise typer.Exit(exits.BROKEN_PIPE) from None
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
            raise typer.Exit(exits.FAILURE) from None

    return wrapper  # type: ignore[return-value]


def _print_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"prospero {version()}\n")
        raise typer.Exit(exits.OK)


@app.callback()
def _root(
    ctx: typer.Context,
    addr: Annotated[
        str | None,
        typer.Option(
            "--addr",
            "--server",
            envvar=ADDR_ENV,
            help=f"URL of prosperod (default: the current context's, else {DEFAULT_ADDR}).",
            show_default=False,
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar=TOKEN_ENV,
            help="Bearer token for prosperod's API (default: the current context's).",
            show_default=False,
        ),
    ] = None,
    context: Annotated[
        str | None,
        typer.Option(
            "--context",
            envvar=config.CONTEXT_ENV,
            help="Use this named context (server + token) of the config file.",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        OutputFormat,
        typer.Option("--output", "-o", help="Default output format for every command."),
    ] = OutputFormat.text,
    _version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Control a fleet of caliban coding agents through prosperod."""
    ctx.obj = Settings(addr=addr or None, token=token or None, context=context, output=output)
