"""The FleetManager over K8sFleet and the fake Kubernetes API server (issue 13, ADR 0013):
woken by the CalibanTask watch rather than its timer, and a new lifecycle observer's health
baseline taken from the store, so an outage that began or ended in a handover gap is recorded
once."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from prospero.core.bus.memory import InProcessBus
from prospero.core.emitter import Emitter
from prospero.core.fleet.k8s import K8sFleet
from prospero.core.fleet.manager import FleetConfig, FleetManager
from prospero.core.leases import LeaseKeeper, MemoryLeases
from prospero.core.metrics import Metrics
from prospero.core.ownership import LeasedOwnership, Ownership, workspace_key
from prospero.core.store.sqlite.agents import MemoryAgentMetaStore
from prospero.core.store.sqlite.events import SqliteEventStore
from prospero.testkit.fake_kube import FakeKube
from prospero.testkit.fake_kube.operator import TASKS
from prospero.types.events import FleetEvent
from prospero.types.model import RegisteredWorkspace
from tests.support import wait_until

NS = "default"
WS = "app"
TASKS_PATH = f"/apis/caliban.caliban-ai.dev/v1alpha1/namespaces/{NS}/calibantasks"


class OneWorkspace:
    """The config store's registry: one rootless workspace (the CRs say the rest)."""

    async def list_workspaces(self) -> list[RegisteredWorkspace]:
        return [RegisteredWorkspace(name=WS, root="")]


@dataclass
class Rig:
    tmp: Path
    kube: FakeKube
    store: SqliteEventStore
    emitter: Emitter
    managers: list[FleetManager] = field(default_factory=list)
    keepers: list[LeaseKeeper] = field(default_factory=list)
    leases: MemoryLeases = field(default_factory=MemoryLeases)

    def manager(self, config: FleetConfig, ownership: Ownership | None = None) -> FleetManager:
        """A replica: its own K8sFleet (and watch), the shared store and emitter."""
        provider = K8sFleet(NS, self.kube.write_kubeconfig(self.tmp), request_timeout=2)
        provider.cache.backoff_initial, provider.cache.backoff_max = 0.02, 0.2
        manager = FleetManager(
            provider,
            OneWorkspace(),  # type: ignore[arg-type]
            self.store,
            self.emitter,
            Metrics(),
            config,
            agents=MemoryAgentMetaStore(),
            ownership=ownership,
        )
        self.managers.append(manager)
        return manager

    def replica(self, name: str) -> FleetManager:
        """A clustered replica (leases on the shared authority), polled by hand."""
        keeper = LeaseKeeper(self.leases, name, ttl=30)
        self.keepers.append(keeper)
        return self.manager(FleetConfig(poll_interval=3600), LeasedOwnership(keeper))

    async def down(self) -> None:
        """Stop the API server, until every replica's watch has noticed (a cache still
        `ready` would serve its last listing)."""
        await self.kube.stop()
        caches = [m.provider.cache for m in self.managers]  # type: ignore[attr-defined]
        await wait_until(lambda: all(c.error is not None for c in caches), 5, what="watch down")

    async def events(self, kind: str, key: str) -> list[FleetEvent]:
        await self.emitter.flush()
        return [e for e in await self.store.replay(key) if e.kind.kind == kind]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    kube = FakeKube()  # no operator: only the test writes
    await kube.start()
    kube.requested_port = kube.port  # a restart (`kube.start()` again) keeps the address
    store = SqliteEventStore(tmp_path / "events.db")
    await store.open()
    emitter = Emitter(store, InProcessBus(), Metrics())
    await emitter.start()
    r = Rig(tmp_path, kube, store, emitter)
    try:
        yield r
    finally:
        for m in r.managers:
            await m.stop()
        for k in r.keepers:
            await k.close(release=False)
        await emitter.close()
        await store.close()
        with contextlib.suppress(Exception):
            await kube.stop()


def task_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "caliban.caliban-ai.dev/v1alpha1",
        "kind": "CalibanTask",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"workspaceRef": {"name": WS}, "task": {"prompt": name}},
    }


async def set_phase(client: httpx.AsyncClient, name: str, phase: str) -> None:
    r = await client.patch(
        f"{TASKS_PATH}/{name}/status",
        json={"status": {"phase": phase}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert r.status_code == 200, r.text


# --- woken by the watch -------------------------------------------------------------------


async def test_a_watched_change_is_polled_at_once_not_at_the_timer(rig: Rig) -> None:
    manager = rig.manager(FleetConfig(poll_interval=30.0, poll_idle_backoff=1.0))
    await manager.start(poll=True)
    polls = manager.metrics

    async def statuses(agent_id: str) -> list[str]:
        return [e.kind.to.value for e in await rig.events("status_changed", agent_id)]  # type: ignore[attr-defined]

    async with httpx.AsyncClient(base_url=rig.kube.url) as client:
        await wait_until(lambda: polls.get("repos_polled") >= 1, 5, what="the first poll")
        cache = manager.provider.cache  # type: ignore[attr-defined]
        await wait_until(lambda: len(rig.kube.store.watchers) == 1, 5, what="the watch")
        r = await client.post(TASKS_PATH, json=task_body("ct-a"))
        assert r.status_code == 201, r.text
        await wait_until(lambda: "ct-a" in manager._slots, 3, what="the new CR polled")
        await set_phase(client, "ct-a", "Running")
        await wait_until(
            lambda: statuses("ct-a"), 3, what="the status change recorded, well before 30 s"
        )
        assert await statuses("ct-a") == ["running"]
        await set_phase(client, "ct-a", "Failed")
        await wait_until(
            lambda: (
                manager._slots["ct-a"].status is not None
                and manager._slots["ct-a"].status.value == "failed"
            ),
            3,
        )
        assert await statuses("ct-a") == ["running", "failed"]
        # A burst of writes at once: twenty watch events, a poll or two (coalesced).
        before = polls.get("repos_polled")
        for i in range(20):
            body = task_body(f"ct-burst-{i:02d}")
            body["metadata"]["uid"] = f"uid-{i}"
            rig.kube.store.put(TASKS, body, "ADDED")
        await wait_until(lambda: all(f"ct-burst-{i:02d}" in manager._slots for i in range(20)), 3)
        assert polls.get("repos_polled") - before <= 3
        assert cache.lists == 1  # all of it through the watch


# --- a new observer's health baseline -------------------------------------------------------


async def test_a_new_observer_records_an_outage_that_began_or_ended_in_the_gap_once(
    rig: Rig,
) -> None:
    a, b = rig.replica("A"), rig.replica("B")
    for m in (a, b):
        await m.start(poll=False)
    key = workspace_key(WS)

    async def health() -> list[str]:
        return [e.kind.state.state for e in await rig.events("repo_health", f"repo:{WS}")]  # type: ignore[attr-defined]

    async def hand_over(old: FleetManager, new: FleetManager) -> None:
        await old.ownership.release(key)  # the old observer is gone
        await new._poll(WS)
        assert new.ownership.owns(key)
        await rig.emitter.flush()

    await a._poll(WS)  # A observes: healthy, nothing to record
    await b._poll(WS)  # B keeps its own view silently
    assert a.ownership.owns(key) and not b.ownership.owns(key)

    # 1. The outage begins while A, still holding the lease, records nothing (it is dying);
    # B sees it, silently. B takes over: the stored baseline (nothing: healthy) says record it.
    await rig.down()
    await b._poll(WS)
    assert await health() == []
    await hand_over(a, b)
    assert await health() == ["unreachable"]
    await b._poll(WS)  # still down: not recorded again
    assert await health() == ["unreachable"]

    # 2. The outage ends in the gap: A sees it (silently, B holds the lease) and takes over
    # with its own view healthy all along; the stored baseline says unreachable: recorded.
    await rig.kube.start()
    await a._poll(WS)
    assert await health() == ["unreachable"]
    await hand_over(b, a)
    assert await health() == ["unreachable", "healthy"]

    # 3. B's view (healthy) lags what A recorded (a new outage): B takes over while still
    # down, and does not record the outage again.
    await b._poll(WS)  # healthy, silently
    await rig.down()
    await a._poll(WS)  # A records it
    assert await health() == ["unreachable", "healthy", "unreachable"]
    await hand_over(a, b)
    await b._poll(WS)
    assert await health() == ["unreachable", "healthy", "unreachable"]
