"""AutomationStore conformance (docs/automations.md): what every automation store backend
(SQLite, PostgreSQL) must do.

A test module subclasses `AutomationStoreConformance` and provides an
`automation_store_factory` fixture: an async callable that opens and returns a new handle on
the *same* backing database (calling it twice = a second replica, or a restart).

Pinned here: an automation round-trips field for field; names are unique (create and rename
raise DuplicateName, changing nothing); `webhook` follows the stored secret; `update` keeps
the secret and `last_fired`; `claim_run` fires a tick once — also when many callers race on
two handles — and sets `last_fired`, and history is bounded to the newest runs; `runs` is
newest first; `abandon_runs` fails only the runs still `firing` fired before the cut;
`claim_signature` accepts a signature once within the window, again after it;
`delete` takes runs and signatures with it; everything survives a reopen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from prospero.core.store.automations import AutomationStore, DuplicateName
from prospero.types.api import SpawnRequest
from prospero.types.automations import Automation, AutomationRun

AutomationStoreFactory = Callable[[], Awaitable[AutomationStore]]

T0 = "2026-01-01T00:00:00.000000+00:00"


def automation(id_: str = "au-1", name: str = "nightly", **kw: Any) -> Automation:
    data: dict[str, Any] = {
        "id": id_,
        "name": name,
        "workspace": "ws",
        "spawn": SpawnRequest(
            prompt='fix {{payload.issue.title}}\né "quoted"',
            drive_protocol="acp",
            posture="autonomous",
            model="m1",
            budget_usd=1.5,
            isolation="shared",
        ),
        "schedule": "0 3 * * *",
        "labels": {"team": "infra", "k": ""},
        "created_at": T0,
        "armed_at": T0,
    }
    data.update(kw)
    return Automation(**data)


def run(id_: str, automation_id: str = "au-1", tick: str | None = None, **kw: Any) -> AutomationRun:
    return AutomationRun(
        id=id_,
        automation_id=automation_id,
        trigger=kw.pop("trigger", "schedule"),
        tick=tick or id_,
        fired_at=kw.pop("fired_at", T0),
        **kw,
    )


class AutomationStoreConformance:
    async def test_round_trip_and_webhook_flag(
        self, automation_store_factory: AutomationStoreFactory
    ) -> None:
        s = await automation_store_factory()
        a = automation()
        await s.create(a, "sekrit")
        got = await s.get(a.id)
        assert got == a.model_copy(update={"webhook": True})
        assert await s.by_name("nightly") == got
        assert await s.secret(a.id) == "sekrit"
        b = automation("au-2", "adhoc", schedule=None, enabled=False)
        await s.create(b, None)
        assert [x.name for x in await s.all()] == ["adhoc", "nightly"]
        assert (await s.get("au-2")) == b
        assert await s.secret("au-2") is None
        assert await s.get("nope") is None and await s.by_name("nope") is None
        # reopen: all there
        s2 = await automation_store_factory()
        assert await s2.get(a.id) == got

    async def test_names_are_unique(self, automation_store_factory: AutomationStoreFactory) -> None:
        s = await automation_store_factory()
        await s.create(automation(), None)
        try:
            await s.create(automation("au-2"), None)
            raise AssertionError("duplicate name accepted")
        except DuplicateName:
            pass
        await s.create(automation("au-3", "other"), None)
        try:
            await s.update(automation("au-3", "nightly"))
            raise AssertionError("rename onto a taken name accepted")
        except DuplicateName:
            pass
        assert (await s.get("au-3")) is not None
        assert (await s.get("au-3")).name == "other"  # type: ignore[union-attr]
        assert [x.id for x in await s.all()] == ["au-1", "au-3"]

    async def test_update_keeps_secret_and_last_fired(
        self, automation_store_factory: AutomationStoreFactory
    ) -> None:
        s = await automation_store_factory()
        await s.create(automation(), "k1")
        assert await s.claim_run(run("r1", fired_at="2026-01-02T00:00:00.000000+00:00"))
        changed = automation(name="renamed", enabled=False, schedule=None)
        assert await s.update(changed)
        got = await s.get("au-1")
        assert got is not None
        assert (got.name, got.enabled, got.schedule, got.webhook) == ("renamed", False, None, True)
        assert got.last_fired == "2026-01-02T00:00:00.000000+00:00"
        assert await s.secret("au-1") == "k1"
        assert not await s.update(automation("au-9", "ghost"))
        assert await s.set_secret("au-1", "k2") and await s.secret("au-1") == "k2"
        assert await s.set_secret("au-1", None)
        assert (await s.get("au-1")).webhook is False  # type: ignore[union-attr]
        assert not await s.set_secret("au-9", "x")

    async def test_a_tick_fires_once_across_handles(
        self, automation_store_factory: AutomationStoreFactory
    ) -> None:
        s1, s2 = await automation_store_factory(), await automation_store_factory()
        await s1.create(automation(), None)
        tick = "2026-01-01T03:00+00:00"
        results = await asyncio.gather(
            *((s1 if i % 2 else s2).claim_run(run(f"r{i}", tick=tick)) for i in range(12))
        )
        assert sum(results) == 1
        runs = await s1.runs("au-1")
        assert len(runs) == 1 and runs[0].tick == tick and runs[0].state == "firing"
        assert not await s1.claim_run(run("r-ghost", automation_id="au-9"))
        assert await s2.claim_run(run("r-next", tick="2026-01-02T03:00+00:00"))

    async def test_finish_history_order_and_bound(
        self, automation_store_factory: AutomationStoreFactory
    ) -> None:
        s = await automation_store_factory()
        await s.create(automation(), None)
        for i in range(7):
            assert await s.claim_run(run(f"r{i}", trigger="manual"), history=5)
        await s.finish_run("r6", "spawned", agent_id="ag-1", error=None)
        await s.finish_run("r5", "failed", agent_id=None, error="budget_exceeded: no")
        runs = await s.runs("au-1")
        assert [r.id for r in runs] == ["r6", "r5", "r4", "r3", "r2"]
        assert (runs[0].state, runs[0].agent_id) == ("spawned", "ag-1")
        assert (runs[1].state, runs[1].error) == ("failed", "budget_exceeded: no")
        assert [r.id for r in await s.runs("au-1", limit=2)] == ["r6", "r5"]
        assert await s.get_run("r6") == runs[0]
        assert await s.get_run("r0") is None

    async def test_abandon_fails_only_old_firing_runs(
        self, automation_store_factory: AutomationStoreFactory
    ) -> None:
        s = await automation_store_factory()
        await s.create(automation(), None)
        late = "2026-01-01T00:10:00.000000+00:00"
        for id_, at in (("old", T0), ("old-done", T0), ("new", late)):
            assert await s.claim_run(run(id_, trigger="manual", fired_at=at))
        await s.finish_run("old-done", "spawned", agent_id="ag-1", error=None)
        assert await s.abandon_runs("2026-01-01T00:05:00.000000+00:00", "interrupted") == 1
        again = await automation_store_factory()  # another handle sees it
        got = {r.id: (r.state, r.agent_id, r.error) for r in await again.runs("au-1")}
        assert got == {
            "old": ("failed", None, "interrupted"),
            "old-done": ("spawned", "ag-1", None),
            "new": ("firing", None, None),
        }
        assert await s.abandon_runs("2026-01-01T00:05:00.000000+00:00", "interrupted") == 0

    async def test_signatures_once_per_window(
        self, automation_store_factory: AutomationStoreFactory
    ) -> None:
        s1, s2 = await automation_store_factory(), await automation_store_factory()
        await s1.create(automation(), "k")
        assert await s1.claim_signature("au-1", "ab" * 32, 1000.0, 300.0)
        assert not await s2.claim_signature("au-1", "ab" * 32, 1100.0, 300.0)
        assert await s2.claim_signature("au-2", "ab" * 32, 1100.0, 300.0)  # per automation
        assert await s2.claim_signature("au-1", "ab" * 32, 1301.0, 300.0)  # window passed
        both = await asyncio.gather(
            s1.claim_signature("au-1", "cd" * 32, 2000.0, 300.0),
            s2.claim_signature("au-1", "cd" * 32, 2000.0, 300.0),
        )
        assert sorted(both) == [False, True]

    async def test_delete_takes_runs_and_signatures(
        self, automation_store_factory: AutomationStoreFactory
    ) -> None:
        s = await automation_store_factory()
        await s.create(automation(), "k")
        assert await s.claim_run(run("r1"))
        assert await s.claim_signature("au-1", "ef" * 32, 10.0, 300.0)
        assert await s.delete("au-1")
        assert not await s.delete("au-1")
        assert await s.get("au-1") is None and await s.runs("au-1") == []
        await s.create(automation(), "k")  # the name is free again
        assert await s.claim_signature("au-1", "ef" * 32, 11.0, 300.0)
