"""The EventSink the FleetManager hands each agent's driver: every event (or batch of events
with the driver's resume cursor) goes to the Emitter, and tells the manager the workspace is
busy."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from prospero.core.budgets import BudgetGuard
from prospero.core.drivers.ndjson_state import BASE_SUFFIX
from prospero.core.fleet.state import EmitterLike
from prospero.types.events import CompactKind, EventKind, TurnFinished


class AgentSink:
    """A driver's EventSink for one agent; `emit_batch` is the optional batch path drivers
    use when present (one emitter call, one timestamp, for a whole read of the stream).

    `emit_batch(kinds, cursor)`: the driver's resume state after these events (`kinds` may be
    empty when only the cursor moved), committed in the same store transaction as them
    (`Emitter.emit_many`: every emitter of the manager has that batch path, `EmitterLike`)."""

    __slots__ = ("after_turn", "agent_id", "budget", "emitter", "on_activity", "repo")

    def __init__(
        self,
        emitter: EmitterLike,
        repo: str,
        agent_id: str,
        on_activity: Callable[[], None] | None = None,
        budget: BudgetGuard | None = None,
        after_turn: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.emitter = emitter
        self.repo = repo
        self.agent_id = agent_id
        # The agent's caps (core/budgets.py): its budget events follow the turn that caused
        # them, in the same stream, and a crossing stops the agent.
        self.budget = budget
        # Called after the events of a turn's end are handed over (the workspace's daily
        # cap, core/budgets_daily.py); it returns at once for a workspace without one.
        self.after_turn = after_turn
        # Told of every event the driver hands over: the workspace is busy (poll it at the
        # configured interval, its agents' status may change any moment).
        self.on_activity = on_activity

    async def __call__(self, kind: EventKind) -> None:
        if self.on_activity is not None:
            self.on_activity()
        if self.budget is not None:
            await self._budget_ready()
        await self.emitter.emit(self.repo, self.agent_id, kind)
        if self.budget is not None:
            await self._budget_events((kind,))
        if self.after_turn is not None and type(kind) is TurnFinished:
            await self.after_turn()

    async def _budget_ready(self) -> None:
        assert self.budget is not None
        for owed in await self.budget.ready():
            await self.emitter.emit(self.repo, self.agent_id, owed)

    async def _budget_events(self, kinds: Sequence[object]) -> None:
        assert self.budget is not None
        for extra in self.budget.observe(kinds):
            await self.emitter.emit(self.repo, self.agent_id, extra)

    def in_turn_spend(self, turn_usd: float) -> list[EventKind]:
        """What the agent's caps say of a turn that has cost `turn_usd` so far (an ACP
        agent's cumulative `usage_update`): the budget events for the driver to put in its
        stream, in order (on a crossing, the stop is under way). Synchronous."""
        return self.budget.in_turn(turn_usd) if self.budget is not None else []

    async def flush(self) -> None:
        """Wait until what was handed over (events and cursors) is committed: the ACP
        driver commits a turn's begin before it sends that turn's prompt (at most once)."""
        await self.emitter.flush()

    async def emit_batch(
        self,
        kinds: list[CompactKind],
        cursor: bytes | None = None,
        cursor_base: bytes | None = None,
    ) -> None:
        """`cursor_base`: the agent's base row (key agent id + BASE_SUFFIX), committed in the
        same transaction as `cursor` (see drivers/ndjson_state.py)."""
        if kinds and self.on_activity is not None:
            self.on_activity()
        if self.budget is not None:
            await self._budget_ready()
        if cursor is None:
            await self.emitter.emit_many(self.repo, self.agent_id, kinds)
        elif cursor_base is None:
            await self.emitter.emit_many(self.repo, self.agent_id, kinds, cursor)
        else:
            await self.emitter.emit_many(
                self.repo,
                self.agent_id,
                kinds,
                cursor,
                cursor_extra=((self.agent_id + BASE_SUFFIX, cursor_base),),
            )
        if self.budget is not None and kinds:
            await self._budget_events(kinds)
        if self.after_turn is not None and any(type(k) is TurnFinished for k in kinds):
            await self.after_turn()
