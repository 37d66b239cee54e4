"""What the FleetManager looks up the first time this process sees an agent, and the bounded
catch-up of agents that ended while no prosperod watched (issue 9, items 3 and 7).

- `agent_discovered` is emitted only for an agent this store has never seen: no AgentMeta and
  no stored event (a restart does not re-announce the agents it spawned or already followed).
- An agent caliband lists in a terminal state whose stored history has no `agent_finished`
  gets one driver run: an NDJSON driver recovers the rest of the run from the transcript (its
  persisted cursor makes an already-finished one return at once); a driver that cannot reach
  the run's end concludes it. At most `CATCHUP_CONCURRENCY` such runs go at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from prospero.core.store.base import AgentMetaStore, EventStore
from prospero.types.events import stream_key_for
from prospero.types.model import AgentMeta

CATCHUP_CONCURRENCY = 4


@dataclass(frozen=True)
class FirstSight:
    meta: AgentMeta | None
    seen_before: bool  # this store holds metadata or events of the agent
    finished: bool  # its stored history has an agent_finished


async def has_finished(store: EventStore, stream_key: str) -> bool:
    return bool(await store.replay(stream_key, 0, 1, kinds=("agent_finished",)))


async def first_sight(
    store: EventStore, agents: AgentMetaStore, workspace: str, agent_ids: list[str]
) -> dict[str, FirstSight]:
    """Metadata, stored high-water and "finished" of agents new to this process, concurrently
    (one store round trip each, not in series)."""

    async def one(agent_id: str) -> tuple[str, FirstSight]:
        key = stream_key_for(workspace, agent_id)
        meta, high = await asyncio.gather(agents.get_meta(agent_id), store.high_water(key))
        finished = high > 0 and await has_finished(store, key)
        return agent_id, FirstSight(meta, meta is not None or high > 0, finished)

    return dict(await asyncio.gather(*(one(a) for a in agent_ids)))


class CatchUpGate:
    """Bounds how many catch-up driver runs go at once."""

    def __init__(self, limit: int = CATCHUP_CONCURRENCY) -> None:
        self._sem = asyncio.Semaphore(limit)
        self.running = 0
        self.total = 0

    async def __aenter__(self) -> CatchUpGate:
        await self._sem.acquire()
        self.running += 1
        self.total += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.running -= 1
        self._sem.release()
