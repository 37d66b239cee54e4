"""The readable, coloured transcript of an agent's events (`follow`, `logs`, `spawn --follow`,
and the decision lines of `decisions --watch`), read from `prospero.types.events`."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from prospero.cli.render import (
    compact_json,
    fmt_cost,
    fmt_deadline,
    fmt_tokens,
    options_text,
    resolution_text,
    short,
    status_text,
    tool_text,
)
from prospero.types import events as ev
from prospero.types.decisions import denied_by_posture

SHELL_TOOLS = frozenset({"Bash", "bash", "shell", "Shell", "execute", "terminal"})


def parse_event(data: Any) -> ev.FleetEvent | None:
    """An event of the stream as the DTO; None for one this CLI does not know (a newer
    prosperod's kind), which is shown by its kind name only."""
    try:
        return ev.FleetEvent.model_validate(data)
    except ValidationError:
        return None


def kind_name(data: Any) -> str:
    kind = data.get("kind") if isinstance(data, dict) else None
    name = kind.get("kind") if isinstance(kind, dict) else None
    return str(name or "?")


class FollowRenderer:
    """Turns a stream of events into a readable, coloured transcript."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.at_line_start = True
        self.tool_names: dict[str, str] = {}
        self.current_stream: str | None = None
        # The run's resolved permission requests, and those its autonomous posture denied.
        self.resolved = 0
        self.denied_by_posture = 0

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

    def raw(self, data: Any) -> None:
        """An event given as JSON data (what the stream sent)."""
        event = parse_event(data)
        if event is None:
            self.line(Text(f"[{kind_name(data)}]", style="dim"))
        else:
            self.event(event)

    def decision_line(self, event: ev.FleetEvent) -> None:
        """A decision event as one or two lines (follow and `decisions --watch`)."""
        k = event.kind
        agent = event.agent_id
        if isinstance(k, ev.DecisionPending):
            t = Text("⏸ permission asked: ", style="bold yellow")
            t.append(tool_text(k.tool_call), style="yellow")
            t.append(f"  decision {k.id}", style="yellow")
            if agent:
                t.append(f" (agent {agent})", style="dim")
            self.line(t)
            hint = Text(f"  options: {options_text(k.options)}; ", style="dim")
            hint.append(f"{fmt_deadline(k.deadline)}; ", style="dim")
            hint.append(f"prospero approve {k.id} | prospero deny {k.id}", style="dim")
            self.line(hint)
        elif isinstance(k, ev.DecisionResolved):
            opt_kind = k.option_kind or ""
            icon, style = ("⊘ ", "bright_black")
            if k.state == "decided" and opt_kind.startswith("allow"):
                icon, style = ("✔ ", "green")
            elif k.state in ("decided", "expired"):
                icon, style = ("✘ ", "red")
            t = Text(icon + "permission ", style=style)
            t.append(tool_text(k.tool_call) + ": ", style=style)
            label = k.option_label or k.option_id
            t.append_text(resolution_text(k.state, k.by, k.option_kind, label, k.rule, k.note))
            t.append(f"  decision {k.id}", style="dim")
            self.line(t)

    def event(self, event: ev.FleetEvent) -> None:
        k = event.kind
        if isinstance(k, ev.DecisionResolved):
            self.resolved += 1
            self.denied_by_posture += denied_by_posture(k)
        if isinstance(k, ev.DecisionPending | ev.DecisionResolved):
            self.decision_line(event)
        elif isinstance(k, ev.Output):
            if k.stream == "thinking":
                if self.current_stream != "thinking":
                    self._newline_if_needed()
                self.current_stream = "thinking"
                self.chunk(k.chunk, "dim italic")
            else:
                if self.current_stream == "thinking":
                    self._newline_if_needed()
                self.current_stream = "stdout"
                self.chunk(k.chunk)
        elif isinstance(k, ev.ToolStarted):
            if k.id:
                self.tool_names[k.id] = k.name
            t = Text("⚙ ", style="cyan")
            t.append(k.name or "tool", style="bold cyan")
            inp = compact_json(k.input)
            if inp:
                t.append(" " + short(inp.replace("\n", "⏎"), 160), style="cyan")
            self.line(t)
        elif isinstance(k, ev.ToolFinished):
            self.tool_finished(k)
        elif isinstance(k, ev.TurnFinished):
            t = Text(f"[turn {k.turn + 1}] ", style="blue")  # turn_index is 0-based
            t.append(fmt_tokens(k.usage), style="blue")
            if k.cost_usd is not None:
                t.append(f", {fmt_cost(k.cost_usd)}", style="blue")
            if k.stop_reason:
                t.append(f" ({k.stop_reason})", style="dim")
            self.line(t)
        elif isinstance(k, ev.AgentFinished):
            outcome = k.outcome or "?"
            style = "bold green" if ev.run_result(outcome) == "done" else "bold red"
            t = Text("[finished] ", style=style)
            t.append(outcome, style=style)
            t.append(
                f" — {fmt_cost(k.cost_usd)}, {k.turns} turn{'s' if k.turns != 1 else ''}, "
                f"{fmt_tokens(k.usage)}"
            )
            if k.detail:
                t.append(f" ({k.detail})", style="red")
            self.line(t)
            self.posture_warning(event.repo)
        elif isinstance(k, ev.StatusChanged):
            t = Text("[status] ", style="magenta")
            t.append_text(status_text(k.from_.value))
            t.append(" → ")
            t.append_text(status_text(k.to.value))
            self.line(t)
        elif isinstance(k, ev.StreamGap):
            what = f"{k.missing} lines lost" if k.missing is not None else "possible data loss"
            if k.reason == "ambiguous_overlap" and k.missing is not None:
                what = f"up to {k.missing} lines lost"
            detail = f": {k.detail}" if k.detail else ""
            self.line(Text(f"[stream_gap] {what}{detail}", style="yellow"))
        elif isinstance(k, ev.BudgetWarning | ev.BudgetExceeded):

            def amount(v: float) -> str:
                return f"${v:.4f}" if k.limit == "usd" else f"{int(v):,} tokens"

            whose = " (the workspace's daily cap)" if k.scope == "workspace_day" else ""
            if isinstance(k, ev.BudgetWarning):
                text = f"[budget] {amount(k.spent)} of {amount(k.cap)} spent{whose}"
                self.line(Text(text, style="yellow"))
            else:
                text = (
                    f"[budget exceeded] {amount(k.spent)} of a {amount(k.cap)} cap{whose}: stopped"
                )
                self.line(Text(text, style="bold red"))
        elif isinstance(k, ev.FramesSkipped):
            reason = k.reason or "unreadable"
            self.line(Text(f"[skipped] {k.count} {reason} line(s)", style="yellow"))
        elif isinstance(k, ev.TurnLost):
            t = Text(f"[turn {k.turn + 1} lost] ", style="bold yellow")
            t.append(k.reason or "the turn's outcome is unknown", style="yellow")
            self.line(t)
        elif isinstance(k, ev.StorePersistFailed):
            self.line(
                Text(
                    f"⚠ [persist-gap] event {k.lost_seq} was not stored: {k.detail}",
                    style="yellow",
                )
            )
        elif isinstance(k, ev.AgentInit):
            self.line(Text(f"[init] model={k.model}", style="dim"))
        elif isinstance(k, ev.AgentSpawned):
            self.line(Text("[spawned]", style="dim"))
        elif isinstance(k, ev.AgentDiscovered):
            self.line(Text("[discovered]", style="dim"))
        elif isinstance(k, ev.AgentGone):
            self.line(Text("[gone] the agent was removed", style="dim"))
        elif isinstance(k, ev.RepoHealth):
            self.line(Text(f"[health] {k.state.state}", style="dim"))
        else:  # pragma: no cover - every kind of the union is handled above
            self.line(Text(f"[{k.kind}]", style="dim"))

    def posture_warning(self, workspace: str) -> None:
        """At the end of a run: say so when its autonomous posture denied its permission
        requests (the run may well end `EndOfTurn` having changed nothing it asked to)."""
        denied = self.denied_by_posture
        if not denied:
            return
        what = (
            f"every permission request of this run ({denied}) was"
            if denied == self.resolved
            else f"{denied} of the {self.resolved} permission requests of this run were"
        )
        self.line(
            Text(
                f"⚠ {what} denied by its posture: an autonomous agent has nobody to ask. To "
                "approve them, spawn with --posture supervised (or set the workspace's: "
                f"prospero policy set {workspace or 'WORKSPACE'} --posture supervised) and "
                "answer with prospero decisions / prospero approve ID",
                style="bold yellow",
            )
        )

    def tool_finished(self, k: ev.ToolFinished) -> None:
        name = k.name or self.tool_names.get(k.id, "") or "tool"
        t = Text("✓ " if k.ok else "✗ ", style="green" if k.ok else "red")
        t.append(name, style="bold green" if k.ok else "bold red")
        if k.result is not None and k.result.text:
            lines = [ln for ln in k.result.text.splitlines() if ln.strip()]
            # Shell output ends with its summary ("8 passed", an error); files start with
            # what identifies them.
            pick = -1 if name in SHELL_TOOLS else 0
            preview = lines[pick].strip() if lines else ""
            more = len(lines) - 1
            if preview:
                t.append("  " + short(preview, 100), style="dim")
            if more > 0:
                t.append(f" (+{more} lines)", style="dim")
            if k.result.truncated:
                t.append(" [truncated]", style="dim")
        self.line(t)
