"""Reading the fleet: `ls` (agents with headers, tokens, cost, age, turns; filters; --watch),
`get agents|workspaces|decisions [NAME...]`, `describe agent|workspace|decision NAME`,
`status` and `usage`. Replies are read into the DTOs of `prospero.types`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import typer

from prospero.cli import exits, render
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
from prospero.cli.client import Client, CliError, ServerError, fleet_events, seg
from prospero.cli.output import OutputFormat, print_data, print_item
from prospero.cli.params import WorkspaceFilterOpt
from prospero.types.api import UsageReport, WorkspaceSummary
from prospero.types.decisions import Decision, WorkspacePolicy
from prospero.types.model import Agent, AgentStatus, FleetSnapshot
from prospero.types.summary import AgentTotals, DashboardSummary

PANEL = "Fleet"

StatusFilterOpt = Annotated[
    list[AgentStatus] | None,
    typer.Option("--status", help="Only agents in this status (repeatable)."),
]
WatchOpt = Annotated[
    bool, typer.Option("--watch", "-w", help="Keep watching: print agents as they change.")
]
WatchTimeoutOpt = Annotated[
    float | None,
    typer.Option("--timeout", min=0, help="With --watch: stop after this many seconds."),
]
WatchCountOpt = Annotated[
    int | None,
    typer.Option("--count", min=1, help="With --watch: stop after this many changes."),
]

# What changes a listed agent's row (the fleet stream is asked for these only).
ROW_KINDS = frozenset(
    {
        "agent_spawned",
        "agent_discovered",
        "status_changed",
        "turn_finished",
        "agent_finished",
        "agent_gone",
    }
)


# ---------------------------------------------------------------------- reading


def read_totals(c: Client) -> DashboardSummary:
    """Per-agent totals; none from a prosperod without the summary (older)."""
    try:
        return c.get_model("/api/dashboard/summary", DashboardSummary)
    except ServerError as e:
        if e.status == 404:
            return DashboardSummary()
        raise


@dataclass
class Fleet:
    """`GET /api/fleet` as it came (`raw`, printed by -o json|yaml) and as the DTO, both
    filtered alike."""

    raw: dict[str, Any]
    snapshot: FleetSnapshot

    @property
    def agents(self) -> list[Agent]:
        return [a for w in self.snapshot.workspaces for a in w.agents]


def read_fleet(
    c: Client, workspace: str | None = None, statuses: list[AgentStatus] | None = None
) -> Fleet:
    raw, snap = c.get_both("/api/fleet", FleetSnapshot)
    if workspace is not None:
        if workspace not in {w.name for w in snap.workspaces}:
            raise CliError(f"workspace '{workspace}' not found", exits.NOT_FOUND)
        snap.workspaces = [w for w in snap.workspaces if w.name == workspace]
        raw["workspaces"] = [w for w in raw["workspaces"] if w.get("name") == workspace]
    if statuses:
        wanted = {s.value for s in statuses}
        for w in snap.workspaces:
            w.agents = [a for a in w.agents if a.status.value in wanted]
        for rw in raw["workspaces"]:
            rw["agents"] = [a for a in rw.get("agents") or [] if a.get("status") in wanted]
    return Fleet(raw, snap)


# ---------------------------------------------------------------------- ls


@app.command("ls", rich_help_panel=PANEL)
@handle_errors
def ls(
    ctx: typer.Context,
    workspace: WorkspaceFilterOpt = None,
    status: StatusFilterOpt = None,
    watch: WatchOpt = False,
    watch_timeout: WatchTimeoutOpt = None,
    count: WatchCountOpt = None,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """List the agents: id, workspace, status, age, turns, tokens, cost, label (-o wide: more).
    -o json|yaml prints the fleet snapshot (`GET /api/fleet`), filtered."""
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        summary = read_totals(c)
        fleet = read_fleet(c, workspace, status)
        if fmt.machine:
            (print_item if watch else print_data)(fleet.raw, fmt)
        else:
            render.render_agents(_console(), fleet.agents, summary.agents, fmt is OutputFormat.wide)
        if watch:
            _watch(c, summary.last_ordinal, fleet, summary.agents, workspace, status, fmt,
                   watch_timeout, count)  # fmt: skip


def _row(a: Agent, t: AgentTotals | None, wide: bool) -> tuple[str, ...]:
    """What a watcher compares (the age column moves by itself)."""
    cells = render.agent_cells(a, t, wide)
    return tuple(c if isinstance(c, str) else c.text for i, c in enumerate(cells) if i != 3)


def _watch(
    c: Client,
    last: int,
    fleet: Fleet,
    totals: dict[str, AgentTotals],
    workspace: str | None,
    statuses: list[AgentStatus] | None,
    fmt: OutputFormat,
    timeout: float | None,
    count: int | None,
) -> None:
    """kubectl's --watch: after the listing, one line per agent each time its row changes."""
    deadline = time.monotonic() + timeout if timeout is not None else None
    wide = fmt is OutputFormat.wide
    con = _console()
    shown = {a.id: (a, _row(a, totals.get(a.id), wide)) for a in fleet.agents}
    header = render.agent_header(wide)
    widths = render.widths_of(
        header, [render.agent_cells(a, totals.get(a.id), wide) for a in fleet.agents]
    )
    changes = 0
    if not fmt.machine:
        con.print("— watching the fleet (Ctrl-C to stop) —", style="dim")
    for ev in fleet_events(c, last, ROW_KINDS):
        if deadline is not None and time.monotonic() >= deadline:
            return
        if ev is None:
            continue
        summary = read_totals(c)
        now = {a.id: a for a in read_fleet(c, workspace, statuses).agents}
        changed: list[tuple[Agent, AgentTotals | None, bool]] = []
        for agent_id, a in now.items():
            row = _row(a, summary.agents.get(agent_id), wide)
            if shown.get(agent_id, (None, None))[1] != row:
                shown[agent_id] = (a, row)
                changed.append((a, summary.agents.get(agent_id), False))
        for agent_id in [i for i in shown if i not in now]:
            a, _ = shown.pop(agent_id)
            changed.append((a, summary.agents.get(agent_id), True))
        for a, t, gone in changed:
            if fmt.machine:
                print_item({"gone": True, **a.model_dump(mode="json")} if gone else a, fmt)
            else:
                cells = render.agent_cells(a, t, wide)
                if gone:
                    cells[2] = render.Cell("gone", "bright_black")
                # as wide as the listing's columns, wider when a value needs it
                widths = [
                    max(w, x)
                    for w, x in zip(widths, render.widths_of(header, [cells]), strict=True)
                ]
                con.print(render.row_text(cells, widths))
            changes += 1
            if count is not None and changes >= count:
                return


# ---------------------------------------------------------------------- get / describe


class Resource(StrEnum):
    agents = "agents"
    workspaces = "workspaces"
    decisions = "decisions"


ALIASES = {
    "agent": Resource.agents,
    "agents": Resource.agents,
    "ag": Resource.agents,
    "workspace": Resource.workspaces,
    "workspaces": Resource.workspaces,
    "ws": Resource.workspaces,
    "decision": Resource.decisions,
    "decisions": Resource.decisions,
    "dec": Resource.decisions,
}


def _resource(value: str) -> Resource:
    found = ALIASES.get(value.lower())
    if found is None:
        raise typer.BadParameter(
            f"{value!r}: expected agents, workspaces or decisions", param_hint="RESOURCE"
        )
    return found


def _complete_resource(incomplete: str) -> list[str]:
    return [r.value for r in Resource if r.value.startswith(incomplete)]


ResourceArg = Annotated[
    str,
    typer.Argument(
        metavar="RESOURCE",
        help="agents (agent, ag), workspaces (workspace, ws) or decisions (decision, dec).",
        autocompletion=_complete_resource,
    ),
]


def get_agent(c: Client, given: str) -> tuple[Any, Agent]:
    """An agent by a unique prefix of its id: its JSON as it came, and the DTO."""
    full = c.resolve_agent(given)
    try:
        return c.get_both(f"/api/agents/{seg(full)}", Agent)
    except ServerError as e:
        if e.status != 404:
            raise
        raise CliError(
            f"agent {full} is not listed any more (removed); its history: prospero logs {full}",
            exits.NOT_FOUND,
        ) from None


def get_workspaces(c: Client, names: list[str] | None) -> tuple[list[Any], list[WorkspaceSummary]]:
    """The workspaces (only `names`, in that order, when given): JSON as it came, DTOs."""
    raw, rows = c.get_both("/api/workspaces", list[WorkspaceSummary])
    if not names:
        return raw, rows
    index = {w.name: i for i, w in enumerate(rows)}
    for n in names:
        if n not in index:
            raise CliError(f"workspace '{n}' not found", exits.NOT_FOUND)
    return [raw[index[n]] for n in names], [rows[index[n]] for n in names]


def one_or_all(items: list[Any], names: list[str] | None) -> Any:
    """-o json|yaml of `get`: the object for one name, else the list."""
    return items[0] if names and len(names) == 1 else items


@app.command("get", rich_help_panel=PANEL)
@handle_errors
def get(
    ctx: typer.Context,
    resource: ResourceArg,
    names: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[NAME]...", help="Ids (or unique prefixes) or names.", show_default=False
        ),
    ] = None,
    workspace: WorkspaceFilterOpt = None,
    status: StatusFilterOpt = None,
    state: Annotated[
        str, typer.Option("--state", help="decisions: pending, decided, expired, cancelled, all.")
    ] = "pending",
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """List agents, workspaces or decisions as a table (-o wide: more columns); with
    names, only those (-o json|yaml: one object for one name, else a list)."""
    kind = _resource(resource)
    fmt = _fmt(ctx, output)
    wide = fmt is OutputFormat.wide
    con = _console()
    with _client(ctx, addr, token) as c:
        if kind is Resource.agents:
            if names:
                found = [get_agent(c, n) for n in names]
                raw: list[Any] = [r for r, _ in found]
                agents = [a for _, a in found]
            else:
                fleet = read_fleet(c, workspace, status)
                raw = [a for w in fleet.raw["workspaces"] for a in w.get("agents") or []]
                agents = fleet.agents
            if fmt.machine:
                print_data(one_or_all(raw, names), fmt)
            else:
                render.render_agents(con, agents, read_totals(c).agents, wide)
        elif kind is Resource.workspaces:
            raw, rows = get_workspaces(c, names)
            if fmt.machine:
                print_data(one_or_all(raw, names), fmt)
            else:
                render.render_workspaces(con, rows, wide)
        else:
            if names:
                got = [c.get_both(f"/api/decisions/{seg(n)}", Decision) for n in names]
                raw, decisions = [r for r, _ in got], [d for _, d in got]
            else:
                params = {"state": state, "workspace": workspace}
                raw, decisions = c.get_both("/api/decisions", list[Decision], params)
            if fmt.machine:
                print_data(one_or_all(raw, names), fmt)
            else:
                render.render_decisions(con, decisions, "listed" if names else state)


@app.command("describe", rich_help_panel=PANEL)
@handle_errors
def describe(
    ctx: typer.Context,
    resource: ResourceArg,
    name: Annotated[str, typer.Argument(metavar="NAME", help="Id (or unique prefix) or name.")],
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Everything about one agent (its totals, pending decisions), workspace (config,
    policy, agents) or decision. -o json|yaml: those as one object."""
    kind = _resource(resource)
    fmt = _fmt(ctx, output)
    con = _console()
    with _client(ctx, addr, token) as c:
        if kind is Resource.agents:
            _, agent = get_agent(c, name)
            totals = read_totals(c).agents.get(agent.id)
            decisions = c.get_model(
                "/api/decisions", list[Decision], {"state": "all", "agent": agent.id}
            )
            if fmt.machine:
                print_data({"agent": agent, "totals": totals, "decisions": decisions}, fmt)
            else:
                render.describe_agent(con, agent, totals, decisions)
        elif kind is Resource.workspaces:
            ws = get_workspaces(c, [name])[1][0]
            policy = c.get_model(f"/api/workspaces/{seg(name)}/policy", WorkspacePolicy)
            agents = read_fleet(c, name).agents
            if fmt.machine:
                print_data({"workspace": ws, "policy": policy, "agents": agents}, fmt)
            else:
                render.describe_workspace(con, ws, policy, agents)
        else:
            decision = c.get_model(f"/api/decisions/{seg(name)}", Decision)
            if fmt.machine:
                print_data(decision, fmt)
            else:
                render.render_decisions(con, [decision], decision.state)


# ---------------------------------------------------------------------- status / usage


@app.command("status", rich_help_panel=PANEL)
@handle_errors
def status(
    ctx: typer.Context, output: OutputOpt = None, addr: AddrOpt = None, token: TokenOpt = None
) -> None:
    """Is the daemon up? Then its workspaces and agents."""
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        if not c.healthz():
            if fmt.machine:
                print_data({"daemon": "unreachable", "addr": c.addr}, fmt)
            else:
                _console().print(f"daemon: [red]unreachable[/red] ({c.addr})")
            raise c.unreachable()
        summary = read_totals(c)
        fleet = read_fleet(c)
        rows = get_workspaces(c, None)[1]
    if fmt.machine:
        print_data({"daemon": "up", "addr": c.addr, "fleet": fleet.raw}, fmt)
        return
    con = _console()
    con.print(f"daemon: [green]up[/green] ({c.addr})  host: {fleet.snapshot.host}")
    con.print()
    render.render_workspaces(con, rows, fmt is OutputFormat.wide)
    con.print()
    render.render_agents(con, fleet.agents, summary.agents, fmt is OutputFormat.wide)


@app.command("usage", rich_help_panel=PANEL)
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
    params = {"days": days, "since": since, "until": until}
    with _client(ctx, addr, token) as c:
        data = c.get_json("/api/usage", params=params)
        report = c.parse(data, UsageReport, "/api/usage")
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data(data, fmt)
        return
    render.render_usage(_console(), report)
