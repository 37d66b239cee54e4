"""`prospero workspace add | list | config | rm`.

Under `--fleet-backend k8s` a workspace is a Workspace CR: `add NAME --file FILE` and
`config NAME --file FILE` send a JSON config (sources, providers, default_provider, env,
isolation); prosperod answers 202 with the CR's phase (the operator reconciles it), which is
printed, and `list` shows each CR's phase.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from pydantic import ValidationError
from rich.markup import escape

from prospero.cli import render
from prospero.cli.app import (
    AddrOpt,
    OutputOpt,
    TokenOpt,
    _client,
    _console,
    _err_console,
    _fmt,
    app,
    handle_errors,
)
from prospero.cli.client import Client, CliError, seg
from prospero.cli.output import OutputFormat, print_data
from prospero.cli.params import (
    PostureOpt,
    WorkspaceArg,
    abs_path,
    deprecated,
    parse_timeout,
    renamed,
)
from prospero.types.api import WorkspaceSummary
from prospero.types.k8s import WorkspaceAccepted
from prospero.types.model import Unreachable

workspace_app = typer.Typer(
    help="Register and configure workspaces (a root holding one or more git checkouts).",
    no_args_is_help=True,
)
app.add_typer(workspace_app, name="workspace", rich_help_panel="Workspaces")


@workspace_app.command("add")
@handle_errors
def workspace_add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="Workspace name.")],
    root: Annotated[
        str | None,
        typer.Argument(
            metavar="[ROOT]",
            help="Root directory (a git checkout or a folder of them); none under k8s.",
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            help="JSON file with the workspace config (k8s: sources, providers, ...).",
        ),
    ] = None,
    old_config_file: Annotated[Path | None, deprecated("--config", "--file")] = None,
    caliband_addr: Annotated[
        str | None,
        typer.Option(
            "--caliband-addr",
            metavar="HOST:PORT",
            help="This workspace's own networked caliband (default: prosperod's "
            "--caliband-addr, else the root's caliband over its Unix socket).",
            rich_help_panel="Networked caliband",
        ),
    ] = None,
    ca_file: Annotated[
        str | None,
        typer.Option(
            "--ca-file",
            help="PEM CA that caliband's certificate is verified with (enables TLS; a path on "
            "prosperod's host).",
            rich_help_panel="Networked caliband",
        ),
    ] = None,
    token_file: Annotated[
        str | None,
        typer.Option(
            "--token-file",
            help="File holding caliband's bearer token (needs --ca-file; a path on prosperod's "
            "host: the token stays in it, never stored nor shown).",
            rich_help_panel="Networked caliband",
        ),
    ] = None,
    server_name: Annotated[
        str | None,
        typer.Option(
            "--server-name",
            help="TLS server name of caliband (default: caliband).",
            rich_help_panel="Networked caliband",
        ),
    ] = None,
    caliband_source: Annotated[
        str | None,
        typer.Option(
            "--caliband-source",
            metavar="SOURCE",
            help="The caliban source (a directory of caliband's root) this workspace's root "
            "is: its spawns run there.",
            rich_help_panel="Networked caliband",
        ),
    ] = None,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Register a workspace with prosperod (k8s: apply its Workspace CR)."""
    config_file = renamed(config_file, old_config_file, "--file", "--config")
    root_abs = abs_path(root) if root else ""
    body: dict[str, Any] = {"name": name}
    if root_abs:
        body["root"] = root_abs
    if config_file is not None:
        body["config"] = _read_config(config_file, "--file")
    endpoint = _caliband_endpoint(caliband_addr, ca_file, token_file, server_name, caliband_source)
    if endpoint is not None:
        body.setdefault("config", {})["caliband"] = endpoint
    fmt = _fmt(ctx, output)
    # prosperod answers once it has reached the workspace's caliband (autostart waits for the
    # new caliband to listen, up to its startup timeout): a spinner says so meanwhile.
    waiting = (
        f"registering workspace '{escape(name)}': checking its root and reaching its caliband…"
    )
    with _client(ctx, addr, token) as c, _progress(waiting if root_abs else ""):
        resp = c.request("POST", "/api/workspaces", json_body=body)
    accepted = _accepted(resp)
    added = _added(c, resp) if accepted is None else None
    if fmt.machine:
        out: dict[str, Any] = {"name": name, "root": root_abs, "status": resp.status_code}
        if accepted is not None:
            out["reconcile"] = accepted.status.model_dump(mode="json")
        if added is not None:
            out["workspace"] = added.model_dump(mode="json", exclude_none=True)
        print_data(out, fmt)
        return
    if accepted is not None:
        _print_accepted(name, accepted, "applied")
        return
    _console().print(f"registered workspace '{escape(name)}' at {escape(root_abs)}")
    if added is not None:
        _print_health(added)


def _progress(text: str) -> contextlib.AbstractContextManager[Any]:
    """A transient spinner on stderr while a slow request runs, on an interactive terminal
    only: a script's stderr keeps one line per failure and nothing else."""
    err = _err_console()
    if not text or not err.is_interactive:
        return contextlib.nullcontext()
    return err.status(text, spinner="dots")


def _added(c: Client, resp: httpx.Response) -> WorkspaceSummary | None:
    """The 201 body of a local `add` (the workspace as listed after it), or None from a
    prosperod that answers with an empty body."""
    if not resp.content:
        return None
    try:
        data = resp.json()
    except ValueError:
        raise CliError(
            f"prosperod answered {resp.status_code} with an unexpected body: {resp.text[:200]}"
        ) from None
    return c.parse(data, WorkspaceSummary, "the workspace added")


def _print_health(ws: WorkspaceSummary) -> None:
    """On stderr, what stops the workspace's agents from running: its caliband unreachable,
    a provider key missing from prosperod's environment (the API's `warnings`)."""
    err = _err_console()
    for warning in ws.warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    if isinstance(ws.health, Unreachable):
        err.print(
            f"[yellow]warning:[/yellow] the caliband of workspace '{escape(ws.name)}' is "
            f"unreachable: {escape(ws.health.reason or 'no reason given')}"
        )
        err.print(
            "  (it stays registered and is tried again at each poll: `prospero workspace list` "
            "shows its health)",
            style="dim",
        )


def _caliband_endpoint(
    caliband_addr: str | None,
    ca_file: str | None,
    token_file: str | None,
    server_name: str | None,
    source: str | None,
) -> dict[str, Any] | None:
    """`config.caliband` from the options (files made absolute here: prosperod checks that
    they are readable on its host), or None when none is given."""
    if caliband_addr is None:
        given = [
            o
            for o, v in (
                ("--ca-file", ca_file),
                ("--token-file", token_file),
                ("--server-name", server_name),
                ("--caliband-source", source),
            )
            if v is not None
        ]
        if given:
            raise typer.BadParameter(
                f"{', '.join(given)} describe a networked caliband: give its --caliband-addr",
                param_hint="--caliband-addr",
            )
        return None
    out: dict[str, Any] = {"addr": caliband_addr}
    if ca_file:
        out["ca_file"] = abs_path(ca_file)
    if token_file:
        out["token_file"] = abs_path(token_file)
    if server_name:
        out["server_name"] = server_name
    if source:
        out["source"] = source
    return out


def _read_config(path: Path, option: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise typer.BadParameter(
            f"cannot read {path}: {e.strerror or e}", param_hint=option
        ) from None
    except ValueError as e:
        raise typer.BadParameter(f"{path} is not JSON: {e}", param_hint=option) from None
    if not isinstance(data, dict):
        raise typer.BadParameter(f"{path} must hold a JSON object", param_hint=option)
    return data


def _accepted(resp: httpx.Response) -> WorkspaceAccepted | None:
    """The 202 body of a k8s workspace write (the Workspace CR's phase), else None."""
    if resp.status_code != 202:
        return None
    try:
        return WorkspaceAccepted.model_validate(resp.json())
    except (ValueError, ValidationError):
        raise CliError(
            f"prosperod answered 202 with an unexpected body: {resp.text[:200]}"
        ) from None


def _print_accepted(name: str, accepted: WorkspaceAccepted, verb: str) -> None:
    status = accepted.status
    phase = escape(status.phase)
    gen, seen = status.generation, status.observed_generation
    if gen is not None and not status.current:
        state = f"generation {gen}, not reconciled yet: phase {phase}"
        if seen is not None:
            state += f" is of generation {seen}"
    else:
        state = f"phase {phase}"
    _console().print(
        f"{verb} Workspace CR '{escape(name)}' ({state}); the operator reconciles it "
        "asynchronously: `prospero workspace list` shows its phase"
    )


@workspace_app.command("list")
@handle_errors
def workspace_list(
    ctx: typer.Context, output: OutputOpt = None, addr: AddrOpt = None, token: TokenOpt = None
) -> None:
    """List registered workspaces with health and agent counts (-o wide: phase, sources)."""
    with _client(ctx, addr, token) as c:
        raw, rows = c.get_both("/api/workspaces", list[WorkspaceSummary])
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data(raw, fmt)
        return
    render.render_workspaces(_console(), rows, fmt is OutputFormat.wide)


def _summary(c: Client, name: str) -> Any:
    """The workspace as `GET /api/workspaces` lists it (JSON), after a change."""
    for row in c.get_json("/api/workspaces"):
        if isinstance(row, dict) and row.get("name") == name:
            return row
    return {"name": name}


def _parse_env(values: list[str] | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--env")
        env[key.strip()] = value
    return env


CLEAR = "Unset a field"


def _check_config_options(**given: tuple[str | None, bool]) -> None:
    """A field is set or cleared, not both; an empty value is not a way to clear it."""
    for option, (value, clear) in given.items():
        flag = "--" + option.replace("_", "-")
        if value is not None and clear:
            raise typer.BadParameter(f"{flag} and --clear-{flag[2:]} contradict", param_hint=flag)
        if value is not None and not value.strip():
            raise typer.BadParameter(
                f"{flag} needs a value (to unset it: --clear-{flag[2:]})", param_hint=flag
            )


@workspace_app.command("config")
@handle_errors
def workspace_config(
    ctx: typer.Context,
    name: WorkspaceArg,
    provider: Annotated[str | None, typer.Option("--provider", help="Provider id.")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", help="Provider base URL.")] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option("--api-key-env", help="Name of a variable in prosperod's environment."),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            "--env", help="KEY=VALUE for the workspace's caliband (repeatable; others are kept)."
        ),
    ] = None,
    unset_env: Annotated[
        list[str] | None,
        typer.Option("--unset-env", metavar="KEY", help="Remove this variable (repeatable)."),
    ] = None,
    clear_provider: Annotated[
        bool, typer.Option("--clear-provider", help="Unset the provider.", rich_help_panel=CLEAR)
    ] = False,
    clear_base_url: Annotated[
        bool, typer.Option("--clear-base-url", help="Unset the base URL.", rich_help_panel=CLEAR)
    ] = False,
    clear_api_key_env: Annotated[
        bool,
        typer.Option(
            "--clear-api-key-env", help="Unset the API key variable.", rich_help_panel=CLEAR
        ),
    ] = False,
    clear_env: Annotated[
        bool,
        typer.Option(
            "--clear-env",
            help="Remove every variable (with --env: every one but those given).",
            rich_help_panel=CLEAR,
        ),
    ] = False,
    clear_caliband: Annotated[
        bool,
        typer.Option(
            "--clear-caliband",
            help="Drop the workspace's own networked caliband (back to prosperod's default).",
            rich_help_panel=CLEAR,
        ),
    ] = False,
    daily_budget_usd: Annotated[
        float | None,
        typer.Option(
            "--daily-budget-usd",
            min=0.000001,
            help="Cap on what the workspace's agents spend per UTC day, in dollars.",
        ),
    ] = None,
    daily_budget_tokens: Annotated[
        int | None,
        typer.Option(
            "--daily-budget-tokens",
            min=1,
            help="Cap on the tokens (input + output) its agents use per UTC day.",
        ),
    ] = None,
    clear_daily_budget: Annotated[
        bool,
        typer.Option(
            "--clear-daily-budget",
            help="Remove both daily caps (with one of --daily-budget-*: the other one).",
            rich_help_panel=CLEAR,
        ),
    ] = False,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            help="JSON file with the whole config to set, replacing it (k8s: sources, "
            "providers, ...); not with the provider options.",
        ),
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
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Change a workspace's provider config: only the fields given change (--clear-… unsets
    one; --file replaces the whole config), and/or its permission defaults (--posture,
    --decision-timeout)."""
    parsed = _parse_env(env)
    unset = [k.strip() for k in unset_env or []]
    _check_config_options(
        provider=(provider, clear_provider),
        base_url=(base_url, clear_base_url),
        api_key_env=(api_key_env, clear_api_key_env),
    )
    both = sorted(set(parsed) & set(unset))
    if both:
        raise typer.BadParameter(
            f"{', '.join(both)}: given to both --env and --unset-env", param_hint="--unset-env"
        )
    if any(not k for k in unset):
        raise typer.BadParameter("expected a variable name", param_hint="--unset-env")
    patch: dict[str, Any] = {}
    for key, value, clear in (
        ("provider", provider, clear_provider),
        ("base_url", base_url, clear_base_url),
        ("api_key_from_env", api_key_env, clear_api_key_env),
    ):
        if value is not None or clear:
            patch[key] = value
    if clear_caliband:
        patch["caliband"] = None
    if clear_daily_budget:
        patch["daily_budget_usd"] = patch["daily_budget_tokens"] = None
    if daily_budget_usd is not None:
        patch["daily_budget_usd"] = daily_budget_usd
    if daily_budget_tokens is not None:
        patch["daily_budget_tokens"] = daily_budget_tokens
    if clear_env and not parsed:
        patch["env"] = None
    elif parsed or unset or clear_env:
        patch["env"] = {**dict.fromkeys(unset), **parsed}
    if config_file is not None and patch:
        raise typer.BadParameter(
            "--file replaces the whole config: give the provider options in the file",
            param_hint="--file",
        )
    fmt = _fmt(ctx, output)
    out: dict[str, Any] = {"name": name}
    with _client(ctx, addr, token) as c:
        if posture is not None or decision_timeout is not None:
            policy: dict[str, Any] = {}
            if posture is not None:
                policy["posture"] = posture.value
            if decision_timeout is not None:
                policy["timeout_s"] = parse_timeout(decision_timeout, "--decision-timeout")
            path = f"/api/workspaces/{seg(name)}/policy"
            out["policy"] = c.request("PATCH", path, json_body=policy).json()
            if not fmt.machine:
                _console().print(f"updated permission defaults of workspace '{escape(name)}'")
            if not patch and config_file is None:
                if fmt.machine:
                    print_data(out, fmt)
                return
        accepted: WorkspaceAccepted | None = None
        if config_file is not None:
            body = _read_config(config_file, "--file")
            resp = c.request(
                "PUT", f"/api/workspaces/{seg(name)}/config", json_body=body, send_body=True
            )
            accepted = _accepted(resp)
            workspace = None if accepted is not None else _summary(c, name)
        else:
            if clear_env and parsed:  # every variable but those given: null the others
                current = _summary(c, name).get("config")
                have = current.get("env") if isinstance(current, dict) else None
                if isinstance(have, dict):
                    patch["env"] = {**dict.fromkeys(have), **patch["env"]}
            workspace = c.request(
                "PATCH", f"/api/workspaces/{seg(name)}/config", json_body=patch
            ).json()
    if fmt.machine:
        if workspace is not None:
            out["workspace"] = workspace
        if accepted is not None:
            out["reconcile"] = accepted.status.model_dump(mode="json")
        print_data(out, fmt)
        return
    if accepted is not None:
        _print_accepted(name, accepted, "re-applied")
        return
    _console().print(f"updated provider config for workspace '{escape(name)}'")
    if isinstance(workspace, dict) and "health" in workspace:
        _print_health(c.parse(workspace, WorkspaceSummary, "the workspace configured"))


@workspace_app.command("rm")
@handle_errors
def workspace_rm(
    ctx: typer.Context,
    name: WorkspaceArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Unregister a workspace (its agents and caliband keep running; k8s: deletes its
    Workspace CR)."""
    with _client(ctx, addr, token) as c:
        c.request("DELETE", f"/api/workspaces/{seg(name)}")
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data({"name": name, "removed": True}, fmt)
        return
    _console().print(f"unregistered workspace '{escape(name)}'")
