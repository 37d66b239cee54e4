"""Watching one agent's run: follow its stream, print it, and tell how the run ended (shared by
`follow`, `logs -f` and `spawn --follow`).

`--exit-status` makes the exit code say how the agent's run ended: 0 when it ended `done`
(`EndOfTurn`), 7 (`exits.AGENT_FAILED`) for any other end (failed, crashed, killed, or a
stream that stopped without saying).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import typer

from prospero.cli import exits
from prospero.cli.app import _console
from prospero.cli.client import Client, follow_events, seg
from prospero.cli.output import OutputFormat, print_item
from prospero.cli.render_events import FollowRenderer
from prospero.types.events import RunResult, run_result
from prospero.types.model import Agent, AgentStatus

ExitStatusOpt = Annotated[
    bool,
    typer.Option(
        "--exit-status",
        help=f"Exit {exits.AGENT_FAILED} unless the agent's run ends done (EndOfTurn).",
    ),
]


@dataclass
class RunWatch:
    """How the run ended, as far as the events shown said."""

    outcome: str | None = None
    status: AgentStatus | None = None
    gone: bool = False

    @property
    def ended(self) -> bool:
        """The stream has nothing more to say (`agent_finished` or `agent_gone` seen)."""
        return self.outcome is not None or self.gone

    def observe(self, data: Any) -> None:
        kind = data.get("kind") if isinstance(data, dict) else None
        if not isinstance(kind, dict):
            return
        if kind.get("kind") == "agent_gone":
            self.gone = True
        elif kind.get("kind") == "agent_finished" and isinstance(kind.get("outcome"), str):
            self.outcome = kind["outcome"]
        elif kind.get("kind") == "status_changed":
            try:
                self.status = AgentStatus(str(kind.get("to")))
            except ValueError:
                pass

    def result(self, c: Client, agent_id: str) -> RunResult | None:
        if self.outcome is not None:
            return run_result(self.outcome)
        status = self.status
        if status is None or not status.terminal:
            try:  # the stream said nothing conclusive: ask for the agent's status
                status = c.get_model(f"/api/agents/{seg(agent_id)}", Agent).status
            except Exception:
                return None
        return run_result(status.value) if status.terminal else None


def exit_for(watch: RunWatch, c: Client, agent_id: str) -> None:
    if watch.result(c, agent_id) != "done":
        raise typer.Exit(exits.AGENT_FAILED)


def watch_agent(c: Client, agent_id: str, from_seq: int, fmt: OutputFormat) -> RunWatch:
    """Follow one agent's stream until its run ends, printing in `fmt`."""
    watch = RunWatch()
    renderer = None if fmt.machine else FollowRenderer(_console())
    if renderer is not None:
        renderer.header(agent_id)
    try:
        for item in follow_events(c, agent_id, from_seq):
            if item.kind == "event":
                watch.observe(item.data)
            if renderer is None:
                if item.kind == "event":
                    print_item(item.data, fmt)
                elif item.kind == "gap":
                    print_item({"gap": item.data}, fmt)
            elif item.kind == "event":
                renderer.raw(item.data)
            elif item.kind == "gap":
                renderer.gap(item.data)
            elif item.kind == "reconnect":
                renderer.reconnect(item.data)
    finally:
        if renderer is not None:
            renderer.finish()
    return watch
