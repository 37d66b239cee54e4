"""`prospero notify add | list | show | enable | disable | remove | test | log`
(docs/notifications.md).

Each command is one or two HTTP calls to `/api/notifications`; `TARGET` is a target's name or
id. URLs are a target's secret: the API only ever gives them masked, and so does this."""

from __future__ import annotations

from typing import Annotated, Any

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
from prospero.cli.client import CliError, seg
from prospero.cli.output import OutputFormat, print_data
from prospero.types.notifications import NOTIFY_EVENTS, Delivery, TargetView, TestResult

notify_app = typer.Typer(
    help="Webhook targets told when a decision is pending, a run ends, or a budget warns or "
    "stops an agent (Slack, Discord or plain JSON).",
    no_args_is_help=True,
)
app.add_typer(notify_app, name="notify", rich_help_panel="Agents")

TargetArg = Annotated[str, typer.Argument(metavar="TARGET", help="The target's name or id.")]
FORMATS = ("slack", "discord", "json")


def _path(ref: str, tail: str = "") -> str:
    return f"/api/notifications/targets/{seg(ref)}{tail}"


def _print_target(t: TargetView) -> None:
    con = _console()
    con.print(f"[bold]{escape(t.name)}[/bold]  {t.id}  {'enabled' if t.enabled else 'disabled'}")
    con.print(f"  format      {t.format}")
    con.print(f"  url         {escape(t.url)}")
    con.print(f"  events      {', '.join(t.events)}")
    con.print(f"  workspaces  {escape(', '.join(t.workspaces)) if t.workspaces else 'all'}")
    con.print(f"  created     {t.created_at}")


@notify_app.command("add")
@handle_errors
def add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="A unique name.")],
    url: Annotated[str, typer.Argument(metavar="URL", help="The webhook URL (a secret).")],
    fmt_: Annotated[str, typer.Option("--format", "-f", help="slack, discord or json.")] = "json",
    event: Annotated[
        list[str] | None,
        typer.Option(
            "--event", "-e", help=f"Only these events (repeatable): {', '.join(NOTIFY_EVENTS)}."
        ),
    ] = None,
    workspace: Annotated[
        list[str] | None,
        typer.Option("--workspace", "-w", help="Only these workspaces' agents (repeatable)."),
    ] = None,
    disabled: Annotated[bool, typer.Option("--disabled", help="Add it disabled.")] = False,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Add a webhook target."""
    if fmt_ not in FORMATS:
        raise CliError(f"--format is slack, discord or json, not {fmt_!r}", exits.USAGE)
    for e in event or []:
        if e not in NOTIFY_EVENTS:
            raise CliError(f"--event {e!r} is not one of {', '.join(NOTIFY_EVENTS)}", exits.USAGE)
    body: dict[str, Any] = {"name": name, "url": url, "format": fmt_, "enabled": not disabled}
    if event:
        body["events"] = event
    if workspace:
        body["workspaces"] = workspace
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        raw = c.request("POST", "/api/notifications/targets", json_body=body).json()
        t = c.parse(raw, TargetView, "/api/notifications/targets")
    if fmt.machine:
        print_data(raw, fmt)
        return
    _console().print(f"added notification target {escape(t.name)} ({t.id}) → {escape(t.url)}")


@notify_app.command("list")
@handle_errors
def list_(
    ctx: typer.Context, output: OutputOpt = None, addr: AddrOpt = None, token: TokenOpt = None
) -> None:
    """List targets (URLs masked)."""
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        raw, rows = c.get_both("/api/notifications/targets", list[TargetView])
    if fmt.machine:
        print_data(raw, fmt)
        return
    table = Table(box=None, pad_edge=False)
    for col in ("NAME", "FORMAT", "ENABLED", "URL", "EVENTS", "WORKSPACES"):
        table.add_column(col)
    for t in rows:
        events = "all" if len(t.events) == len(NOTIFY_EVENTS) else ", ".join(t.events)
        table.add_row(
            escape(t.name),
            t.format,
            "yes" if t.enabled else "no",
            escape(t.url),
            events,
            escape(", ".join(t.workspaces)) if t.workspaces else "all",
        )
    _console().print(table)


@notify_app.command("show")
@handle_errors
def show(
    ctx: typer.Context,
    target: TargetArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show one target."""
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        raw, t = c.get_both(_path(target), TargetView)
    if fmt.machine:
        print_data(raw, fmt)
    else:
        _print_target(t)


def _set_enabled(
    ctx: typer.Context,
    target: str,
    enabled: bool,
    output: OutputFormat | None,
    addr: str | None,
    token: str | None,
) -> None:
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        raw = c.request("PATCH", _path(target), json_body={"enabled": enabled}).json()
        t = c.parse(raw, TargetView, "patch")
    if fmt.machine:
        print_data(raw, fmt)
        return
    _console().print(f"{'enabled' if enabled else 'disabled'} {escape(t.name)}")


@notify_app.command("enable")
@handle_errors
def enable(
    ctx: typer.Context,
    target: TargetArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Enable a target."""
    _set_enabled(ctx, target, True, output, addr, token)


@notify_app.command("disable")
@handle_errors
def disable(
    ctx: typer.Context,
    target: TargetArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Disable a target: nothing is sent to it until enabled."""
    _set_enabled(ctx, target, False, output, addr, token)


@notify_app.command("remove")
@handle_errors
def remove(
    ctx: typer.Context,
    target: TargetArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Remove a target and its delivery log."""
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        c.request("DELETE", _path(target))
    if fmt.machine:
        print_data({"target": target, "removed": True}, fmt)
        return
    _console().print(f"removed {escape(target)}")


def _outcome(d: Delivery) -> str:
    if d.state == "delivered":
        return f"delivered (HTTP {d.http_status})"
    if d.state == "pending":
        return "pending"
    why = d.error or (f"HTTP {d.http_status}" if d.http_status else "failed")
    return f"failed: {why}"


@notify_app.command("test")
@handle_errors
def test(
    ctx: typer.Context,
    target: TargetArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Send a test message now (one attempt); exits non-zero when it was not delivered."""
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        raw = c.request("POST", _path(target, "/test")).json()
        result = c.parse(raw, TestResult, "test")
    if fmt.machine:
        print_data(raw, fmt)
    elif result.delivered:
        _console().print(f"test message to {escape(target)}: {_outcome(result.delivery)}")
    if not result.delivered:
        raise CliError(
            f"test message to {target} was not delivered: {_outcome(result.delivery)}",
            exits.FAILURE,
        )


@notify_app.command("log")
@handle_errors
def log(
    ctx: typer.Context,
    target: Annotated[
        str | None, typer.Argument(metavar="[TARGET]", help="Only this target's deliveries.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 20,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """The delivery log, newest first."""
    fmt = _fmt(ctx, output)
    params: dict[str, Any] = {"limit": limit}
    if target:
        params["target"] = target
    with _client(ctx, addr, token) as c:
        raw, rows = c.get_both("/api/notifications/deliveries", list[Delivery], params)
    if fmt.machine:
        print_data(raw, fmt)
        return
    table = Table(box=None, pad_edge=False)
    for col in ("TIME", "EVENT", "AGENT", "ATTEMPTS", "RESULT", "SUMMARY"):
        table.add_column(col)
    for d in rows:
        table.add_row(
            d.updated_at or d.created_at,
            d.event,
            d.agent_id or "-",
            str(d.attempts),
            escape(_outcome(d)),
            escape(d.summary),
        )
    _console().print(table)
