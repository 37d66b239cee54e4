"""`prospero token`: manage prosperod's scoped API tokens file (ADR 0010).

    prospero token new NAME --scope read|operate|admin --api-tokens-file FILE
    prospero token list --api-tokens-file FILE [-o json]

`new` generates a token (`pspo_` + 32 random bytes, base64url), appends only its SHA-256 hash
to FILE (created with mode 0600; rewritten atomically) and prints the token once on stdout: it
cannot be shown again. A running prosperod started with `--api-tokens-file FILE` accepts it at
once (the file is re-read when it changes). To revoke a token, delete its line.

These commands work on the file, not over HTTP: whoever may edit the tokens file is the
administrator. `--api-tokens-file` (prosperod's own flag name; `--tokens-file` is its hidden,
deprecated alias) defaults to `$PROSPERO_API_TOKENS_FILE` (the daemon's variable).

Registered on the main app when `prospero.cli.main` imports this module.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from prospero.cli.app import (
    OutputOpt,
    _console,
    _err_console,
    _fmt,
    app,
    handle_errors,
)
from prospero.cli.client import CliError
from prospero.cli.output import print_data
from prospero.cli.params import deprecated, renamed
from prospero.types.tokens import Scope, TokenFileError, add_token, read_tokens_file

token_app = typer.Typer(
    help="Create and list scoped API tokens in prosperod's tokens file (--api-tokens-file).",
    no_args_is_help=True,
)
app.add_typer(token_app, name="token", rich_help_panel="Setup")


class ScopeOpt(StrEnum):
    read = "read"
    operate = "operate"
    admin = "admin"


TokensFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--api-tokens-file",
        envvar="PROSPERO_API_TOKENS_FILE",
        help="The tokens file prosperod reads (its --api-tokens-file).",
        show_default=False,
    ),
]
OldTokensFileOpt = Annotated[Path | None, deprecated("--tokens-file", "--api-tokens-file")]


def _tokens_file(new: Path | None, old: Path | None) -> Path:
    path = renamed(new, old, "--api-tokens-file", "--tokens-file")
    if path is None:
        raise typer.BadParameter(
            "the tokens file prosperod reads: give --api-tokens-file FILE (or set "
            "PROSPERO_API_TOKENS_FILE)",
            param_hint="--api-tokens-file",
        )
    return path.expanduser()


@token_app.command("new")
@handle_errors
def token_new(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="Token name (A-Z a-z 0-9 _ . -), unique.")
    ],
    tokens_file: TokensFileOpt = None,
    scope: Annotated[
        ScopeOpt,
        typer.Option("--scope", help="read < operate < admin (agents: operate)."),
    ] = ScopeOpt.read,
    old_tokens_file: OldTokensFileOpt = None,
    output: OutputOpt = None,
) -> None:
    """Generate a token, store its hash in the tokens file, print the token once."""
    path = _tokens_file(tokens_file, old_tokens_file)
    try:
        token = add_token(path, name, Scope.parse(scope.value))
    except TokenFileError as e:
        raise CliError(str(e)) from None
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data(
            {"name": name, "scope": scope.value, "token": token, "tokens_file": str(path)}, fmt
        )
    else:
        sys.stdout.write(token + "\n")
        sys.stdout.flush()
    _err_console().print(
        f"token [bold]{escape(name)}[/bold] ({scope.value}) added to {escape(str(path))}; "
        "it is shown only this once. Use it as `Authorization: Bearer <token>`, "
        "`prospero --token`, PROSPERO_API_TOKEN, or sign in to the dashboard with it."
    )


@token_app.command("list")
@handle_errors
def token_list(
    ctx: typer.Context,
    tokens_file: TokensFileOpt = None,
    old_tokens_file: OldTokensFileOpt = None,
    output: OutputOpt = None,
) -> None:
    """The tokens' names and scopes (never the tokens, which the file does not hold)."""
    path = _tokens_file(tokens_file, old_tokens_file)
    try:
        entries = read_tokens_file(path)
    except TokenFileError as e:
        raise CliError(str(e)) from None
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data([{"name": x.name, "scope": x.scope.name} for x in entries], fmt)
        return
    con = _console()
    if not entries:
        con.print("no tokens")
        return
    width = max(len(entry.name) for entry in entries)
    con.print(f"[bold]{'NAME':<{width}}  SCOPE[/bold]")
    for entry in entries:
        con.print(f"{escape(entry.name):<{width}}  {entry.scope.name}")
