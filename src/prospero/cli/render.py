"""Human output of the CLI's listings: tables with headers (agents, workspaces, usage), the
descriptions of `describe`, decisions and policies. Everything is read from the DTOs of
`prospero.types`; the live `follow` view is `render_events`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.text import Text

from prospero.types.api import UsageBucket, UsageGroup, UsageReport, WorkspaceSummary
from prospero.types.decisions import Decision, WorkspacePolicy
from prospero.types.events import DecisionOption, DecisionToolCall, Usage
from prospero.types.model import Agent, Healthy, WorkspaceHealth
from prospero.types.summary import AgentTotals

STATUS_STYLE = {
    "spawning": "yellow",
    "running": "cyan",
    "idle": "magenta",
    "done": "green",
    "killed": "bright_black",
    "failed": "red",
    "crashed": "red bold",
}

NOT_REPORTED = "not reported"
NONE = "-"


def status_text(status: str, width: int = 0) -> Text:
    return Text(status.ljust(width), style=STATUS_STYLE.get(status, ""))


def health_state(health: WorkspaceHealth) -> str:
    return health.state


def health_reason(health: WorkspaceHealth) -> str:
    return "" if isinstance(health, Healthy) else health.reason


def fmt_cost(cost: float | None) -> str:
    if cost is None:
        return f"cost {NOT_REPORTED}"
    return f"${cost:.4f}"


def fmt_tokens(usage: Usage | None) -> str:
    if usage is None:
        return f"tokens {NOT_REPORTED}"
    parts = [f"{usage.input_tokens} in", f"{usage.output_tokens} out"]
    if usage.cache_read_input_tokens:
        parts.append(f"{usage.cache_read_input_tokens} cache-read")
    if usage.cache_creation_input_tokens:
        parts.append(f"{usage.cache_creation_input_tokens} cache-write")
    return " / ".join(parts) + " tokens"


def fmt_count(n: int | None) -> str:
    return NONE if n is None else f"{n:,}"


def short(value: str, limit: int) -> str:
    value = value.replace("\r", "")
    return value if len(value) <= limit else value[: limit - 1] + "…"


def compact_json(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _parse_ts(ts: str) -> datetime | None:
    try:
        at = datetime.fromisoformat(ts)
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def span(secs: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"


def fmt_age(ts: str, now: datetime | None = None) -> str:
    """`12s`, `5m`, `3h`, `2d` since an RFC 3339 timestamp (`?` when unreadable)."""
    at = _parse_ts(ts)
    if at is None:
        return "?"
    return span(max(0, int(((now or datetime.now(UTC)) - at).total_seconds())))


def fmt_deadline(deadline: str | None, now: datetime | None = None) -> str:
    if not deadline:
        return "no deadline"
    at = _parse_ts(deadline)
    if at is None:
        return deadline
    left = int((at - (now or datetime.now(UTC))).total_seconds())
    if left <= 0:
        return "deadline passed"
    return f"times out in {span(left)}"


def tool_text(tc: DecisionToolCall) -> str:
    if tc.title and tc.kind:
        return f"{tc.title} ({tc.kind})"
    return tc.title or tc.kind or "tool call"


def options_text(options: Sequence[DecisionOption]) -> str:
    return " | ".join(f"{o.id}: {o.label or o.kind}" for o in options)


# ---------------------------------------------------------------------- tables


@dataclass
class Cell:
    text: str
    style: str = ""


def widths_of(header: Sequence[str], rows: Sequence[Sequence[Cell | str]]) -> list[int]:
    return [
        max([len(h), *(len(c.text if isinstance(c, Cell) else c) for c in (r[i] for r in rows))])
        for i, h in enumerate(header)
    ]


def row_text(row: Sequence[Cell | str], widths: Sequence[int]) -> Text:
    """One table row: cells padded to `widths`, two spaces apart (the last one unpadded)."""
    line = Text()
    last = len(row) - 1
    for i, (cell, w) in enumerate(zip(row, widths, strict=True)):
        c = cell if isinstance(cell, Cell) else Cell(cell)
        line.append(c.text if i == last else c.text.ljust(w), style=c.style)
        if i != last:
            line.append("  ")
    line.rstrip()
    return line


def table(console: Console, header: Sequence[str], rows: Sequence[Sequence[Cell | str]]) -> None:
    """Columns padded to their widest cell, two spaces apart, a bold header line."""
    widths = widths_of(header, rows)
    console.print(Text(row_text(header, widths).plain, style="bold"))
    for row in rows:
        console.print(row_text(row, widths))


AGENT_COLUMNS = ("ID", "WORKSPACE", "STATUS", "AGE", "TURNS", "TOKENS", "COST", "LABEL")
AGENT_WIDE_COLUMNS = ("IN", "OUT", "MODEL", "PROTOCOL", "POSTURE", "TREE", "OWNER")


def agent_header(wide: bool) -> tuple[str, ...]:
    return (*AGENT_COLUMNS[:-1], *AGENT_WIDE_COLUMNS, "LABEL") if wide else AGENT_COLUMNS


def agent_cells(
    a: Agent, t: AgentTotals | None, wide: bool, now: datetime | None = None
) -> list[Cell | str]:
    t = t or AgentTotals()
    total = (
        None
        if t.input_tokens is None and t.output_tokens is None
        else (t.input_tokens or 0) + (t.output_tokens or 0)
    )
    cells: list[Cell | str] = [
        a.id,
        a.workspace,
        Cell(a.status.value, STATUS_STYLE.get(a.status.value, "")),
        fmt_age(a.started_at, now),
        str(t.turns),
        fmt_count(total),
        NONE if t.cost_usd is None else f"${t.cost_usd:.4f}",
    ]
    extra = [
        fmt_count(t.input_tokens),
        fmt_count(t.output_tokens),
        a.model or t.model or NONE,
        a.drive_protocol,
        a.posture or NONE,
        "worktree" if a.isolated else "shared",
        a.owner or NONE,
    ]
    label = a.label or a.name or ""
    if a.interactive:
        label = f"{label} (interactive)" if label else "(interactive)"
    return [*cells, *extra, label] if wide else [*cells, label]


def render_agents(
    console: Console, agents: Sequence[Agent], totals: dict[str, AgentTotals], wide: bool
) -> None:
    if not agents:
        console.print("(no agents)")
        return
    now = datetime.now(UTC)
    table(
        console, agent_header(wide), [agent_cells(a, totals.get(a.id), wide, now) for a in agents]
    )


def health_cell(health: WorkspaceHealth) -> Cell:
    state = health_state(health)
    return Cell(state, "green" if state == "healthy" else "red")


def render_workspaces(console: Console, rows: Sequence[WorkspaceSummary], wide: bool) -> None:
    if not rows:
        console.print("(no workspaces registered)")
        return
    # PHASE: a Workspace CR's reconciliation (k8s backend), shown whenever there is one
    phases = wide or any(ws.status is not None for ws in rows)
    header = ["NAME", "HEALTH", "AGENTS", "PROVIDER"]
    header += ["PHASE"] if phases else []
    header += ["SOURCES", "CALIBAND", "ROOT", "REASON"] if wide else ["ROOT"]
    out: list[list[Cell | str]] = []
    for ws in rows:
        cells: list[Cell | str] = [
            ws.name,
            health_cell(ws.health),
            str(ws.agent_count),
            ws.config.provider or ws.default_provider or NONE,
        ]
        if phases:
            phase = ws.status.phase if ws.status is not None else NONE
            if ws.status is not None and not ws.status.current:
                phase += "*"  # of an older generation: not reconciled yet
            cells.append(Cell(phase, "green" if phase in ("Ready", NONE) else "yellow"))
        if wide:
            cells.append(", ".join(s.name for s in ws.sources) or NONE)
            cells.append(ws.config.caliband.addr if ws.config.caliband is not None else NONE)
        cells.append(ws.root or NONE)
        if wide:
            reason = health_reason(ws.health)
            if ws.status is not None and ws.status.message:
                reason = f"{reason}; {ws.status.message}" if reason else ws.status.message
            cells.append(Cell(reason or NONE, "red" if reason else ""))
        out.append(cells)
    table(console, header, out)
    for ws in rows:  # what is wrong is said even without -o wide
        reason = health_reason(ws.health)
        if reason and not wide:
            console.print(f"{ws.name}: {reason}", style="red")
        for warning in ws.warnings:
            console.print(f"{ws.name}: warning: {warning}", style="yellow")


def _usage_cells(g: UsageGroup | UsageBucket) -> list[str]:
    o = g.outcomes
    return [
        str(g.runs),
        str(g.turns),
        NOT_REPORTED if g.input_tokens is None else f"{g.input_tokens:,}",
        NOT_REPORTED if g.output_tokens is None else f"{g.output_tokens:,}",
        NOT_REPORTED if g.cost_usd is None else f"${g.cost_usd:.4f}",
        str(o.done),
        str(o.failed),
        str(o.killed),
        str(o.crashed),
        str(o.budget_exceeded),
    ]


def render_usage(console: Console, report: UsageReport) -> None:
    console.print(f"usage from {report.since} until {report.until}")
    if not report.groups:
        console.print("(no usage in this window)")
        return
    cols = ["runs", "turns", "tokens in", "tokens out", "cost"]
    cols += ["done", "failed", "killed", "crashed", "over budget"]
    rows: list[tuple[str, list[str], bool]] = []
    for g in report.groups:
        rows.append((g.workspace, _usage_cells(g), True))
        for b in g.series:
            rows.append((f"  {b.day}", _usage_cells(b), False))
    first = max(len("workspace"), *(len(r[0]) for r in rows))
    widths = [max(len(c), *(len(r[1][i]) for r in rows)) for i, c in enumerate(cols)]
    header = "workspace".ljust(first) + "".join(
        "  " + c.rjust(w) for c, w in zip(cols, widths, strict=True)
    )
    console.print(Text(header, style="bold"))
    for name, cells, top in rows:
        line = Text(name.ljust(first), style="bold" if top else "dim")
        line.append("".join("  " + c.rjust(w) for c, w in zip(cells, widths, strict=True)))
        console.print(line)


# ---------------------------------------------------------------------- describe


def fields(console: Console, pairs: Sequence[tuple[str, str | Text]], indent: int = 0) -> None:
    """`Key:   value` lines, the values aligned."""
    width = max((len(k) for k, _ in pairs), default=0) + 1
    for key, value in pairs:
        line = Text(" " * indent + f"{key}:".ljust(width + 1), style="bold")
        line.append(value if isinstance(value, Text) else Text(value))
        console.print(line)


def _budget(a: Agent) -> str:
    caps = []
    if a.budget_usd is not None:
        caps.append(f"${a.budget_usd:g}")
    if a.budget_tokens is not None:
        caps.append(f"{a.budget_tokens:,} tokens")
    return " / ".join(caps) if caps else NONE


def describe_agent(
    console: Console, a: Agent, t: AgentTotals | None, decisions: Sequence[Decision]
) -> None:
    t = t or AgentTotals()
    pairs: list[tuple[str, str | Text]] = [
        ("ID", a.id),
        ("Name", a.name),
        ("Label", a.label or NONE),
        ("Workspace", a.workspace),
        ("Status", status_text(a.status.value)),
        ("Outcome", a.outcome or t.outcome or NONE),
        ("Started", f"{a.started_at} ({fmt_age(a.started_at)} ago)"),
        ("Model", a.model or t.model or NONE),
        ("Drive protocol", a.drive_protocol),
        ("Posture", a.posture or NONE),
        ("Tree", "worktree" if a.isolated else "shared"),
        ("Interactive", "yes" if a.interactive else "no"),
        ("Spawned here", "yes" if a.spawned_here else ("adopted" if a.adopted else "no")),
        ("Session dir", a.session_dir or NONE),
        ("Driven by", a.owner or NONE),
        ("Turns", str(t.turns)),
        ("Tokens", f"{fmt_count(t.input_tokens)} in / {fmt_count(t.output_tokens)} out"),
        ("Cost", NONE if t.cost_usd is None else f"${t.cost_usd:.4f}"),
        ("Budget", _budget(a)),
        ("Events", f"{t.seq} (prospero logs {a.id})"),
    ]
    fields(console, pairs)
    pending = [d for d in decisions if d.state == "pending"]
    console.print(Text("Pending decisions:", style="bold"), "(none)" if not pending else "")
    for d in pending:
        console.print(f"  {d.id}  {tool_text(d.tool_call)}  {fmt_deadline(d.deadline)}")


def caliband_text(ws: WorkspaceSummary) -> str:
    """The workspace's own networked caliband, or where its caliband is found by default."""
    cb = ws.config.caliband
    if cb is None:
        return "prosperod's default (--caliband-addr, else the root's Unix socket)"
    extra = [x for x in ("TLS" if cb.ca_file else "", "token" if cb.token_file else "") if x]
    if cb.source:
        extra.append(f"source {cb.source}")
    return cb.addr + (f" ({', '.join(extra)})" if extra else "")


def describe_workspace(
    console: Console, ws: WorkspaceSummary, policy: WorkspacePolicy | None, agents: Sequence[Agent]
) -> None:
    pairs: list[tuple[str, str | Text]] = [
        ("Name", ws.name),
        ("Root", ws.root or NONE),
        ("Health", Text(health_state(ws.health), style=health_cell(ws.health).style)),
    ]
    if health_reason(ws.health):
        pairs.append(("Reason", Text(health_reason(ws.health), style="red")))
    pairs.append(("Sources", ", ".join(f"{s.name} ({s.path})" for s in ws.sources) or NONE))
    cfg = ws.config
    pairs.append(("Provider", cfg.provider or ws.default_provider or NONE))
    if cfg.base_url:
        pairs.append(("Base URL", cfg.base_url))
    if cfg.api_key_from_env:
        pairs.append(("API key from", f"${cfg.api_key_from_env} (prosperod's environment)"))
    if cfg.env:
        pairs.append(("Env", ", ".join(f"{k}={v}" for k, v in sorted(cfg.env.items()))))
    caps = []
    if cfg.daily_budget_usd is not None:
        caps.append(f"${cfg.daily_budget_usd:g}")
    if cfg.daily_budget_tokens is not None:
        caps.append(f"{cfg.daily_budget_tokens:,} tokens")
    if caps:
        pairs.append(("Daily budget", " or ".join(caps) + " per UTC day"))
    pairs += [("Warning", Text(w, style="yellow")) for w in ws.warnings]
    if ws.status is None:  # the local backend (k8s: each pod's caliband)
        pairs.append(("Caliband", caliband_text(ws)))
    if ws.status is not None:
        state = ws.status.phase + ("" if ws.status.current else " (not reconciled yet)")
        pairs.append(("Phase", state))
    fields(console, pairs)
    if policy is not None:
        render_policy(console, ws.name, policy, heading=False)
    console.print(Text(f"Agents ({len(agents)}):", style="bold"))
    for a in agents:
        line = Text(f"  {a.id}  ")
        line.append_text(status_text(a.status.value, 8))
        line.append(f"  {a.label or a.name}")
        console.print(line)


# ---------------------------------------------------------------------- decisions


def resolution_text(
    state: str,
    by: str | None,
    option_kind: str | None,
    option_label: str | None,
    rule: str | None = None,
    note: str | None = None,
) -> Text:
    """How a decision ended, for listings and follow lines."""
    kind, label = option_kind or "", option_label or ""
    if state == "cancelled":
        t = Text("cancelled", style="bright_black")
    elif state == "expired":
        t = Text("timed out", style="yellow")
        if label:
            t.append(f" → {label}", style="yellow")
    elif kind.startswith("allow"):
        t = Text(f"allowed ({label})", style="green")
    elif kind.startswith("reject"):
        t = Text(f"denied ({label})", style="red")
    else:
        t = Text(f"{state} ({label})" if label else state)
    if by:
        t.append(f" by {by}")
    if rule:
        t.append(f" [{rule}]", style="dim")
    if note:
        t.append(f": {note}", style="dim")
    return t


def decision_resolution(d: Decision) -> Text:
    opt = d.option(d.option_id)
    label = (opt.label if opt is not None else "") or d.option_id
    return resolution_text(d.state, d.decided_by, opt.kind if opt else None, label, d.rule, d.note)


def render_decisions(console: Console, rows: Sequence[Decision], state: str = "pending") -> None:
    if not rows:
        console.print("(no pending decisions)" if state == "pending" else f"(no {state} decisions)")
        return
    for d in rows:
        head = Text(d.id, style="bold")
        head.append(f"  {d.agent_id}  {d.workspace}", style="cyan")
        head.append(f"  asked {fmt_age(d.created_at)} ago", style="dim")
        console.print(head)
        line = Text("  ")
        line.append(tool_text(d.tool_call), style="bold")
        inp = compact_json(d.tool_call.input)
        if inp:
            line.append(" " + short(inp.replace("\n", "⏎"), 160), style="cyan")
        console.print(line)
        if d.state == "pending":
            console.print(Text(f"  options: {options_text(d.options)}", style="dim"))
            console.print(f"  {fmt_deadline(d.deadline)}", style="dim")
        else:
            t = Text("  ")
            t.append_text(decision_resolution(d))
            if d.decided_at:
                t.append(f"  at {d.decided_at}", style="dim")
            console.print(t)


ACTION_STYLE = {"allow": "green", "deny": "red", "ask": "yellow"}


def render_policy(
    console: Console, workspace: str, p: WorkspacePolicy, *, heading: bool = True
) -> None:
    pad = "  " if heading else ""
    if heading:
        console.print(Text(f"workspace {workspace}", style="bold"))
    console.print(f"{pad}posture: {p.posture or 'default (autonomous)'}")
    waits = f"{p.timeout_s:g}s" if p.timeout_s is not None else "none (waits indefinitely)"
    console.print(f"{pad}ask timeout: {waits}")
    if not p.rules:
        console.print(f"{pad}rules: (none: supervised agents ask, autonomous ones are denied)")
        return
    console.print(f"{pad}rules (first match wins):")
    for i, r in enumerate(p.rules, 1):
        line = Text(f"{pad}  {i}. ")
        line.append(r.describe(), style=ACTION_STYLE.get(r.action, ""))
        line.append(f"  [{r.name or f'{workspace}#{i}'}]", style="dim")
        console.print(line)
