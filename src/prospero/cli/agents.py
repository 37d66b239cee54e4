"""The agent operations: spawn (optionally following it), kill, adopt, respawn, rm, send,
end-input, cancel. Every ID may be a unique prefix (resolved by the API first).

An operation the API answers with an empty 202/204 prints, with `-o json|yaml`, what was done:
`{"agent_id": <the whole id>, "action": "kill", "accepted": true}`.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.markup import escape

from prospero.cli import exits
from prospero.cli.app import (
    AddrOpt,
    OutputOpt,
    TokenOpt,
    _client,
    _console,
    _fmt,
    app,
    handle_errors,
)
from prospero.cli.client import CliError, seg
from prospero.cli.output import OutputFormat, print_data, print_item
from prospero.cli.params import (
    AgentIdArg,
    DriveProtocolOpt,
    PostureOpt,
    WorkspaceArg,
    abs_path,
)
from prospero.cli.watching import ExitStatusOpt, exit_for, watch_agent
from prospero.types.api import RespawnedResponse, SpawnedResponse
from prospero.types.model import Agent

PANEL = "Agents"


def action_result(agent_id: str, action: str, **more: Any) -> dict[str, Any]:
    return {"agent_id": agent_id, "action": action, "accepted": True, **more}


@app.command("spawn", rich_help_panel=PANEL)
@handle_errors
def spawn(
    ctx: typer.Context,
    workspace: WorkspaceArg,
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
    budget_usd: Annotated[
        float | None,
        typer.Option(
            "--budget-usd", min=0.000001, help="Stop the agent once its turns cost more ($)."
        ),
    ] = None,
    budget_tokens: Annotated[
        int | None,
        typer.Option(
            "--budget-tokens", min=1, help="Stop the agent once its turns used more tokens."
        ),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Then follow its events until it finishes."),
    ] = False,
    exit_status: ExitStatusOpt = False,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Spawn an agent in a workspace (--follow: then follow it, as `follow` does)."""
    if exit_status and not follow:
        raise typer.BadParameter("needs --follow", param_hint="--exit-status")
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise CliError("the prompt is empty", code=exits.USAGE)
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
        body["frontmatter_path"] = abs_path(frontmatter)
    if drive_protocol is not None:
        body["drive_protocol"] = drive_protocol.value
    if posture is not None:
        body["posture"] = posture.value
    if budget_usd is not None:
        body["budget_usd"] = budget_usd
    if budget_tokens is not None:
        body["budget_tokens"] = budget_tokens
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        resp = c.request("POST", f"/api/workspaces/{seg(workspace)}/agents", json_body=body)
        data = c.parse(resp.json(), SpawnedResponse, "a spawn")
        if fmt.machine:
            (print_item if follow else print_data)(resp.json(), fmt)
        else:
            tree = "worktree" if data.isolated else "shared tree"
            _console().print(
                f"spawned agent {data.agent_id} in workspace '{escape(data.workspace)}' ({tree})"
            )
        if follow:
            watch = watch_agent(c, data.agent_id, 0, fmt)
            if exit_status:
                exit_for(watch, c, data.agent_id)


def _agent_action(
    ctx: typer.Context,
    addr: str | None,
    token: str | None,
    agent_id: str,
    action: str,
    done: str,
    output: OutputFormat | None,
) -> None:
    """POST a body-less agent operation (kill, end-input, cancel) and say it was sent."""
    with _client(ctx, addr, token) as c:
        full = c.resolve_agent(agent_id)
        c.request("POST", f"/api/agents/{seg(full)}/{action}", send_body=True)
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data(action_result(full, action), fmt)
    else:
        _console().print(done.format(id=full))


@app.command("kill", rich_help_panel=PANEL)
@handle_errors
def kill(
    ctx: typer.Context,
    agent_id: AgentIdArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Kill an agent (caliband stops it)."""
    _agent_action(ctx, addr, token, agent_id, "kill", "kill requested for {id}", output)


@app.command("adopt", rich_help_panel=PANEL)
@handle_errors
def adopt(
    ctx: typer.Context,
    agent_id: AgentIdArg,
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
        full = c.resolve_agent(agent_id)
        resp = c.request("POST", f"/api/agents/{seg(full)}/adopt", json_body=body, send_body=True)
        agent = c.parse(resp.json(), Agent, "an adopted agent")
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data(resp.json(), fmt)
        return
    _console().print(f"adopted {full} ({agent.drive_protocol}, {agent.status.value})")


@app.command("respawn", rich_help_panel=PANEL)
@handle_errors
def respawn(
    ctx: typer.Context,
    agent_id: AgentIdArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Start a finished agent again with the same spec (gets a new id)."""
    with _client(ctx, addr, token) as c:
        full = c.resolve_agent(agent_id)
        resp = c.request("POST", f"/api/agents/{seg(full)}/respawn", send_body=True)
        new = c.parse(resp.json(), RespawnedResponse, "a respawn")
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data(resp.json(), fmt)
        return
    _console().print(f"respawned {full} as {new.agent_id}")


@app.command("rm", rich_help_panel=PANEL)
@handle_errors
def rm(
    ctx: typer.Context,
    agent_id: AgentIdArg,
    force: Annotated[
        bool, typer.Option("--force", "-f", help="Remove even if still running.")
    ] = False,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Remove an agent from caliband's registry (history stays queryable)."""
    with _client(ctx, addr, token) as c:
        full = c.resolve_agent(agent_id)
        c.request("DELETE", f"/api/agents/{seg(full)}", params={"force": "true"} if force else None)
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data(action_result(full, "rm", force=force), fmt)
        return
    _console().print(f"removed {full}")


@app.command("send", rich_help_panel=PANEL)
@handle_errors
def send(
    ctx: typer.Context,
    agent_id: AgentIdArg,
    text: Annotated[
        str, typer.Argument(metavar="TEXT", help="Message for the agent ('-' reads stdin).")
    ],
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Send a message to an interactive agent."""
    if text == "-":
        text = sys.stdin.read()
    if not text:
        raise CliError("the message is empty", code=exits.USAGE)
    with _client(ctx, addr, token) as c:
        full = c.resolve_agent(agent_id)
        c.request("POST", f"/api/agents/{seg(full)}/input", json_body={"text": text})
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data(action_result(full, "send", chars=len(text)), fmt)
        return
    _console().print(f"sent message to {full}")


@app.command("end-input", rich_help_panel=PANEL)
@handle_errors
def end_input(
    ctx: typer.Context,
    agent_id: AgentIdArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Tell an interactive agent there is no more input (it finishes its run)."""
    _agent_action(ctx, addr, token, agent_id, "end-input", "end-input sent to {id}", output)


@app.command("cancel", rich_help_panel=PANEL)
@handle_errors
def cancel(
    ctx: typer.Context,
    agent_id: AgentIdArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Cancel the agent's current turn (drivers that support it)."""
    _agent_action(ctx, addr, token, agent_id, "cancel", "cancel requested for {id}", output)
