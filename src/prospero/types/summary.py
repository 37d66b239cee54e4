"""`GET /api/dashboard/summary`: per-agent token, cost and turn totals (the dashboard's fleet
overview and `prospero ls`/`get` read it beside `/api/fleet`)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class AgentTotals(BaseModel):
    """Token, cost and turn totals of one agent, folded from its stored events.

    Sums of its `turn_finished` events, counted as each turn ends whatever the agent's state
    (running, idle, killed): the same per-turn accounting as /api/usage. `agent_finished`
    gives the outcome (and model) only: its own totals would count the turns twice, and miss
    turns it does not know of. Null = nothing reported (never a fake 0)."""

    seq: int = 0  # last folded event seq
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    turns: int = 0
    outcome: str | None = None
    model: str | None = None  # the model the agent last reported using


class DashboardSummary(BaseModel):
    last_ordinal: int = 0
    agents: dict[str, AgentTotals] = Field(default_factory=dict)
