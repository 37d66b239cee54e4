"""The poll loop's idle cost (core/fleet/polling.py, issue 11): with nothing due it neither
lists a workspace nor re-reads the registry; the registry is still re-read at least every
`poll_interval * poll_idle_backoff`, so a workspace registered by another writer of the store
is picked up while the known ones are backed off; a poll of an unchanged listing skips the
agents with nothing to apply."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from prospero.core.fleet.manager import FleetConfig, FleetManager
from prospero.core.fleet.records import AgentSpec, ListedAgent
from prospero.core.fleet.state import AgentSlot
from prospero.core.metrics import Metrics
from prospero.core.store.sqlite.agents import MemoryAgentMetaStore
from prospero.core.transport import UnixAddress
from prospero.types.model import AgentMeta, AgentStatus, RegisteredWorkspace
from tests.support import wait_until

FAR = 3600.0  # "not due for an hour"


class CountingConfigStore:
    def __init__(self, *workspaces: RegisteredWorkspace) -> None:
        self.workspaces = {w.name: w for w in workspaces}
        self.lists = 0

    async def list_workspaces(self) -> list[RegisteredWorkspace]:
        self.lists += 1
        return list(self.workspaces.values())

    async def upsert_workspace(self, ws: RegisteredWorkspace) -> None:
        self.workspaces[ws.name] = ws

    async def delete_workspace(self, name: str) -> bool:
        return self.workspaces.pop(name, None) is not None


class EmptyProvider:
    """Lists no agents; counts the listings per workspace."""

    def __init__(self) -> None:
        self.listed: list[str] = []

        self.during_listing: Callable[[], None] = lambda: None
        self.listener: Callable[[str], None] | None = None

    async def list_agents(self, ws: RegisteredWorkspace) -> list[ListedAgent]:
        self.listed.append(ws.name)
        self.during_listing()
        return []

    def on_changed(self, listener: Callable[[str], None] | None) -> None:
        self.listener = listener

    async def close(self) -> None:
        return None


class NoEmitter:
    async def emit(self, repo: str, agent_id: str, kind: Any) -> Any:
        raise AssertionError("nothing to emit for an empty, healthy workspace")

    async def flush(self) -> None:
        return None


def manager_for(store: CountingConfigStore, config: FleetConfig) -> tuple[FleetManager, Any]:
    provider = EmptyProvider()
    manager = FleetManager(
        provider,  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        NoEmitter(),
        Metrics(),
        config,
        agents=MemoryAgentMetaStore(),
    )
    return manager, provider


async def test_nothing_due_costs_no_listing_and_no_registry_read() -> None:
    store = CountingConfigStore(RegisteredWorkspace(name="w", root="/w"))
    manager, provider = manager_for(store, FleetConfig(poll_interval=1.0, poll_idle_backoff=8.0))
    assert manager._registry_interval() == 8.0
    await manager._poll_due()  # first cycle: the registry and every workspace
    assert (store.lists, provider.listed) == (1, ["w"])
    assert manager._registry_due > time.monotonic() and manager._due["w"] > time.monotonic()

    now = time.monotonic()
    manager._due["w"], manager._registry_due = now + FAR, now + FAR
    await manager._poll_due()  # woken with nothing due (e.g. by `_touch`)
    assert (store.lists, provider.listed) == (1, ["w"])

    manager._due["w"] = 0.0  # the workspace is due: registry re-read with its poll
    await manager._poll_due()
    assert (store.lists, provider.listed) == (2, ["w", "w"])

    manager._due["w"], manager._registry_due = time.monotonic() + FAR, 0.0
    await manager._poll_due()  # only the registry is due
    assert (store.lists, provider.listed) == (3, ["w", "w"])

    fixed = FleetConfig(poll_interval=1.0, poll_idle_backoff=1.0)
    assert manager_for(store, fixed)[0]._registry_interval() == 1.0


async def test_a_workspace_registered_elsewhere_is_picked_up_while_others_back_off() -> None:
    store = CountingConfigStore(RegisteredWorkspace(name="w", root="/w"))
    # Backed off at once (quiet_after 0), to poll_interval * 4 = 0.2 s.
    config = FleetConfig(poll_interval=0.05, poll_idle_backoff=4.0, poll_quiet_after=0.0)
    manager, provider = manager_for(store, config)
    await manager.start(poll=True)
    try:
        await wait_until(lambda: "w" in provider.listed, what="first poll")
        store.workspaces["other"] = RegisteredWorkspace(name="other", root="/other")
        await wait_until(lambda: "other" in provider.listed, what="registry re-read")
        assert "other" in manager._workspaces
    finally:
        await manager.stop()


async def test_a_pushed_change_is_one_poll_and_one_pushed_while_listing_is_one_more() -> None:
    """`FleetProvider.on_changed` (k8s: the watch): a burst of pushes for a backed-off
    workspace is one poll, without a registry read; a push that arrives while that poll lists
    is polled again; a push for a workspace not in the registry is dropped."""
    store = CountingConfigStore(RegisteredWorkspace(name="w", root="/w"))
    manager, provider = manager_for(store, FleetConfig(poll_interval=1.0, poll_idle_backoff=8.0))
    await manager._poll_due()
    assert (store.lists, provider.listed) == (1, ["w"])
    now = time.monotonic()
    manager._due["w"], manager._registry_due = now + FAR, now + FAR

    manager._wake.clear()
    for _ in range(50):
        manager._pushed_change("w")
    manager._pushed_change("elsewhere")
    assert manager._wake.is_set() and manager._pushed == {"w"}
    await manager._poll_due()
    assert (store.lists, provider.listed) == (1, ["w", "w"])
    await manager._poll_due()  # nothing pushed since, nothing due
    assert provider.listed == ["w", "w"]

    provider.during_listing = lambda: manager._pushed_change("w")
    manager._pushed_change("w")
    manager._wake.clear()
    await manager._poll_due()
    assert provider.listed == ["w", "w", "w"]
    assert manager._pushed == {"w"} and manager._wake.is_set()  # pushed while it listed
    provider.during_listing = lambda: None
    await manager._poll_due()
    assert provider.listed == ["w", "w", "w", "w"] and not manager._pushed
    assert store.lists == 1
    assert manager._due["w"] > time.monotonic()  # the timer, rescheduled from each poll


async def test_the_manager_listens_while_its_poll_loop_runs() -> None:
    store = CountingConfigStore(RegisteredWorkspace(name="w", root="/w"))
    manager, provider = manager_for(store, FleetConfig(poll_interval=30.0))
    await manager.start(poll=True)
    try:
        await wait_until(lambda: provider.listed == ["w"], what="first poll")
        assert provider.listener is not None
        provider.listener("w")  # long before the 30 s timer
        await wait_until(lambda: provider.listed == ["w", "w"], 2, what="the pushed poll")
    finally:
        await manager.stop()
    assert provider.listener is None


def _record(status: AgentStatus = AgentStatus.running) -> ListedAgent:
    return ListedAgent(
        id="a1",
        name="agent-a1",
        status=status,
        started_at="2026-12-01T00:00:00+00:00",
        session_dir="/s",
        address=UnixAddress("/x.sock"),
        spec=AgentSpec(prompt="hi"),
    )


async def test_an_unchanged_running_agent_is_steady_and_anything_else_is_applied() -> None:
    """`Polling._steady`: a poll of an unchanged listing skips `_apply_record` only for the
    same record object, already applied, of a running agent whose driver run goes on."""
    rec = _record()
    running: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    slot = AgentSlot(workspace="w", record=rec, status=AgentStatus.running)
    slot.task = running  # type: ignore[assignment]
    steady = FleetManager._steady
    assert steady(slot, rec, rec)
    assert not steady(slot, rec, None)  # new in this listing
    assert not steady(slot, _record(), rec)  # listed afresh: the provider's listing changed
    slot.meta = AgentMeta.model_validate(
        {"agent_id": "a1", "workspace": "w", "outcome": "completed"}
    )
    assert not steady(slot, rec, rec)  # reads as its recorded outcome now: a status change
    slot.meta = None
    running.set_result(None)
    assert not steady(slot, rec, rec)  # its driver's run ended: the poll may restart it
    slot.task = None
    assert not steady(slot, rec, rec)
    ended = _record(AgentStatus.done)
    done = AgentSlot(workspace="w", record=ended, status=AgentStatus.done, terminal_since=1.0)
    assert not steady(done, ended, ended)  # terminal bookkeeping (graces, catch-up, release)
