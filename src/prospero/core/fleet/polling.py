"""The FleetManager's poll loop and what a poll does: list a workspace's agents through the
provider, diff the listing into lifecycle events (discovered, status changed, gone), start or
nudge drivers, and keep the workspace's health. Quiet workspaces are polled less often
(`FleetConfig.poll_idle_backoff` / `poll_quiet_after`); any activity resets them (`_touch`). A
provider with push (k8s) has a workspace polled as soon as it reports a change for it
(`_pushed_change`); the timer stays the fallback."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import orjson

from prospero.core import metrics as m
from prospero.core.aio import wait_for
from prospero.core.errors import ProsperoError
from prospero.core.fleet.catchup import FirstSight, first_sight
from prospero.core.fleet.meta import drivable, effective_status
from prospero.core.fleet.records import ListedAgent
from prospero.core.fleet.state import AgentSlot, FleetState
from prospero.core.ownership import workspace_key
from prospero.types.events import (
    AgentDiscovered,
    AgentGone,
    RepoHealth,
    StatusChanged,
    stream_key_for,
)
from prospero.types.model import (
    AgentStatus,
    Healthy,
    RegisteredWorkspace,
    Unreachable,
    WorkspaceHealth,
)

log = logging.getLogger("prospero.core.fleet.manager")  # as before the split

# What a new lifecycle writer reads of its workspace's agents (`_rebase_lifecycle`).
REBASE_KINDS = ("agent_spawned", "agent_discovered", "status_changed", "agent_gone")
# Clustered, an agent first listed here is announced no sooner than this many seconds later
# (and at least one poll later), if nobody has by then (`_discover_pending`). A count of polls
# is no bound since polls follow the watch's pushes: a spawning replica slower than one poll
# between creating the agent and storing `agent_spawned` had it announced as discovered too.
DISCOVER_GRACE = 2.0
ANNOUNCING_KINDS = ("agent_spawned", "agent_discovered")


class Polling(FleetState):
    async def _poll_loop(self) -> None:
        """When a workspace is due: reload the registry, poll the workspaces that are due, close
        stale drivers. A quiet workspace is due less often (`_interval`); one that becomes busy
        (`_touch`) is due again within `poll_interval`. With nothing due, the registry is still
        reloaded every `_registry_interval()` (workspaces registered by another writer of the
        store); an idle fleet wakes this loop only for those."""
        while not self._stopping:
            self._wake.clear()
            now = time.monotonic()
            try:
                await self._poll_due()
                timeout = min([self._registry_due, *self._due.values()]) - time.monotonic()
            except asyncio.CancelledError:
                raise
            except Exception:  # a poll cycle must never kill the loop
                log.exception("poll cycle failed")
                # A workspace whose poll failed stays due: retry in an interval, not at once.
                timeout = now + self.config.poll_interval - time.monotonic()
            with contextlib.suppress(TimeoutError):
                await wait_for(self._wake.wait(), max(0.0, timeout))

    def _registry_interval(self) -> float:
        return self.config.poll_interval * max(1.0, self.config.poll_idle_backoff)

    async def _poll_due(self) -> None:
        now = time.monotonic()
        timed = now >= self._registry_due or any(
            self._due.get(name, 0.0) <= now for name in self._workspaces
        )
        if not timed and not self._pushed:
            return  # woken early (`_touch` of a workspace already due soon): nothing to do
        if timed:  # a pushed change alone does not re-read the registry
            self._registry_due = now + self._registry_interval()
            await self._reload_registry()
        for name in list(self._workspaces):
            if self._stopping:
                return
            if self._due.get(name, 0.0) > time.monotonic() and name not in self._pushed:
                continue
            # Unmarked before the poll: a change pushed while it lists marks it again.
            self._pushed.discard(name)
            await self._poll(name)
            now = time.monotonic()
            self._due[name] = now + self._interval(name, now)
        self._pushed &= self._workspaces.keys()
        if timed:
            # Counted from the cycle's end: a workspace backed off to the same interval is
            # due first, and its poll re-reads the registry (one wakeup, not two).
            self._registry_due = time.monotonic() + self._registry_interval()
        self._close_stale_drivers()

    def _pushed_change(self, name: str) -> None:
        """The provider saw the workspace's agents change (`FleetProvider.on_changed`: the
        k8s watch): poll it at the loop's next turn, whatever its timer says. Coalesced: a
        burst of pushes only marks it and sets `_wake`, so it is one poll; one pushed while
        that poll lists marks it again, for one more (the listing may have missed it)."""
        if name in self._workspaces and not self._stopping:
            self._pushed.add(name)
            self._wake.set()

    def _touch(self, name: str) -> None:
        """Something happened in the workspace (an agent event, an API action, a driver run
        ended): poll it at the configured interval again, starting now."""
        now = time.monotonic()
        self._changed_at[name] = now
        due = self._due.get(name)
        if due is not None and due > now + self.config.poll_interval:
            self._due[name] = now + self.config.poll_interval
            self._wake.set()

    def _interval(self, name: str, now: float) -> float:
        """The workspace's next poll interval: `poll_interval` while anything changed in the
        last `poll_quiet_after` seconds or a terminal grace is running; after that half the
        time it has been quiet, up to `poll_interval * poll_idle_backoff`."""
        base = self.config.poll_interval
        cap = base * self.config.poll_idle_backoff
        quiet = now - self._changed_at.setdefault(name, now)
        if cap <= base or quiet < self.config.poll_quiet_after or self._grace_running(name):
            return base
        return min(cap, max(base, quiet / 2))

    def _grace_running(self, name: str) -> bool:
        return any(
            s.workspace == name
            and s.terminal_since is not None
            and s.task is not None
            and not s.task.done()
            for s in self._slots.values()
        )

    async def poll_once(self) -> None:
        await self._reload_registry()
        for name in list(self._workspaces):
            if self._stopping:
                return
            await self.poll_workspace(name)
        self._close_stale_drivers()

    async def poll_workspace(self, name: str) -> None:
        """Poll the workspace now (after an API action: it is busy from now on)."""
        self._touch(name)
        await self._poll(name)

    async def _poll(self, name: str) -> None:
        ws = self._workspaces.get(name)
        if ws is None:
            return
        lock = self._poll_locks.setdefault(name, asyncio.Lock())
        async with lock:
            self.metrics.inc(m.REPOS_POLLED, 1, (name,))
            term = await self._claim_lifecycle(name)
            health = self._health.get(name)
            try:
                records = await self.provider.list_agents(ws)
            except ProsperoError as e:  # FleetUnreachable, ProtocolError, ...
                self.metrics.inc(m.POLL_FAILURES, 1, (name,))
                if term is not None:
                    await self._rebase_health(name, term)
                await self._set_health(name, Unreachable(reason=str(e)))
                if not isinstance(health, Unreachable):
                    self._touch(name)
                return
            if term is not None:
                await self._rebase_health(name, term)
                await self._rebase_lifecycle(name, term)
            await self._set_health(name, Healthy())
            listed = self._listed.get(name)
            await self._reconcile(ws, records)
            if not isinstance(health, Healthy) or listed != self._listed.get(name):
                self._touch(name)

    async def _claim_lifecycle(self, name: str) -> int | None:
        """Take (or keep) the workspace's lifecycle lease: clustered, the replica holding it is
        the one that writes the events polls derive (discovered, status changes, gone, repo
        health) — upstream's fleet observer, for any backend; every replica still keeps its
        own view of the workspace. Returns the lease's epoch when this replica has not written
        under it yet (a new term: its view is to be rebased on the store first), else None."""
        try:
            lease = await self.ownership.try_acquire(workspace_key(name))
        except ProsperoError as e:
            log.warning("workspace %s: cannot take its lifecycle lease: %s", name, e)
            return None
        if lease is None or self._lifecycle_terms.get(name) == lease.epoch:
            return None
        return lease.epoch

    async def _rebase_lifecycle(self, name: str, epoch: int) -> None:
        """A new term as the workspace's lifecycle writer. While another replica wrote, this
        one kept its own view silently; the next diffs must start from what was recorded, not
        from that view: a change the previous writer recorded is not recorded again (this
        view may lag it), and one it never saw (made in the handover gap, while nobody held
        the lease) is recorded now. So each agent's status baseline becomes the `to` of its
        last stored `status_changed`, and an agent this replica saw go whose stream does not
        end its life with `agent_gone` gets one; one of which nothing is stored is announced
        as `_discover_pending` does. Standalone, this process always wrote them:
        nothing to rebase. On a store error the term is tried again at the next poll."""
        if not self.ownership.shared:
            self._lifecycle_terms[name] = epoch
            return
        slots = {a: s for a, s in self._slots.items() if s.workspace == name}
        keys = {stream_key_for(name, a): a for a in slots}
        recorded: dict[str, AgentStatus] = {}
        last: dict[str, str] = {}
        try:
            scan = await self.store.scan_kinds(list(keys), REBASE_KINDS) if keys else None
        except ProsperoError as e:
            log.warning("workspace %s: lifecycle not rebased on the store: %s", name, e)
            return
        for key, _seq, raw in scan.rows if scan is not None else ():
            with contextlib.suppress(orjson.JSONDecodeError, TypeError, ValueError, KeyError):
                kind = orjson.loads(raw)
                last[keys[key]] = kind["kind"]
                if kind["kind"] == "status_changed":
                    recorded[keys[key]] = AgentStatus(kind["to"])
        self._lifecycle_terms[name] = epoch
        for agent_id, slot in slots.items():
            if slot.record is None:
                if last.get(agent_id, "agent_gone") != "agent_gone":
                    await self.emitter.emit(name, agent_id, AgentGone())
            elif agent_id in recorded:
                slot.status = recorded[agent_id]
            elif agent_id not in last:  # nobody announced it: a later poll checks again
                self._defer_discovery(slot)

    async def _rebase_health(self, name: str, epoch: int) -> None:
        """A new term as the workspace's lifecycle writer (once per term, even while its
        listings fail): the health the next poll diffs against becomes the state of the
        workspace's last stored `repo_health` (none stored: no baseline, so an outage is
        recorded and a healthy workspace is not), not this replica's silent view. So an
        outage that began or ended in the handover gap is recorded once, and one the previous
        writer recorded is not recorded again. Standalone: nothing to rebase. On a store
        error the term is tried again at the next poll (this poll diffs against the view)."""
        if self._health_terms.get(name) == epoch:
            return
        if not self.ownership.shared:
            self._health_terms[name] = epoch
            return
        key = stream_key_for(name, "")
        try:
            scan = await self.store.scan_kinds([key], ("repo_health",))
        except ProsperoError as e:
            log.warning("workspace %s: health not rebased on the store: %s", name, e)
            return
        stored: WorkspaceHealth | None = None
        for _key, _seq, raw in scan.rows:  # ascending: the last one stands
            with contextlib.suppress(orjson.JSONDecodeError, TypeError, ValueError):
                stored = RepoHealth.model_validate(orjson.loads(raw)).state
        self._health_terms[name] = epoch
        if stored is None:
            self._health.pop(name, None)
        else:
            self._health[name] = stored

    def _writes_lifecycle(self, name: str) -> bool:
        return self.ownership.owns(workspace_key(name))

    async def _set_health(self, name: str, health: WorkspaceHealth) -> None:
        prev = self._health.get(name)
        self._health[name] = health
        if isinstance(health, Unreachable) and not isinstance(prev, Unreachable):
            log.warning("workspace %s: its caliband is unreachable: %s", name, health.reason)
        elif isinstance(prev, Unreachable) and isinstance(health, Healthy):
            log.info("workspace %s: its caliband is reachable again", name)
        if prev is not None and prev == health:
            return
        if prev is None and isinstance(health, Healthy):
            return
        if isinstance(prev, Unreachable) and isinstance(health, Unreachable):
            return  # still down; only transitions are events
        if self._writes_lifecycle(name):
            await self.emitter.emit(name, "", RepoHealth(state=health))

    async def _reconcile(self, ws: RegisteredWorkspace, records: list[ListedAgent]) -> None:
        prev = self._listed.get(ws.name, {})
        current = {r.id: r for r in records}
        self._listed[ws.name] = current
        # Seed the seq counters of every new agent's stream up front, all at once: emitting
        # to a new stream otherwise waits for one store round trip per agent, in series (and
        # each agent's driver only starts after its turn). The same goes for what the store
        # knows of them (metadata, history).
        new_ids = [r.id for r in records if r.id not in self._slots]
        if new_ids:
            await self.emitter.prepare([stream_key_for(ws.name, agent_id) for agent_id in new_ids])
        sights = await first_sight(self.store, self.agents, ws.name, new_ids) if new_ids else {}
        await self._discover_pending(ws.name, records)
        for rec in records:
            slot = self._slots.get(rec.id)
            if slot is not None and self._steady(slot, rec, prev.get(rec.id)):
                continue
            sight = sights.get(rec.id)
            if slot is None:
                slot = self._slots[rec.id] = AgentSlot(workspace=ws.name)
                slot.meta = sight.meta if sight is not None else None
                if self.ownership.shared:
                    self._defer_discovery(slot)  # `_discover_pending` decides
                elif (sight is None or not sight.seen_before) and self._writes_lifecycle(ws.name):
                    await self.emitter.emit(ws.name, rec.id, AgentDiscovered())
            await self._apply_record(ws, slot, rec, prev.get(rec.id), sight)
        for gone_id in set(prev) - set(current):
            slot = self._slots.get(gone_id)
            if slot is not None and slot.record is not None and slot.workspace == ws.name:
                slot.record = None
                if self._writes_lifecycle(ws.name):
                    await self.emitter.emit(ws.name, gone_id, AgentGone())
                await self._cancel_asks(gone_id, "the agent is gone")
                await self._close_driver(gone_id)

    @staticmethod
    def _defer_discovery(slot: AgentSlot) -> None:
        slot.discover_pending = True
        slot.discover_at = time.monotonic() + DISCOVER_GRACE

    async def _discover_pending(self, name: str, records: list[ListedAgent]) -> None:
        """Clustered, an agent first listed is announced at a poll `DISCOVER_GRACE` later, if
        by then nobody has: no `agent_spawned` or `agent_discovered` stored, no metadata
        saying Prospero spawned it. Another replica's spawn creates the agent before it
        records those (only the spawning replica's own poll lock keeps its polls out of that
        window), and another replica's driver may already have stored the agent's output and
        outcome (so "any event or metadata stored" does not tell that it was announced)."""
        now = time.monotonic()
        pending = [
            r.id
            for r in records
            if (s := self._slots.get(r.id)) is not None
            and s.discover_pending
            and s.discover_at <= now
        ]
        if not pending:
            return

        async def announced(agent_id: str) -> bool:
            meta, rows = await asyncio.gather(
                self.agents.get_meta(agent_id),
                self.store.replay(stream_key_for(name, agent_id), 0, 1, kinds=ANNOUNCING_KINDS),
            )
            slot = self._slots.get(agent_id)
            if meta is not None and slot is not None and slot.meta is None:
                # First listed here before its spawning replica stored this: without it an
                # ACP agent would never read as drivable here (no takeover, no relay).
                slot.meta = meta
                if slot.target is not None:
                    slot.target.meta = meta
            return (meta is not None and meta.spawned_here) or bool(rows)

        seen = await asyncio.gather(*(announced(a) for a in pending))
        for agent_id, was in zip(pending, seen, strict=True):
            self._slots[agent_id].discover_pending = False
            if not was and self._writes_lifecycle(name):
                await self.emitter.emit(name, agent_id, AgentDiscovered())

    @staticmethod
    def _steady(slot: AgentSlot, rec: ListedAgent, before: ListedAgent | None) -> bool:
        """Nothing for `_apply_record` to do: the same record object as the last listing (the
        provider did not even decode it again) and already applied, the agent running with
        its driver's run going. The common case of an idle fleet's poll, at ~0.3 µs."""
        return (
            rec is before
            and slot.record is rec
            and slot.terminal_since is None
            and slot.task is not None
            and not slot.task.done()
            and slot.status is not None
            and not slot.status.terminal
            and effective_status(rec, slot.meta) == slot.status
        )

    async def _apply_record(
        self,
        ws: RegisteredWorkspace,
        slot: AgentSlot,
        rec: ListedAgent,
        before: ListedAgent | None,
        sight: FirstSight | None,
    ) -> None:
        """One listed record: status diff (as the agent reads), driver start, terminal
        bookkeeping. `sight` is set the first time this process sees the agent."""
        old_status = slot.status
        if old_status is None:
            old = before or slot.record
            old_status = effective_status(old, slot.meta) if old is not None else None
        slot.record = rec
        slot.workspace = ws.name
        if slot.target is not None:
            # The provisional record at spawn has no session dir: drivers read it at use.
            slot.target.session_dir = slot.target.session_dir or rec.session_dir
            slot.target.working_dir = slot.target.working_dir or rec.working_dir
        status = effective_status(rec, slot.meta)
        slot.status = status
        if old_status is not None and old_status != status:
            if self._writes_lifecycle(ws.name):
                await self.emitter.emit(
                    ws.name,
                    rec.id,
                    StatusChanged.model_validate({"from": old_status, "to": status}),
                )
            if slot.driver is not None and slot.task is not None and not slot.task.done():
                # A driver waiting out a reconnect backoff looks again now: the worker may
                # be listening, or gone with its transcript complete (before the terminal
                # grace below closes the driver).
                slot.driver.nudge()
        elif before is not None and before.status != rec.status:
            if slot.driver is not None and slot.task is not None and not slot.task.done():
                slot.driver.nudge()
        if status.terminal:
            first = slot.terminal_since is None
            if first:
                slot.terminal_since = time.monotonic()
                await self._cancel_asks(rec.id, f"the agent is {status.value}")
            driver = slot.driver
            if (
                (first or slot.lease_refused)
                and driver is not None
                and not driver.finished
                and (slot.task is None or slot.task.done())
                and drivable(rec, slot.meta)
            ):
                # Its driver gave up (refused dials) before the run ended: one more run now
                # recovers the tail from the transcript, or concludes the run. A run refused
                # the agent's lease (clustered: a crashed replica's lease outlives it by up to
                # its TTL) is tried again at each poll, else the run is never concluded.
                slot.catchup = True
                self._ensure_driver(ws, rec)
            if sight is not None and not sight.finished and drivable(rec, slot.meta):
                # Ended while no prosperod watched: one run recovers (or concludes) it.
                slot.catchup = True
                self._ensure_driver(ws, rec)
            if slot.meta is not None and slot.meta.outcome is not None:
                await self._release_worker(ws, slot)
        else:
            slot.terminal_since = None
            if drivable(rec, slot.meta):
                self._ensure_driver(ws, rec)

    def _close_stale_drivers(self) -> None:
        """Close drivers of agents that turned terminal a while ago and never finished
        (killed or crashed workers: their stream will not come back)."""
        now = time.monotonic()
        for agent_id, slot in self._slots.items():
            if slot.terminal_since is None or slot.task is None or slot.task.done():
                continue
            if slot.catchup:
                since, grace = slot.catchup_started, self.config.catchup_grace
            else:
                since, grace = slot.terminal_since, self.config.terminal_grace
            if since is not None and now - since >= grace:
                task = asyncio.create_task(self._close_driver(agent_id, conclude=True))
                self._closing_tasks.add(task)
                task.add_done_callback(self._closing_tasks.discard)
