"""`prospero automation create | list | show | enable | disable | delete | run | runs |
rotate-secret | trigger` (docs/automations.md).

Every command is one or two HTTP calls to `/api/automations`; `NAME` is an automation's name
or id. `create --webhook` and `rotate-secret` print the webhook secret once (or write it,
0600, to `--secret-file`); `trigger NAME --secret-file F [--data JSON]` is a signed sender
(`X-Prospero-Signature`, with `--timestamp` also `X-Prospero-Timestamp`), handy for testing
and scripts: it needs no API token, the signature is the credential.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.markup import escape
from rich.table import Table

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
from prospero.cli.client import Client, CliError, error_from_response, seg
from prospero.cli.output import print_data
from prospero.cli.params import PostureOpt
from prospero.types.automations import Automation, AutomationCreated, AutomationRun

automation_app = typer.Typer(
    help="Stored spawn templates fired by a cron schedule, a signed webhook or by hand.",
    no_args_is_help=True,
)
app.add_typer(automation_app, name="automation", rich_help_panel="Agents")

NameArg = Annotated[str, typer.Argument(metavar="NAME", help="The automation's name or id.")]
SecretFileOpt = Annotated[
    Path | None,
    typer.Option("--secret-file", help="Write the webhook secret here (mode 0600), not stdout."),
]


def _path(name: str, tail: str = "") -> str:
    return f"/api/automations/{seg(name)}{tail}"


def _labels(values: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key:
            raise CliError(f"--label wants KEY=VALUE, not {v!r}", exits.USAGE)
        out[key] = value
    return out


def _print_automation(a: Automation) -> None:
    con = _console()
    con.print(f"[bold]{escape(a.name)}[/bold]  {a.id}  {'enabled' if a.enabled else 'disabled'}")
    con.print(f"  workspace  {escape(a.workspace)}")
    con.print(f"  protocol   {a.spawn.drive_protocol}  posture {a.spawn.posture or 'default'}")
    con.print(f"  schedule   {escape(a.schedule or '-')}  (UTC; next {a.next_fire or '-'})")
    con.print(f"  webhook    {'yes' if a.webhook else 'no'}")
    if a.labels:
        con.print("  labels     " + escape(", ".join(f"{k}={v}" for k, v in a.labels.items())))
    con.print(f"  last fired {a.last_fired or '-'}")
    con.print("  prompt     " + escape(a.spawn.prompt))


def _secret_out(created: AutomationCreated, secret_file: Path | None) -> None:
    if created.secret is None:
        return
    if secret_file is not None:
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(created.secret + "\n")
        _console().print(f"webhook secret written to {escape(str(secret_file))} (shown only now)")
    else:
        _console().print(f"webhook secret (shown only now): {created.secret}")


@automation_app.command("create")
@handle_errors
def create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="A unique name.")],
    workspace: Annotated[str, typer.Option("--workspace", "-w", help="Workspace to spawn in.")],
    prompt: Annotated[
        str,
        typer.Option("--prompt", help="Prompt template ({{payload.x}}, {{trigger}}, {{now}}...)."),
    ],
    cron: Annotated[
        str | None, typer.Option("--cron", help='5-field cron schedule, UTC ("0 3 * * *").')
    ] = None,
    webhook: Annotated[
        bool, typer.Option("--webhook", help="Add a signed webhook trigger (prints its secret).")
    ] = False,
    protocol: Annotated[
        str, typer.Option("--protocol", help="Drive protocol: ndjson or acp.")
    ] = "ndjson",
    posture: Annotated[PostureOpt | None, typer.Option("--posture")] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", help="KEY=VALUE (repeatable).")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model for the agents.")] = None,
    budget_usd: Annotated[float | None, typer.Option("--budget-usd", min=0)] = None,
    disabled: Annotated[bool, typer.Option("--disabled", help="Create it disabled.")] = False,
    secret_file: SecretFileOpt = None,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Create an automation."""
    if protocol not in ("ndjson", "acp"):
        raise CliError(f"--protocol is ndjson or acp, not {protocol!r}", exits.USAGE)
    spawn: dict[str, Any] = {"prompt": prompt, "drive_protocol": protocol}
    for key, value in (
        ("posture", posture.value if posture else None),
        ("model", model),
        ("budget_usd", budget_usd),
    ):
        if value is not None:
            spawn[key] = value
    body = {
        "name": name,
        "workspace": workspace,
        "spawn": spawn,
        "schedule": cron,
        "webhook": webhook,
        "enabled": not disabled,
        "labels": _labels(label or []),
    }
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        raw = c.request("POST", "/api/automations", json_body=body).json()
        created = c.parse(raw, AutomationCreated, "/api/automations")
    if fmt.machine and secret_file is None:
        print_data(raw, fmt)  # the secret included: the reply is the only place it shows
        return
    _console().print(
        f"created automation {escape(created.automation.name)} ({created.automation.id})"
    )
    _secret_out(created, secret_file)


@automation_app.command("list")
@handle_errors
def list_(
    ctx: typer.Context, output: OutputOpt = None, addr: AddrOpt = None, token: TokenOpt = None
) -> None:
    """List automations with their schedules and next fires."""
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        raw, rows = c.get_both("/api/automations", list[Automation])
    if fmt.machine:
        print_data(raw, fmt)
        return
    table = Table(box=None, pad_edge=False)
    for col in ("NAME", "WORKSPACE", "ENABLED", "SCHEDULE", "NEXT FIRE", "WEBHOOK", "LAST FIRED"):
        table.add_column(col)
    for a in rows:
        table.add_row(
            escape(a.name),
            escape(a.workspace),
            "yes" if a.enabled else "no",
            escape(a.schedule or "-"),
            a.next_fire or "-",
            "yes" if a.webhook else "no",
            a.last_fired or "-",
        )
    _console().print(table)


@automation_app.command("show")
@handle_errors
def show(
    ctx: typer.Context,
    name: NameArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show one automation."""
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        raw, a = c.get_both(_path(name), Automation)
    if fmt.machine:
        print_data(raw, fmt)
    else:
        _print_automation(a)


def _post(
    ctx: typer.Context, name: str, tail: str, addr: str | None, token: str | None
) -> tuple[Client, Any]:
    c = _client(ctx, addr, token)
    with c:
        return c, c.request("POST", _path(name, tail)).json()


@automation_app.command("enable")
@handle_errors
def enable(
    ctx: typer.Context,
    name: NameArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Enable (schedule ticks missed while disabled are not fired)."""
    fmt = _fmt(ctx, output)
    c, raw = _post(ctx, name, "/enable", addr, token)
    a = c.parse(raw, Automation, "enable")
    if fmt.machine:
        print_data(raw, fmt)
        return
    _console().print(f"enabled {escape(a.name)} (next fire {a.next_fire or '-'})")


@automation_app.command("disable")
@handle_errors
def disable(
    ctx: typer.Context,
    name: NameArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Disable: nothing fires it until enabled."""
    fmt = _fmt(ctx, output)
    c, raw = _post(ctx, name, "/disable", addr, token)
    a = c.parse(raw, Automation, "disable")
    if fmt.machine:
        print_data(raw, fmt)
        return
    _console().print(f"disabled {escape(a.name)}")


@automation_app.command("delete")
@handle_errors
def delete(
    ctx: typer.Context,
    name: NameArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete an automation and its run history (its agents stay)."""
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        c.request("DELETE", _path(name))
    if fmt.machine:
        print_data({"name": name, "deleted": True}, fmt)
        return
    _console().print(f"deleted {escape(name)}")


def _print_run(run: AutomationRun) -> None:
    if run.state == "spawned":
        _console().print(f"run {run.id}: spawned agent {run.agent_id}")
    else:
        raise CliError(f"run {run.id} failed: {run.error}", exits.FAILURE)


@automation_app.command("run")
@handle_errors
def run_now(
    ctx: typer.Context,
    name: NameArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Fire now (trigger `manual`); prints the agent it spawned."""
    fmt = _fmt(ctx, output)
    c, raw = _post(ctx, name, "/run", addr, token)
    if fmt.machine:
        print_data(raw, fmt)
        return
    _print_run(c.parse(raw, AutomationRun, "run"))


@automation_app.command("runs")
@handle_errors
def runs(
    ctx: typer.Context,
    name: NameArg,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 20,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Run history, newest first, with each run's agent (or error)."""
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        raw, rows = c.get_both(_path(name, "/runs"), list[AutomationRun], {"limit": limit})
    if fmt.machine:
        print_data(raw, fmt)
        return
    table = Table(box=None, pad_edge=False)
    for col in ("RUN", "TRIGGER", "FIRED AT", "STATE", "AGENT / ERROR"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.id, r.trigger, r.fired_at, r.state, escape(r.agent_id or r.error or "-"))
    _console().print(table)


@automation_app.command("rotate-secret")
@handle_errors
def rotate_secret(
    ctx: typer.Context,
    name: NameArg,
    secret_file: SecretFileOpt = None,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """A new webhook secret (the old one stops verifying); adds a webhook if there was none.
    With -o json|yaml the reply (secret included) is printed, unless --secret-file is given."""
    fmt = _fmt(ctx, output)
    c, raw = _post(ctx, name, "/rotate-secret", addr, token)
    created = c.parse(raw, AutomationCreated, "rotate-secret")
    if fmt.machine and secret_file is None:
        print_data(raw, fmt)
        return
    _secret_out(created, secret_file)


@automation_app.command("trigger")
@handle_errors
def trigger(
    ctx: typer.Context,
    name: NameArg,
    secret_file: Annotated[
        Path, typer.Option("--secret-file", help="File holding the webhook secret.")
    ],
    data: Annotated[
        str | None, typer.Option("--data", help="JSON object sent as the payload.")
    ] = None,
    timestamp: Annotated[
        bool,
        typer.Option("--timestamp", help="Also sign the time (X-Prospero-Timestamp)."),
    ] = False,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Send a signed webhook call (what a webhook sender does)."""
    try:
        secret = secret_file.read_text().strip()
    except OSError as e:
        raise CliError(f"cannot read {secret_file}: {e.strerror}", exits.USAGE) from None
    raw = (data or "{}").encode()
    try:
        json.loads(raw)
    except ValueError as e:
        raise CliError(f"--data is not JSON: {e}", exits.USAGE) from None
    headers = {"Content-Type": "application/json"}
    msg = raw
    if timestamp:
        ts = str(int(time.time()))
        headers["X-Prospero-Timestamp"] = ts
        msg = f"{ts}.".encode() + raw
    headers["X-Prospero-Signature"] = (
        "sha256=" + hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()
    )
    fmt = _fmt(ctx, output)
    c = _client(ctx, addr, token)
    with c:
        try:
            resp = httpx.post(
                c.addr + _path(name, "/trigger"), content=raw, headers=headers, timeout=30
            )
        except httpx.TransportError:
            raise c.unreachable() from None
        if resp.status_code >= 400:
            raise error_from_response(resp)
        body = resp.json()
        if fmt.machine:
            print_data(body, fmt)
            return
        _print_run(c.parse(body, AutomationRun, "trigger"))
