"""What the FleetManager's parts share: its seams (emitter, decisions, driver factories), its
config, the per-agent slot, and `FleetState`, the attributes and internal calls the
FleetManager's mixins (polling.py, supervision.py, operations.py, ending.py) rely on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from prospero.core.budgets_daily import DailyBudgets
from prospero.core.drivers.base import (
    AgentDriver,
    DriverExit,
    DriverOptions,
    DriverTarget,
    EventSink,
)
from prospero.core.fleet.catchup import CatchUpGate
from prospero.core.fleet.provider import FleetProvider
from prospero.core.fleet.records import ListedAgent
from prospero.core.metrics import Metrics
from prospero.core.ownership import Ownership
from prospero.core.ratecard import RateCard
from prospero.core.relay.routing import OwnerRouting
from prospero.core.store.base import AgentMetaStore, EventStore
from prospero.types.events import CompactKind, EventKind, FleetEvent
from prospero.types.model import (
    Agent,
    AgentMeta,
    AgentStatus,
    Posture,
    RegisteredWorkspace,
    WorkspaceHealth,
)

NOT_DRIVEN = "this control plane did not spawn it (adopt it to drive it)"


class EmitterLike(Protocol):
    """What the manager and its drivers' sinks need of the Emitter (`core/emitter.py`)."""

    async def emit(self, repo: str, agent_id: str, kind: EventKind) -> FleetEvent: ...

    async def emit_many(
        self,
        repo: str,
        agent_id: str,
        kinds: Sequence[CompactKind],
        cursor: bytes | None = None,
        *,
        cursor_extra: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        """Emit `kinds` on one stream, with the driver's resume `cursor` (and `cursor_extra`
        rows) committed in the same transaction as them."""
        ...

    async def prepare(self, keys: Iterable[str]) -> None:
        """Seed these new streams' seq counters now, concurrently."""
        ...

    async def flush(self) -> None:
        """Wait until everything emitted so far is committed (or given up on)."""
        ...


class CursorStoreLike(Protocol):
    async def save_cursor(self, key: str, data: bytes) -> None: ...

    async def load_cursor(self, key: str) -> bytes | None: ...


class DecisionHooks(Protocol):
    """The pending-decision surface (prospero.core.decisions.DecisionService): the manager
    resolves an agent's pending permission asks when it kills, cancels, removes or sees the
    agent end, and stamps a workspace's default posture on spawns that choose none."""

    async def cancel_agent(self, agent_id: str, reason: str) -> int: ...

    async def default_posture(self, workspace: str) -> Posture | None: ...


class DriverFactory(Protocol):
    def __call__(
        self,
        target: DriverTarget,
        sink: EventSink,
        options: DriverOptions,
        metrics: Metrics,
        cursor_store: CursorStoreLike | None,
    ) -> AgentDriver: ...


@dataclass
class FleetConfig:
    host: str = "local"
    poll_interval: float = 2.0
    # A quiet workspace (no listing change, no agent event, no API action, no driver ending,
    # no grace running for `poll_quiet_after` seconds) is polled less often: its interval grows
    # with how long it has been quiet (half of it), up to `poll_interval * poll_idle_backoff`.
    # Anything of the above resets it to `poll_interval` at once. 1.0 = the fixed cadence.
    poll_idle_backoff: float = 8.0
    poll_quiet_after: float = 10.0
    include_thinking: bool = True
    rate_card: RateCard = field(default_factory=RateCard)
    backoff_base: float = 0.2
    backoff_cap: float = 10.0
    max_failures: int = 8
    allow_acp: bool = False
    default_env: dict[str, str] = field(default_factory=dict)
    # How long a driver may keep reading after the agent turned terminal, to collect the
    # stream's last lines, before it is closed.
    terminal_grace: float = 3.0
    # The same bound for a catch-up run (an agent that ended while no prosperod watched),
    # counted from when the run starts: recovering a long transcript takes longer.
    catchup_grace: float = 30.0
    # The provider's kill removes the agent (K8sFleet deletes its CalibanTask) instead of
    # leaving a `killed` record: the manager concludes the run itself before the kill.
    kill_removes_agent: bool = False
    # A spawn is refused when the workspace's provider key does not resolve in prosperod's own
    # environment (local calibands inherit it). False for the k8s backend: its pods get their
    # keys from the Secrets the cluster's Workspace names, which Prospero never reads.
    provider_keys_here: bool = True

    def driver_options(self) -> DriverOptions:
        return DriverOptions(
            include_thinking=self.include_thinking,
            rate_card=self.rate_card,
            backoff_base=self.backoff_base,
            backoff_cap=self.backoff_cap,
            max_failures=self.max_failures,
        )


@dataclass
class AgentSlot:
    """What the manager tracks per agent it has ever seen in this process."""

    workspace: str
    record: ListedAgent | None = None
    driver: AgentDriver | None = None
    task: asyncio.Task[DriverExit] | None = None
    terminal_since: float | None = None
    meta: AgentMeta | None = None
    target: DriverTarget | None = None
    # The status the agent reads as (caliband's, or its recorded outcome): what
    # status_changed events diff.
    status: AgentStatus | None = None
    # A catch-up run (the agent ended while no prosperod watched): when it started running.
    catchup: bool = False
    catchup_started: float | None = None
    # The last driver run here was refused the agent's lease (another replica, maybe a dead
    # one whose lease has not expired yet, holds it): a terminal agent's run is tried again
    # at each poll until one runs (polling.py `_apply_record`).
    lease_refused: bool = False
    released: bool = False  # an ended ACP session's worker was released through caliband
    # Clustered: first listed here; announced (`agent_discovered`) at the first poll after
    # `discover_at` (monotonic) if nobody has announced or spawned it by then (polling.py
    # `_discover_pending`).
    discover_pending: bool = False
    discover_at: float = 0.0


class FleetState:
    """The FleetManager's state, declared for its mixins (the manager sets every field)."""

    provider: FleetProvider
    store: EventStore
    emitter: EmitterLike
    metrics: Metrics
    config: FleetConfig
    driver_factories: dict[str, DriverFactory]
    decisions: DecisionHooks | None
    ownership: Ownership
    # Clustered: where a request that needs an agent's driver runs (core/relay/routing.py).
    routing: OwnerRouting | None
    fenced_cursors: bool  # drivers save cursors through the emitter (clustered, ADR 0012)
    agents: AgentMetaStore
    _workspaces: dict[str, RegisteredWorkspace]
    _health: dict[str, WorkspaceHealth]
    _listed: dict[str, dict[str, ListedAgent]]
    # Clustered: the lifecycle lease epoch of each workspace this replica has written under
    # (and rebased its view on the store for: polling.py `_rebase_lifecycle`).
    _lifecycle_terms: dict[str, int]
    # Clustered: the lease epoch under which each workspace's health baseline was last read
    # from the store (polling.py `_rebase_health`).
    _health_terms: dict[str, int]
    _slots: dict[str, AgentSlot]
    _poll_locks: dict[str, asyncio.Lock]
    _catchup: CatchUpGate
    # Poll scheduling (polling.py): when each workspace last changed or saw activity, when the
    # poll loop looks at it next, the workspaces the provider pushed a change for (polled at
    # the loop's next turn), the event that reschedules the loop, and when the loop re-reads
    # the registry at the latest.
    _changed_at: dict[str, float]
    _due: dict[str, float]
    _pushed: set[str]
    _wake: asyncio.Event
    _registry_due: float
    _closing_tasks: set[asyncio.Task[None]]
    _stopping: bool
    # Workspaces' daily caps (core/budgets_daily.py) and the agents this replica stopped at one.
    daily_budgets: DailyBudgets
    _daily_stopped: set[str]

    if TYPE_CHECKING:

        def _ws(self, name: str) -> RegisteredWorkspace: ...

        def _slot(self, agent_id: str) -> tuple[RegisteredWorkspace, AgentSlot]: ...

        def get_agent(self, agent_id: str) -> Agent: ...

        async def poll_workspace(self, name: str) -> None: ...

        async def _reload_registry(self) -> None: ...

        def _touch(self, name: str) -> None: ...

        def _make_driver(self, ws: RegisteredWorkspace, rec: ListedAgent) -> AgentDriver: ...

        def _ensure_driver(self, ws: RegisteredWorkspace, rec: ListedAgent) -> None: ...

        async def _close_driver(
            self,
            agent_id: str,
            *,
            conclude: bool = False,
            ending: tuple[str, str] | None = None,
            release: bool = True,
        ) -> None: ...

        async def _cancel_asks(self, agent_id: str, reason: str) -> None: ...

        async def _stop_for_budget(self, agent_id: str, detail: str) -> None: ...

        async def _put_meta(self, meta: AgentMeta) -> None: ...

        async def _on_finished(self, agent_id: str) -> None: ...

        async def _conclude(
            self, agent_id: str, driver: AgentDriver, ending: tuple[str, str] | None = None
        ) -> None: ...

        async def _release_worker(self, ws: RegisteredWorkspace, slot: AgentSlot) -> None: ...
