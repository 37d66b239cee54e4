"""Human output of the CLI: fleet listings, usage tables, decisions and the live `follow`
view."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

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
SHELL_TOOLS = frozenset({"Bash", "bash", "shell", "Shell", "execute", "terminal"})


def status_text(status: str, width: int = 0) -> Text:
    return Text(status.ljust(width), style=STATUS_STYLE.get(status, ""))


def health_state(health: Any) -> str:
    if isinstance(health, dict):
        return str(health.get("state", "?"))
    return str(health or "?")


def health_text(health: Any) -> Text:
    state = health_state(health)
    t = Text(f"[{state}]", style="green" if state == "healthy" else "red")
    if isinstance(health, dict) and health.get("reason"):
        t.append(f" {health['reason']}", style="red")
    return t


def fmt_cost(cost: Any) -> str:
    if cost is None:
        return f"cost {NOT_REPORTED}"
    return f"${float(cost):.4f}"


def fmt_tokens(usage: Any) -> str:
    if not isinstance(usage, dict):
        return f"tokens {NOT_REPORTED}"
    parts = [f"{usage.get('input_tokens', 0)} in", f"{usage.get('output_tokens', 0)} out"]
    if usage.get("cache_read_input_tokens"):
        parts.append(f"{usage['cache_read_input_tokens']} cache-read")
    if usage.get("cache_creation_input_tokens"):
        parts.append(f"{usage['cache_creation_input_tokens']} cache-write")
    return " / ".join(parts) + " tokens"


def short(value: str, limit: int) -> str:
    value = value.replace("\r", "")
    return value if len(value) <= limit else value[: limit - 1] + "…"


def compact_json(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


# ---------------------------------------------------------------------- listings


def render_fleet(console: Console, fleet: dict[str, Any]) -> None:
    console.print(f"host: {escape(str(fleet.get('host', '?')))}")
    workspaces = fleet.get("workspaces") or []
    if not workspaces:
        console.print("(no workspaces registered)")
        return
    for ws in workspaces:
        line = Text(str(ws.get("name", "?")), style="bold")
        line.append("  ")
        line.append_text(health_text(ws.get("health")))
        provider = (ws.get("config") or {}).get("provider")
        if provider:
            line.append(f"  provider={provider}")
        console.print(line)
        agents = ws.get("agents") or []
        if not agents:
            console.print("  (no agents)", style="dim")
            continue
        for a in agents:
            row = Text("  ")
            row.append(str(a.get("id", "?")).ljust(14))
            row.append(" ")
            row.append_text(status_text(str(a.get("status", "?")), 9))
            row.append(" ")
            row.append(("worktree" if a.get("isolated") else "shared").ljust(9))
            extra = []
            if a.get("interactive"):
                extra.append("interactive")
            if a.get("drive_protocol") and a.get("drive_protocol") != "ndjson":
                extra.append(str(a["drive_protocol"]))
            if a.get("posture"):
                extra.append(str(a["posture"]))
            if a.get("model"):
                extra.append(str(a["model"]))
            if a.get("owner"):  # clustered: the replica driving it
                extra.append(f"driven by {a['owner']}")
            row.append(str(a.get("label") or a.get("name") or ""))
            if extra:
                row.append(f"  ({', '.join(extra)})", style="dim")
            console.print(row)


def render_workspaces(console: Console, rows: list[dict[str, Any]]) -> None:
    if not rows:
        console.print("(no workspaces registered)")
        return
    for ws in rows:
        cfg = ws.get("config") or {}
        n = ws.get("agent_count", 0)
        line = Text(str(ws.get("name", "?")).ljust(16), style="bold")
        line.append(" ")
        state = health_state(ws.get("health"))
        line.append(state.ljust(12), style="green" if state == "healthy" else "red")
        line.append(f" {n} agent{'s' if n != 1 else ''}".ljust(11))
        line.append(f" {ws.get('root', '')}")
        if cfg.get("provider"):
            line.append(f"  provider={cfg['provider']}")
        status = ws.get("status")  # k8s: the Workspace CR's reconciliation
        if isinstance(status, dict) and status.get("phase"):
            phase = str(status["phase"])
            line.append(f"  phase={phase}", style="green" if phase == "Ready" else "yellow")
            if status.get("message"):
                line.append(f" ({status['message']})", style="red")
        health = ws.get("health")
        if isinstance(health, dict) and health.get("reason"):
            line.append(f"  ({health['reason']})", style="red")
        console.print(line)
        sources = [str(s.get("name", "?")) for s in ws.get("sources") or []]
        if sources:
            console.print(f"  sources: {escape(', '.join(sources))}", style="dim")


def _usage_cells(g: dict[str, Any]) -> list[str]:
    o = g.get("outcomes") or {}
    cost = g.get("cost_usd")
    tin, tout = g.get("input_tokens"), g.get("output_tokens")
    return [
        str(g.get("runs", 0)),
        str(g.get("turns", 0)),
        NOT_REPORTED if tin is None else f"{tin:,}",
        NOT_REPORTED if tout is None else f"{tout:,}",
        NOT_REPORTED if cost is None else f"${float(cost):.4f}",
        *(str(o.get(k, 0)) for k in ("done", "failed", "killed", "crashed")),
    ]


def render_usage(console: Console, report: dict[str, Any]) -> None:
    console.print(f"usage from {report.get('since', '?')} until {report.get('until', '?')}")
    groups = report.get("groups") or []
    if not groups:
        console.print("(no usage in this window)")
        return
    cols = [
        "runs",
        "turns",
        "tokens in",
        "tokens out",
        "cost",
        "done",
        "failed",
        "killed",
        "crashed",
    ]
    rows: list[tuple[str, list[str], bool]] = []
    for g in groups:
        rows.append((str(g.get("workspace", "?")), _usage_cells(g), True))
        for b in g.get("series") or []:
            rows.append((f"  {b.get('day', '?')}", _usage_cells(b), False))
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


# ---------------------------------------------------------------------- decisions


def fmt_age(ts: Any, now: datetime | None = None) -> str:
    """`12s`, `5m`, `3h`, `2d` since an RFC 3339 timestamp (`?` when unreadable)."""
    try:
        at = datetime.fromisoformat(str(ts))
    except ValueError:
        return "?"
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return _span(max(0, int(((now or datetime.now(UTC)) - at).total_seconds())))


def _span(secs: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"


def fmt_deadline(deadline: Any, now: datetime | None = None) -> str:
    if not deadline:
        return "no deadline"
    try:
        at = datetime.fromisoformat(str(deadline))
    except ValueError:
        return str(deadline)
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    left = int((at - (now or datetime.now(UTC))).total_seconds())
    if left <= 0:
        return "deadline passed"
    return f"times out in {_span(left)}"


def tool_text(tc: Any) -> str:
    tc = tc if isinstance(tc, dict) else {}
    title = str(tc.get("title") or "")
    kind = str(tc.get("kind") or "")
    if title and kind:
        return f"{title} ({kind})"
    return title or kind or "tool call"


def options_text(options: Any) -> str:
    opts = [o for o in options or [] if isinstance(o, dict)]
    return " | ".join(f"{o.get('id')}: {o.get('label') or o.get('kind')}" for o in opts)


def resolution_text(d: dict[str, Any]) -> Text:
    """How a decision ended, for listings and follow lines."""
    state = str(d.get("state") or "?")
    by = d.get("decided_by") or d.get("by")
    opts = {o.get("id"): o for o in d.get("options") or [] if isinstance(o, dict)}
    opt = opts.get(d.get("option_id")) or {}
    kind = str(opt.get("kind") or d.get("option_kind") or "")
    label = str(opt.get("label") or d.get("option_label") or d.get("option_id") or "")
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
    if d.get("rule"):
        t.append(f" [{d['rule']}]", style="dim")
    if d.get("note"):
        t.append(f": {d['note']}", style="dim")
    return t


def render_decisions(console: Console, rows: list[dict[str, Any]], state: str = "pending") -> None:
    if not rows:
        console.print("(no pending decisions)" if state == "pending" else f"(no {state} decisions)")
        return
    for d in rows:
        head = Text(str(d.get("id", "?")), style="bold")
        head.append(f"  {d.get('agent_id', '?')}  {d.get('workspace', '')}", style="cyan")
        head.append(f"  asked {fmt_age(d.get('created_at'))} ago", style="dim")
        console.print(head)
        line = Text("  ")
        line.append(tool_text(d.get("tool_call")), style="bold")
        inp = compact_json((d.get("tool_call") or {}).get("input"))
        if inp:
            line.append(" " + short(inp.replace("\n", "⏎"), 160), style="cyan")
        console.print(line)
        if d.get("state") == "pending":
            console.print(f"  options: {escape(options_text(d.get('options')))}", style="dim")
            console.print(f"  {fmt_deadline(d.get('deadline'))}", style="dim")
        else:
            t = Text("  ")
            t.append_text(resolution_text(d))
            if d.get("decided_at"):
                t.append(f"  at {d['decided_at']}", style="dim")
            console.print(t)


def render_policy(console: Console, workspace: str, policy: Any) -> None:
    p = policy if isinstance(policy, dict) else {}
    console.print(Text(f"workspace {workspace}", style="bold"))
    posture = p.get("posture")
    console.print(f"  posture: {posture or 'default (autonomous)'}")
    timeout = p.get("timeout_s")
    waits = f"{timeout:g}s" if isinstance(timeout, int | float) else "none (waits indefinitely)"
    console.print(f"  ask timeout: {waits}")
    rules = [r for r in p.get("rules") or [] if isinstance(r, dict)]
    if not rules:
        console.print("  rules: (none: supervised agents ask, autonomous ones are denied)")
        return
    console.print("  rules (first match wins):")
    for i, r in enumerate(rules, 1):
        parts = [str(r.get("action", "?"))]
        for key in ("kind", "title", "command", "path"):
            if r.get(key) is not None:
                parts.append(f"{key}={r[key]!r}")
        name = r.get("name") or f"{workspace}#{i}"
        line = Text(f"    {i}. ")
        action = str(r.get("action"))
        line.append(
            " ".join(parts),
            style={"allow": "green", "deny": "red", "ask": "yellow"}.get(action, ""),
        )
        line.append(f"  [{name}]", style="dim")
        console.print(line)


# ---------------------------------------------------------------------- follow


class FollowRenderer:
    """Turns a stream of FleetEvent dicts into a readable, colored transcript."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.at_line_start = True
        self.tool_names: dict[str, str] = {}
        self.current_stream: str | None = None

    def _newline_if_needed(self) -> None:
        if not self.at_line_start:
            self.console.print()
            self.at_line_start = True

    def line(self, text: Text | str) -> None:
        self._newline_if_needed()
        self.current_stream = None
        self.console.print(text)
        self.at_line_start = True

    def chunk(self, text: str, style: str = "") -> None:
        if not text:
            return
        self.console.print(Text(text, style=style), end="")
        self.at_line_start = text.endswith("\n")

    def finish(self) -> None:
        self._newline_if_needed()

    def header(self, agent_id: str) -> None:
        self.line(Text(f"— following {agent_id} (Ctrl-C to stop) —", style="dim"))

    def reconnect(self, from_seq: int) -> None:
        self.line(Text(f"[reconnecting] resuming from seq {from_seq}", style="dim yellow"))

    def gap(self, data: Any) -> None:
        skipped = data.get("skipped") if isinstance(data, dict) else None
        last_seq = data.get("last_seq") if isinstance(data, dict) else None
        self.line(
            Text(
                f"[gap] fell behind — skipped {skipped} events after seq {last_seq}; "
                "recovered from history",
                style="yellow",
            )
        )

    def decision_line(self, ev: dict[str, Any]) -> None:
        """A decision event as one or two lines (follow and `decisions --watch`)."""
        k = ev.get("kind") or {}
        kind = k.get("kind")
        agent = ev.get("agent_id") or ""
        if kind == "decision_pending":
            t = Text("⏸ permission asked: ", style="bold yellow")
            t.append(tool_text(k.get("tool_call")), style="yellow")
            t.append(f"  decision {k.get('id')}", style="yellow")
            if agent:
                t.append(f" (agent {agent})", style="dim")
            self.line(t)
            hint = Text(f"  options: {options_text(k.get('options'))}; ", style="dim")
            hint.append(f"{fmt_deadline(k.get('deadline'))}; ", style="dim")
            hint.append(
                f"prospero approve {k.get('id')} | prospero deny {k.get('id')}", style="dim"
            )
            self.line(hint)
        elif kind == "decision_resolved":
            state = k.get("state")
            opt_kind = str(k.get("option_kind") or "")
            icon, style = ("⊘ ", "bright_black")
            if state == "decided" and opt_kind.startswith("allow"):
                icon, style = ("✔ ", "green")
            elif state in ("decided", "expired"):
                icon, style = ("✘ ", "red")
            t = Text(icon + "permission ", style=style)
            t.append(tool_text(k.get("tool_call")) + ": ", style=style)
            t.append_text(resolution_text(k))
            t.append(f"  decision {k.get('id')}", style="dim")
            self.line(t)

    def event(self, ev: dict[str, Any]) -> None:
        k = ev.get("kind") or {}
        kind = k.get("kind", "?")
        if kind in ("decision_pending", "decision_resolved"):
            self.decision_line(ev)
            return
        if kind == "output":
            if k.get("stream") == "thinking":
                if self.current_stream != "thinking":
                    self._newline_if_needed()
                self.current_stream = "thinking"
                self.chunk(str(k.get("chunk", "")), "dim italic")
            else:
                if self.current_stream == "thinking":
                    self._newline_if_needed()
                self.current_stream = "stdout"
                self.chunk(str(k.get("chunk", "")))
            return
        if kind == "tool_started":
            tid, name = str(k.get("id", "")), str(k.get("name", ""))
            if tid:
                self.tool_names[tid] = name
            t = Text("⚙ ", style="cyan")
            t.append(name or "tool", style="bold cyan")
            inp = compact_json(k.get("input"))
            if inp:
                t.append(" " + short(inp.replace("\n", "⏎"), 160), style="cyan")
            self.line(t)
        elif kind == "tool_finished":
            tid = str(k.get("id", ""))
            name = str(k.get("name") or self.tool_names.get(tid, "") or "tool")
            ok = bool(k.get("ok", True))
            t = Text("✓ " if ok else "✗ ", style="green" if ok else "red")
            t.append(name, style="bold green" if ok else "bold red")
            result = k.get("result")
            if isinstance(result, dict) and result.get("text"):
                lines = [ln for ln in str(result["text"]).splitlines() if ln.strip()]
                # Shell output ends with its summary ("8 passed", an error); files start with
                # what identifies them.
                pick = -1 if name in SHELL_TOOLS else 0
                preview = lines[pick].strip() if lines else ""
                more = len(lines) - 1
                if preview:
                    t.append("  " + short(preview, 100), style="dim")
                if more > 0:
                    t.append(f" (+{more} lines)", style="dim")
                if result.get("truncated"):
                    t.append(" [truncated]", style="dim")
            self.line(t)
        elif kind == "turn_finished":
            turn = k.get("turn")
            label = turn + 1 if isinstance(turn, int) else "?"  # turn_index is 0-based
            t = Text(f"[turn {label}] ", style="blue")
            t.append(fmt_tokens(k.get("usage")), style="blue")
            if k.get("cost_usd") is not None:
                t.append(f", {fmt_cost(k.get('cost_usd'))}", style="blue")
            if k.get("stop_reason"):
                t.append(f" ({k['stop_reason']})", style="dim")
            self.line(t)
        elif kind == "agent_finished":
            outcome = str(k.get("outcome") or "?")
            ok = outcome == "EndOfTurn"
            t = Text("[finished] ", style="bold green" if ok else "bold red")
            t.append(outcome, style="bold green" if ok else "bold red")
            turns = k.get("turns", 0)
            t.append(
                f" — {fmt_cost(k.get('cost_usd'))}, {turns} turn{'s' if turns != 1 else ''}, "
                f"{fmt_tokens(k.get('usage'))}"
            )
            if k.get("detail"):
                t.append(f" ({k['detail']})", style="red")
            self.line(t)
        elif kind == "status_changed":
            t = Text("[status] ", style="magenta")
            t.append_text(status_text(str(k.get("from", "?"))))
            t.append(" → ")
            t.append_text(status_text(str(k.get("to", "?"))))
            self.line(t)
        elif kind == "stream_gap":
            missing = k.get("missing")
            what = f"{missing} lines lost" if missing is not None else "possible data loss"
            if k.get("reason") == "ambiguous_overlap" and missing is not None:
                what = f"up to {missing} lines lost"
            detail = f": {k['detail']}" if k.get("detail") else ""
            self.line(Text(f"[stream_gap] {what}{detail}", style="yellow"))
        elif kind == "frames_skipped":
            self.line(
                Text(
                    f"[skipped] {k.get('count', '?')} {k.get('reason') or 'unreadable'} line(s)",
                    style="yellow",
                )
            )
        elif kind == "turn_lost":
            turn = k.get("turn")
            label = turn + 1 if isinstance(turn, int) else "?"
            t = Text(f"[turn {label} lost] ", style="bold yellow")
            t.append(str(k.get("reason") or "the turn's outcome is unknown"), style="yellow")
            self.line(t)
        elif kind == "store_persist_failed":
            self.line(
                Text(
                    f"⚠ [persist-gap] event {k.get('lost_seq')} was not stored: {k.get('detail', '')}",
                    style="yellow",
                )
            )
        elif kind == "agent_init":
            self.line(Text(f"[init] model={k.get('model', '')}", style="dim"))
        elif kind == "agent_spawned":
            self.line(Text("[spawned]", style="dim"))
        elif kind == "agent_discovered":
            self.line(Text("[discovered]", style="dim"))
        elif kind == "agent_gone":
            self.line(Text("[gone] the agent was removed", style="dim"))
        elif kind == "repo_health":
            self.line(Text(f"[health] {health_state(k.get('state'))}", style="dim"))
        else:
            self.line(Text(f"[{kind}]", style="dim"))
