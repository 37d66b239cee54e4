"""Results of the MCP server's tools (`/mcp`, issue 15 item 1).

Each tool answers with one of these (its MCP `structuredContent`; the text content is the same
JSON). They wrap the API's own DTOs — an agent is the `Agent` that `GET /api/agents/{id}`
returns, an event the `FleetEvent` of `GET /api/agents/{id}/events`, a decision the `Decision`
of `GET /api/decisions` — so a tool and the route it mirrors say the same thing.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from prospero.types.api import SpawnedResponse, WorkspaceSummary
from prospero.types.decisions import Decision
from prospero.types.events import AgentFinished, FleetEvent
from prospero.types.model import Agent, AgentStatus

# agent_events: events per page unless the caller asks, and the most one page holds.
EVENTS_DEFAULT_LIMIT = 100
EVENTS_MAX_LIMIT = 500
# spawn: the longest `wait_seconds` (an MCP client's request must outlive the wait: the SDK's
# default read timeout is 300 s, some clients' less; follow a longer run with agent_events).
SPAWN_MAX_WAIT_S = 300.0

AgentAction = Literal["send_input", "end_input", "cancel_turn", "kill"]


class WorkspaceList(BaseModel):
    workspaces: list[WorkspaceSummary]


class AgentList(BaseModel):
    agents: list[Agent]


class AgentEventsPage(BaseModel):
    """One page of an agent's stored history, oldest first."""

    agent_id: str
    events: list[FleetEvent]
    truncated: bool = Field(
        description="More stored events follow this page: call again with from = next_from."
    )
    next_from: int = Field(
        description=(
            "The seq to ask for next (`from`): after the last event of this page, or the "
            "`from` asked for when the page is empty (events that arrive later start there)."
        )
    )
    finished: bool = Field(
        description="This page holds the agent's agent_finished event (its history ends here)."
    )


class SpawnResult(SpawnedResponse):
    """`spawn`'s answer: the spawn (as `POST /api/workspaces/{ws}/agents` returns it) and,
    with `wait_seconds`, how the run ended if it ended within the wait."""

    waited_s: float = Field(default=0.0, description="How long the tool waited for the run.")
    finished: bool = Field(
        default=False, description="The run ended (agent_finished) within the wait."
    )
    status: AgentStatus | None = Field(
        default=None,
        description=(
            "Finished: the final status its outcome reads as (done, failed, killed, "
            "crashed); else the agent's status when the wait ended (null if unknown yet)."
        ),
    )
    finish: AgentFinished | None = Field(
        default=None, description="The agent_finished event: outcome, turns, usage, cost."
    )


class AgentActionResult(BaseModel):
    """An agent operation was accepted (the REST route answers 202 to the same call)."""

    agent_id: str
    action: AgentAction
    accepted: bool = True


class DecisionList(BaseModel):
    decisions: list[Decision]


__all__ = [
    "EVENTS_DEFAULT_LIMIT",
    "EVENTS_MAX_LIMIT",
    "SPAWN_MAX_WAIT_S",
    "AgentAction",
    "AgentActionResult",
    "AgentEventsPage",
    "AgentList",
    "DecisionList",
    "SpawnResult",
    "WorkspaceList",
]
