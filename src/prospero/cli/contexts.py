"""`prospero context add | use | ls | current | rm`: named contexts (a prosperod URL and its
token) in the CLI's config file (`cli.config`: `$XDG_CONFIG_HOME/prospero/config.yaml`, mode
0600). The current context is used when neither --addr/--server nor PROSPERO_ADDR is given;
`--context NAME` (or PROSPERO_CONTEXT) picks another one for one command.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from prospero.cli import config, exits
from prospero.cli.app import OutputOpt, _console, _fmt, app, handle_errors
from prospero.cli.client import CliError, normalize_addr
from prospero.cli.output import print_data
from prospero.cli.render import table

context_app = typer.Typer(
    help="Named contexts: which prosperod to talk to, and with which token.",
    no_args_is_help=True,
)
app.add_typer(context_app, name="context", rich_help_panel="Setup")


def _complete_context(incomplete: str) -> list[str]:
    try:
        return [n for n in config.load().contexts if n.startswith(incomplete)]
    except Exception:  # a broken config file completes nothing
        return []


NameArg = Annotated[
    str, typer.Argument(metavar="NAME", help="Context name.", autocompletion=_complete_context)
]


def _existing(cfg: config.CliConfig, name: str) -> config.Context:
    found = cfg.contexts.get(name)
    if found is None:
        known = ", ".join(sorted(cfg.contexts)) or "none"
        raise CliError(f"no context '{name}' (contexts: {known})", exits.NOT_FOUND)
    return found


def _view(c: config.Context, current: str | None) -> dict[str, Any]:
    """A context as -o json|yaml shows it (never the token itself)."""
    return {
        "name": c.name,
        "server": c.server,
        "token_file": c.token_file,
        "has_token": bool(c.token),
        "current": c.name == current,
    }


@context_app.command("add")
@handle_errors
def context_add(
    ctx: typer.Context,
    name: NameArg,
    server: Annotated[
        str, typer.Option("--server", "--addr", help="URL of prosperod.", show_default=False)
    ],
    token_file: Annotated[
        Path | None,
        typer.Option("--token-file", help="A file holding the token (read at each use)."),
    ] = None,
    token_stdin: Annotated[
        bool,
        typer.Option("--token-stdin", help="Read the token from stdin and keep it in the file."),
    ] = False,
    use: Annotated[bool, typer.Option("--use", help="Make it the current context.")] = False,
    output: OutputOpt = None,
) -> None:
    """Add a context (or replace the one of that name). The first one becomes current."""
    config.check_name(name)
    if token_file is not None and token_stdin:
        raise typer.BadParameter("give --token-file or --token-stdin, not both")
    url = normalize_addr(server)
    entry = config.Context(name, url)
    if token_file is not None:
        path = Path(os.path.expanduser(token_file)).absolute()
        if not os.access(path, os.R_OK) or not path.is_file():
            raise CliError(f"cannot read the token file {path}", exits.USAGE)
        entry.token_file = str(path)
        entry.read_token()  # refuses an empty file now rather than at first use
    if token_stdin:
        token = sys.stdin.readline().strip()
        if not token:
            raise CliError("no token on stdin", exits.USAGE)
        entry.token = token
    cfg = config.load()
    replaced = name in cfg.contexts
    cfg.contexts[name] = entry
    if use or cfg.current is None or cfg.current not in cfg.contexts:
        cfg.current = name
    path = config.save(cfg)
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data(_view(entry, cfg.current), fmt)
        return
    verb = "replaced" if replaced else "added"
    tail = " (current)" if cfg.current == name else ""
    _console().print(f"{verb} context '{escape(name)}'{tail}: {escape(url)} in {escape(str(path))}")


@context_app.command("use")
@handle_errors
def context_use(ctx: typer.Context, name: NameArg, output: OutputOpt = None) -> None:
    """Make a context the current one."""
    cfg = config.load()
    entry = _existing(cfg, name)
    cfg.current = name
    config.save(cfg)
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data(_view(entry, name), fmt)
        return
    _console().print(f"switched to context '{escape(name)}' ({escape(entry.server)})")


@context_app.command("ls")
@handle_errors
def context_ls(ctx: typer.Context, output: OutputOpt = None) -> None:
    """List the contexts (* marks the current one)."""
    cfg = config.load()
    rows = [cfg.contexts[n] for n in sorted(cfg.contexts)]
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data([_view(c, cfg.current) for c in rows], fmt)
        return
    con = _console()
    if not rows:
        con.print(f"no contexts (config file: {escape(str(config.config_path()))})")
        return
    table(
        con,
        ["CURRENT", "NAME", "SERVER", "TOKEN"],
        [
            [
                "*" if c.name == cfg.current else "",
                c.name,
                c.server,
                c.token_file or ("(in the config file)" if c.token else "-"),
            ]
            for c in rows
        ],
    )


@context_app.command("current")
@handle_errors
def context_current(ctx: typer.Context, output: OutputOpt = None) -> None:
    """Print the current context's name (exit 3 when none is set)."""
    cfg = config.load()
    entry = config.selected(cfg, None)
    if entry is None:
        raise CliError("no current context (prospero context use NAME)", exits.NOT_FOUND)
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data(_view(entry, cfg.current), fmt)
        return
    _console().print(entry.name)


@context_app.command("rm")
@handle_errors
def context_rm(ctx: typer.Context, name: NameArg, output: OutputOpt = None) -> None:
    """Remove a context (the current one too: then none is current)."""
    cfg = config.load()
    _existing(cfg, name)
    del cfg.contexts[name]
    if cfg.current == name:
        cfg.current = None
    config.save(cfg)
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data({"name": name, "removed": True}, fmt)
        return
    _console().print(f"removed context '{escape(name)}'")
