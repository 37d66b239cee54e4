"""`prospero`: the command-line client of prosperod (prospero-surface.md §2).

A thin HTTP client, never a second control path: every command maps to API calls. `demo`
is the one exception in shape only: it replaces this process with the demo daemon.
"""

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

from prospero.cli import render
from prospero.cli.client import DEFAULT_ADDR, Client, CliError, follow_events, seg

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
workspace_app = typer.Typer(
    help="Register and configure workspaces (a root holding one or more git checkouts).",
    no_args_is_help=True,
)
app.add_typer(workspace_app, name="workspace")

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


# ---------------------------------------------------------------------- workspaces


@workspace_app.command("add")
@handle_errors
def workspace_add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="Workspace name.")],
    root: Annotated[
        str,
        typer.Argument(metavar="ROOT", help="Root directory (a git checkout or a folder of them)."),
    ],
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Register a workspace with prosperod."""
    root_abs = _abs_path(root)
    with _client(ctx, addr, token) as c:
        resp = c.request("POST", "/api/workspaces", json_body={"name": name, "root": root_abs})
    if _fmt(ctx, output) is OutputFormat.json:
        _print_json({"name": name, "root": root_abs, "status": resp.status_code})
        return
    _console().print(f"registered workspace '{escape(name)}' at {escape(root_abs)}")


@workspace_app.command("list")
@handle_errors
def workspace_list(
    ctx: typer.Context, output: OutputOpt = None, addr: AddrOpt = None, token: TokenOpt = None
) -> None:
    """List registered workspaces with health and agent counts."""
    with _client(ctx, addr, token) as c:
        rows = c.get_json("/api/workspaces")
    if _fmt(ctx, output) is OutputFormat.json:
        _print_json(rows)
        return
    render.render_workspaces(_console(), rows if isinstance(rows, list) else [])


def _parse_env(values: list[str] | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--env")
        env[key.strip()] = value
    return env


@workspace_app.command("config")
@handle_errors
def workspace_config(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="Workspace name.")],
    provider: Annotated[str | None, typer.Option("--provider", help="Provider id.")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", help="Provider base URL.")] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option("--api-key-env", help="Name of a variable in prosperod's environment."),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="KEY=VALUE for the workspace's caliband (repeatable)."),
    ] = None,
    posture: Annotated[
        PostureOpt | None,
        typer.Option(
            "--posture",
            help="Default permission posture of the workspace's spawns (does not touch the "
            "provider config).",
        ),
    ] = None,
    decision_timeout: Annotated[
        str | None,
        typer.Option(
            "--decision-timeout",
            help="Seconds a supervised permission ask waits for a human, or 'none'.",
        ),
    ] = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Replace a workspace's provider config (omitted fields are cleared), and/or set its
    permission defaults (--posture, --decision-timeout: only these change when they are the
    only options given)."""
    provider_given = bool(provider or base_url or api_key_env or env)
    if posture is not None or decision_timeout is not None:
        from prospero.cli.decisions import parse_timeout

        patch: dict[str, Any] = {}
        if posture is not None:
            patch["posture"] = posture.value
        if decision_timeout is not None:
            patch["timeout_s"] = parse_timeout(decision_timeout)
        with _client(ctx, addr, token) as c:
            c.request("PATCH", f"/api/workspaces/{seg(name)}/policy", json_body=patch)
        _console().print(f"updated permission defaults of workspace '{escape(name)}'")
        if not provider_given:
            return
    body: dict[str, Any] = {}
    if provider:
        body["provider"] = provider
    if base_url:
        body["base_url"] = base_url
    if api_key_env:
        body["api_key_from_env"] = api_key_env
    parsed = _parse_env(env)
    if parsed:
        body["env"] = parsed
    with _client(ctx, addr, token) as c:
        c.request("PUT", f"/api/workspaces/{seg(name)}/config", json_body=body, send_body=True)
    _console().print(f"updated provider config for workspace '{escape(name)}'")


@workspace_app.command("rm")
@handle_errors
def workspace_rm(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="Workspace name.")],
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Unregister a workspace (its agents and caliband keep running)."""
    with _client(ctx, addr, token) as c:
        c.request("DELETE", f"/api/workspaces/{seg(name)}")
    _console().print(f"unregistered workspace '{escape(name)}'")


# ---------------------------------------------------------------------- agents


def _abs_path(p: str) -> str:
    return str(Path(os.path.expanduser(p)).absolute()) if p else p


@app.command("spawn")
@handle_errors
def spawn(
    ctx: typer.Context,
    workspace: Annotated[str, typer.Argument(metavar="WORKSPACE", help="Workspace to spawn in.")],
    prompt: Annotated[
        str, typer.Argument(metavar="PROMPT", help="Initial prompt ('-' reads it from stdin).")
    ],
    label: Annotated[str | None, typer.Option("--label", help="Human label.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model id.")] = None,
    shared_tree: Annotated[
        bool, typer.Option("--shared-tree", help="Work in the shared tree, not a worktree.")
    ] = False,
    interactive: Annotated[
        bool, typer.Option("--interactive", help="Keep the agent open for more input.")
    ] = False,
    tool_allowlist: Annotated[
        list[str] | None,
        typer.Option("--tool-allowlist", help="Allow only this tool (repeatable)."),
    ] = None,
    frontmatter: Annotated[
        str | None, typer.Option("--frontmatter", help="Path to an agent frontmatter file.")
    ] = None,
    drive_protocol: Annotated[
        DriveProtocolOpt | None,
        typer.Option("--drive-protocol", help="How prosperod drives the agent."),
    ] = None,
    posture: Annotated[
        PostureOpt | None, typer.Option("--posture", help="Permission posture.")
    ] = None,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Spawn an agent in a workspace."""
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise CliError("the prompt is empty", code=2)
    body: dict[str, Any] = {
        "prompt": prompt,
        "isolation": "shared" if shared_tree else "worktree",
        "interactive": interactive,
    }
    if label:
        body["label"] = label
    if model:
        body["model"] = model
    if tool_allowlist:
        body["tool_allowlist"] = list(tool_allowlist)
    if frontmatter:
        body["frontmatter_path"] = _abs_path(frontmatter)
    if drive_protocol is not None:
        body["drive_protocol"] = drive_protocol.value
    if posture is not None:
        body["posture"] = posture.value
    with _client(ctx, addr, token) as c:
        resp = c.request("POST", f"/api/workspaces/{seg(workspace)}/agents", json_body=body)
    data = resp.json()
    if _fmt(ctx, output) is OutputFormat.json:
        _print_json(data)
        return
    tree = "worktree" if data.get("isolated", not shared_tree) else "shared tree"
    _console().print(
        f"spawned agent {data.get('agent_id')} in workspace "
        f"'{escape(str(data.get('workspace', workspace)))}' ({tree})"
    )


@app.command("ls")
@handle_errors
def ls(
    ctx: typer.Context, output: OutputOpt = None, addr: AddrOpt = None, token: TokenOpt = None
) -> None:
    """List workspaces and their agents."""
    with _client(ctx, addr, token) as c:
        fleet = c.get_json("/api/fleet")
    if _fmt(ctx, output) is OutputFormat.json:
        _print_json(fleet)
        return
    render.render_fleet(_console(), fleet)


@app.command("status")
@handle_errors
def status(
    ctx: typer.Context, output: OutputOpt = None, addr: AddrOpt = None, token: TokenOpt = None
) -> None:
    """Is the daemon up? Then the fleet listing."""
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        up = c.healthz()
        if not up:
            if fmt is OutputFormat.json:
                _print_json({"daemon": "unreachable", "addr": c.addr})
            else:
                _console().print(f"daemon: [red]unreachable[/red] ({escape(c.addr)})")
            raise CliError(f"cannot reach prosperod at {c.addr} (is the daemon running?)")
        fleet = c.get_json("/api/fleet")
    if fmt is OutputFormat.json:
        _print_json({"daemon": "up", "addr": c.addr, "fleet": fleet})
        return
    con = _console()
    con.print(f"daemon: [green]up[/green] ({escape(c.addr)})")
    render.render_fleet(con, fleet)


@app.command("follow")
@handle_errors
def follow(
    ctx: typer.Context,
    agent_id: Annotated[str, typer.Argument(metavar="ID", help="Agent id.")],
    from_seq: Annotated[
        int, typer.Option("--from", min=0, help="Start at this event seq (0 = from the start).")
    ] = 0,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Follow an agent's events live until it finishes (resumes across disconnects)."""
    as_json = _fmt(ctx, output) is OutputFormat.json
    renderer = render.FollowRenderer(_console())
    with _client(ctx, addr, token) as c:
        c.ensure_agent_known(agent_id)
        if not as_json:
            renderer.header(agent_id)
        try:
            for item in follow_events(c, agent_id, from_seq):
                if as_json:
                    if item.kind == "event":
                        sys.stdout.write(json.dumps(item.data, ensure_ascii=False) + "\n")
                    elif item.kind == "gap":
                        sys.stdout.write(json.dumps({"gap": item.data}) + "\n")
                    sys.stdout.flush()
                    continue
                if item.kind == "event":
                    renderer.event(item.data)
                elif item.kind == "gap":
                    renderer.gap(item.data)
                elif item.kind == "reconnect":
                    renderer.reconnect(item.data)
        finally:
            if not as_json:
                renderer.finish()


def _agent_action(
    ctx: typer.Context, addr: str | None, token: str | None, agent_id: str, action: str, done: str
) -> None:
    """POST a body-less agent operation (kill, end-input, cancel) and say it was sent."""
    with _client(ctx, addr, token) as c:
        c.request("POST", f"/api/agents/{seg(agent_id)}/{action}", send_body=True)
    _console().print(done)


@app.command("kill")
@handle_errors
def kill(
    ctx: typer.Context,
    agent_id: Annotated[str, typer.Argument(metavar="ID")],
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Kill an agent (caliband stops it)."""
    _agent_action(ctx, addr, token, agent_id, "kill", f"kill requested for {agent_id}")


@app.command("adopt")
@handle_errors
def adopt(
    ctx: typer.Context,
    agent_id: Annotated[str, typer.Argument(metavar="ID")],
    drive_protocol: Annotated[
        DriveProtocolOpt | None,
        typer.Option("--drive-protocol", help="Drive it with this protocol (default: caliband's)."),
    ] = None,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Drive an agent this control plane did not spawn (ACP agents are otherwise only listed)."""
    body = {"drive_protocol": drive_protocol.value} if drive_protocol is not None else None
    with _client(ctx, addr, token) as c:
        data = c.request(
            "POST", f"/api/agents/{seg(agent_id)}/adopt", json_body=body, send_body=True
        ).json()
    if _fmt(ctx, output) is OutputFormat.json:
        _print_json(data)
        return
    _console().print(
        f"adopted {agent_id} ({escape(str(data.get('drive_protocol')))}, "
        f"{escape(str(data.get('status')))})"
    )


@app.command("respawn")
@handle_errors
def respawn(
    ctx: typer.Context,
    agent_id: Annotated[str, typer.Argument(metavar="ID")],
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Start a finished agent again with the same spec (gets a new id)."""
    with _client(ctx, addr, token) as c:
        data = c.request("POST", f"/api/agents/{seg(agent_id)}/respawn", send_body=True).json()
    if _fmt(ctx, output) is OutputFormat.json:
        _print_json(data)
        return
    _console().print(f"respawned {agent_id} as {data.get('agent_id')}")


@app.command("rm")
@handle_errors
def rm(
    ctx: typer.Context,
    agent_id: Annotated[str, typer.Argument(metavar="ID")],
    force: Annotated[
        bool, typer.Option("--force", "-f", help="Remove even if still running.")
    ] = False,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Remove an agent from caliband's registry (history stays queryable)."""
    with _client(ctx, addr, token) as c:
        c.request(
            "DELETE", f"/api/agents/{seg(agent_id)}", params={"force": "true"} if force else None
        )
    _console().print(f"removed {agent_id}")


@app.command("send")
@handle_errors
def send(
    ctx: typer.Context,
    agent_id: Annotated[str, typer.Argument(metavar="ID")],
    text: Annotated[
        str, typer.Argument(metavar="TEXT", help="Message for the agent ('-' reads stdin).")
    ],
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Send a message to an interactive agent."""
    if text == "-":
        text = sys.stdin.read()
    if not text:
        raise CliError("the message is empty", code=2)
    with _client(ctx, addr, token) as c:
        c.request("POST", f"/api/agents/{seg(agent_id)}/input", json_body={"text": text})
    _console().print(f"sent message to {agent_id}")


@app.command("end-input")
@handle_errors
def end_input(
    ctx: typer.Context,
    agent_id: Annotated[str, typer.Argument(metavar="ID")],
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Tell an interactive agent there is no more input (it finishes its run)."""
    _agent_action(ctx, addr, token, agent_id, "end-input", f"end-input sent to {agent_id}")


@app.command("cancel")
@handle_errors
def cancel(
    ctx: typer.Context,
    agent_id: Annotated[str, typer.Argument(metavar="ID")],
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Cancel the agent's current turn (drivers that support it)."""
    _agent_action(ctx, addr, token, agent_id, "cancel", f"cancel requested for {agent_id}")


@app.command("usage")
@handle_errors
def usage(
    ctx: typer.Context,
    days: Annotated[
        int | None, typer.Option("--days", min=1, help="Window length in days.")
    ] = None,
    since: Annotated[str | None, typer.Option("--since", help="RFC 3339 start.")] = None,
    until: Annotated[str | None, typer.Option("--until", help="RFC 3339 end.")] = None,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Tokens, cost, turns and outcomes per workspace per UTC day."""
    with _client(ctx, addr, token) as c:
        report = c.get_json("/api/usage", params={"days": days, "since": since, "until": until})
    if _fmt(ctx, output) is OutputFormat.json:
        _print_json(report)
        return
    render.render_usage(_console(), report)


@app.command("demo")
def demo(
    port: Annotated[int, typer.Option("--port", "-p", min=0, max=65535, help="HTTP port.")] = 7878,
    data_dir: Annotated[
        str | None, typer.Option("--data-dir", help="Keep demo data here (default: a temp dir).")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Bind address.")] = "127.0.0.1",
    api_tokens_file: Annotated[
        str | None,
        typer.Option(
            "--api-tokens-file",
            help="Require scoped API tokens from this file (prospero token new).",
        ),
    ] = None,
) -> None:
    """Run prosperod with a fake caliband serving a demo fleet (no caliban needed)."""
    argv = [sys.executable, "-m", "prospero.daemon.demo", "--port", str(port), "--host", host]
    if data_dir:
        argv += ["--data-dir", data_dir]
    if api_tokens_file:
        argv += ["--api-tokens-file", api_tokens_file]
    sys.stdout.flush()
    sys.stderr.flush()
    # Replace this process: the CLI stays a pure HTTP client, the daemon runs on its own.
    os.execv(sys.executable, argv)


# The decisions, approve, deny and policy commands register themselves on `app`.
from prospero.cli import decisions as _decisions  # noqa: E402, F401
from prospero.cli import tokens as _tokens  # noqa: E402, F401


def main() -> None:
    app(prog_name="prospero")


if __name__ == "__main__":
    main()
