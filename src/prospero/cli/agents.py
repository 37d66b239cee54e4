"""The agent commands: spawn, ls, status, follow, kill, adopt, respawn, rm, send, end-input,
cancel, usage."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.markup import escape

from prospero.cli import render
from prospero.cli.app import (
    AddrOpt,
    DriveProtocolOpt,
    OutputFormat,
    OutputOpt,
    PostureOpt,
    TokenOpt,
    _abs_path,
    _client,
    _console,
    _fmt,
    _print_json,
    app,
    handle_errors,
)
from prospero.cli.client import CliError, follow_events, seg


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
