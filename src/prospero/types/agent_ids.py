"""`GET /api/agent-ids/{prefix}`: a unique prefix of an agent id resolved to the id, as
`kubectl`/`docker` users expect (`prospero follow 65b7`).

The ids a prefix is matched against: the agents the fleet lists now, and every agent this
control plane spawned or adopted (its own metadata, kept after caliband forgets the agent).
An id given in full resolves to itself whenever its history is stored, even when neither list
holds it (an agent that was only discovered, then removed). An id that equals the prefix wins
over longer ids that start with it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from prospero.types.model import AgentStatus

MAX_CANDIDATES = 20


class AgentRef(BaseModel):
    """An agent a prefix matched: its id and, where known, where it runs and how it is."""

    agent_id: str
    workspace: str | None = Field(
        default=None, description="Null when only the agent's stored history knows it."
    )
    status: AgentStatus | None = Field(
        default=None, description="Its status when the fleet lists it now, else null."
    )
    label: str | None = None


class AgentIdResolution(BaseModel):
    """200: the prefix names exactly one agent (or is an agent's whole id)."""

    prefix: str
    agent: AgentRef
    exact: bool = Field(description="The prefix is the whole id.")


class AmbiguousAgentId(BaseModel):
    """409: the prefix starts several ids. The `{error, kind}` envelope plus the candidates
    (sorted by id, at most `MAX_CANDIDATES`; `more` counts the rest)."""

    error: str
    kind: Literal["ambiguous"] = "ambiguous"
    prefix: str
    candidates: list[AgentRef] = Field(default_factory=list)
    more: int = 0
