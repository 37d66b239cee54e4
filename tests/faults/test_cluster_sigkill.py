"""Three prosperod replica *processes* on one PostgreSQL database, against a fake caliband
process: SIGKILL the replica that drives a streaming agent at >= 10 random moments (a new
replica takes the dead one's place each time). Asserts that another replica holds the agent's
lease after a kill within 1.5 x TTL typically (the median) and 4 x TTL always (see the end);
and per agent, over the whole run: seqs 1..N, 0
duplicated events, 0 silent loss against the uncut normalisation of its transcript, exactly one
agent_finished, whoever wrote each part.

Beside them a supervised, interactive ACP agent (tests/faults/acp_operator.py) is steered only
through replicas that do not drive it: its permission request is answered and every input sent
through a non-owner (the relay carries them to the owner). The first kill hits its owner mid-turn;
the run must record that turn `turn_lost` exactly once, rejoin the session on the new owner, never
prompt a turn twice, and go on being driven by one owner at a time."""

from __future__ import annotations

import asyncio
import random
import signal
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
import pytest

from prospero.core.store.postgres.events import PostgresEventStore
from prospero.core.wire.control import AgentRecord
from prospero.testkit.faults import FaultPlan, Scenario, ScenarioAgent, ScriptSpec, wire_lines
from prospero.types.events import FleetEvent
from tests.faults.acp_operator import CHUNKS, TERMINAL, AcpOperator, acp_script, check_acp
from tests.faults.history import check_run, report
from tests.faults.procs import Fleet, fake_fleet, poll, transcript
from tests.support import wait_until

SEED = 1212
KILLS = 10
REPLICAS = 3
TTL = 2.0
BEAT_MS = 500
PACE = 0.006  # seconds per line: a 9,000-line run streams for ~54 s


def scenario() -> Scenario:
    # Long enough that the agents are still streaming when the 10th kill lands on a loaded
    # machine: each kill costs a takeover (~TTL) plus the wait for its moment (CI measured ~4.5 s
    # a kill; at 7,000 lines the agents ended after 9).
    long = ScriptSpec(kind="long", n=9000, per_turn=500)
    return Scenario(
        agents=(
            ScenarioAgent(prompt="plain", script=long, plan=FaultPlan(line_delay=PACE)),
            ScenarioAgent(
                prompt="cut", script=long, plan=FaultPlan(line_delay=PACE, cut_every=900)
            ),
            ScenarioAgent(
                prompt="short",
                script=ScriptSpec(kind="long", n=1500, per_turn=300),
                plan=FaultPlan(line_delay=PACE),
            ),
        )
    )


@dataclass
class Replica:
    replica_id: str
    proc: asyncio.subprocess.Process
    url: str


@dataclass
class Rig:
    fleet: Fleet
    dsn: str
    replicas: dict[str, Replica] = field(default_factory=dict)
    started: int = 0
    conn: asyncpg.Connection | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def root(self) -> str:
        return self.fleet.root

    async def start_replica(self) -> Replica:
        """A new replica (a new id, its own data dir) on the shared database."""
        self.started += 1
        rid = f"r{self.started}"
        proc, url = await self.fleet.start_prosperod(
            rid, "--data-dir", str(self.fleet.tmp / f"data-{rid}"), "--allow-acp",
            "--database-url", self.dsn, "--replica-id", rid,
            "--lease-ttl-secs", str(TTL), "--heartbeat-interval-ms", str(BEAT_MS),
        )  # fmt: skip
        replica = Replica(rid, proc, url)
        self.replicas[rid] = replica
        return replica

    async def kill(self, rid: str) -> None:
        replica = self.replicas.pop(rid)
        replica.proc.send_signal(signal.SIGKILL)
        await replica.proc.wait()

    async def records(self) -> dict[str, AgentRecord]:
        return await self.fleet.records()

    async def holder(self, key: str) -> str | None:
        # One connection for the whole run (a new one per look costs a server process).
        if self.conn is None or self.conn.is_closed():
            self.conn = await asyncpg.connect(self.dsn)
        async with self.lock:
            return await self.conn.fetchval(  # type: ignore[no-any-return]
                "SELECT owner FROM leases WHERE key = $1 AND expires_at > now()", key
            )


@pytest.fixture
async def rig(monkeypatch: pytest.MonkeyPatch, pg_dsn: str) -> AsyncIterator[Rig]:
    async with fake_fleet(
        monkeypatch, scenario(), stop=signal.SIGTERM, acp_script=acp_script()
    ) as fleet:
        rig = Rig(fleet, pg_dsn)
        try:
            yield rig
        finally:
            if rig.conn is not None:
                await rig.conn.close()


@pytest.mark.timeout(300)
async def test_sigkill_the_owner_replica_at_random_moments(rig: Rig) -> None:
    rng = random.Random(SEED)
    for _ in range(REPLICAS):
        await rig.start_replica()
    first = next(iter(rig.replicas.values()))
    spawned: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=first.url, timeout=20) as c:
        r = await c.post("/api/workspaces", json={"name": "app", "root": rig.root})
        assert r.status_code == 201, r.text
        for prompt in ("plain", "cut", "short"):
            r = await c.post(
                "/api/workspaces/app/agents", json={"prompt": f"{prompt} go", "isolation": "shared"}
            )
            assert r.status_code in (200, 201), r.text
            spawned[str(r.json()["agent_id"])] = prompt
        r = await c.post(
            "/api/workspaces/app/agents",
            json={"prompt": "acp go", "isolation": "shared", "drive_protocol": "acp",
                  "posture": "supervised", "interactive": True},
        )  # fmt: skip
        assert r.status_code == 201, r.text
        acp = str(r.json()["agent_id"])
    op = AcpOperator(acp, lambda: {k: v.url for k, v in rig.replicas.items()}, rig.holder)
    decision: dict[str, Any] = {}

    async def asked() -> bool:
        nonlocal decision
        async with httpx.AsyncClient(base_url=first.url, timeout=20) as c:
            r = await c.get("/api/decisions", params={"agent": acp, "state": "pending"})
        found = r.json()
        decision = found[0] if found else {}
        return bool(found)

    await wait_until(asked, 30, interval=0.05, what="the ACP agent's permission request")
    await op.answer(decision["id"], within=30)

    async def acp_has(text: str) -> bool:
        return text in "".join(e["kind"].get("chunk", "") for e in await op.events())

    await wait_until(lambda: acp_has("T0.done"), 30, interval=0.05, what="the allowed edit")
    driving = asyncio.create_task(op.drive())
    t0 = time.monotonic()
    kill_log: list[str] = []
    takeovers: list[float] = []
    starting: list[asyncio.Task[Replica]] = []
    while len(kill_log) < KILLS:
        recs = await rig.records()
        live = [rec for a, rec in recs.items() if a in spawned and not rec.status.terminal]
        if not live:
            break
        # The first kill hits the ACP agent's owner mid-turn; later ones pick at random.
        target_id = acp if not kill_log else rng.choice([*(r.id for r in live), acp])

        async def owned(agent: str = target_id) -> str | None:
            owner = await rig.holder(agent)
            return owner if owner in rig.replicas else None

        await wait_until(owned, 20, interval=0.02, what=f"{target_id} driven")
        if target_id == acp:
            # Mid-turn: some chunks of the turn in flight are stored, its end is not.
            chunk = rng.randint(1, CHUNKS - 3)

            async def mid_turn(j: int = chunk) -> bool:
                events = await op.events()
                ended = sum(e["kind"]["kind"] in TERMINAL for e in events)
                text = "".join(e["kind"].get("chunk", "") for e in events)
                return op.sent >= 1 and ended == op.sent and f"T{op.sent}.{j} " in text

            await wait_until(mid_turn, 60, interval=0.05, what="the ACP agent mid-turn")
        else:
            target = recs[target_id]
            # Let it stream a random stretch first.
            mark = len(transcript(target)) + rng.randint(20, 150)
            await poll(
                lambda t=target, m=mark: (
                    len(transcript(t)) >= m or any(b'"RunEnd"' in ln for ln in transcript(t)[-1:])
                ),
                60,
                "agent progress",
            )
        owner = await owned()
        assert owner is not None
        killed_at = time.monotonic()
        await rig.kill(owner)
        # A new replica takes the dead one's place (it joins whenever it is up).
        starting.append(asyncio.create_task(rig.start_replica()))

        async def taken_over(agent: str = target_id, dead: str = owner) -> bool:
            now_owner = await rig.holder(agent)
            if now_owner is not None and now_owner != dead:
                return True
            return (await rig.records())[agent].status.terminal  # ended meanwhile: nothing to adopt

        await wait_until(taken_over, 30, interval=0.02, what="takeover")
        took = time.monotonic() - killed_at
        if not (await rig.records())[target_id].status.terminal:
            takeovers.append(took)
        kill_log.append(f"kill {len(kill_log) + 1}: {owner} (driving {target_id}), {took:.2f}s")
    await asyncio.gather(*starting)
    assert len(kill_log) >= KILLS, f"agents ended after {len(kill_log)} kills"
    op.stop.set()
    await asyncio.wait_for(driving, 30)
    await op.end(within=60)
    url = next(iter(rig.replicas.values())).url

    async def caught_up() -> bool:
        now = await rig.records()
        if not all(now[a].status.terminal for a in [*spawned, acp]):
            return False
        async with httpx.AsyncClient(base_url=url, timeout=20) as c:
            for a in [*spawned, acp]:
                r = await c.get(f"/api/agents/{a}/events")
                if r.status_code != 200 or not any(
                    e["kind"]["kind"] == "agent_finished" for e in r.json()
                ):
                    return False
        return True

    await wait_until(caught_up, 120, interval=0.2, what="every agent finished and stored")
    elapsed = time.monotonic() - t0
    recs = await rig.records()
    store = PostgresEventStore(rig.dsn)
    await store.open()
    try:
        histories: dict[str, list[FleetEvent]] = {a: await store.replay(a) for a in spawned}
    finally:
        await store.close()
    totals = {"agents": len(spawned), "events": 0, "duplicates": 0, "silent_loss": 0,
              "seq_holes": 0, "gaps": 0}  # fmt: skip
    problems: list[str] = []
    sc = scenario()
    for a, prompt in spawned.items():
        lines = transcript(recs[a])
        entry = sc.entry(f"{prompt} go")
        assert entry is not None
        assert lines == wire_lines(entry.script.build(), entry.plan), f"{a}: transcript"
        run = check_run(f"{a} ({prompt})", histories[a], lines)
        totals["events"] += run.events
        totals["duplicates"] += run.duplicates
        totals["silent_loss"] += run.silent_loss
        totals["seq_holes"] += run.seq_holes
        totals["gaps"] += run.gaps
        if run.problem is not None:
            problems.append(run.problem)
    async with httpx.AsyncClient(base_url=url, timeout=20) as c:
        acp_events = (await c.get(f"/api/agents/{acp}/events")).json()
        decisions = (await c.get("/api/decisions", params={"agent": acp})).json()
    problems += check_acp(acp_events)
    acp_kinds = [e["kind"]["kind"] for e in acp_events]
    lost = acp_kinds.count("turn_lost")
    if lost < 1:
        problems.append("acp: the kill mid-turn left no turn_lost")
    if [(d["id"], d["state"], d["option_id"]) for d in decisions] != [
        (decision["id"], "decided", "allow-once")
    ]:
        problems.append(f"acp: decisions {decisions}")
    if "T0.done" not in "".join(e["kind"].get("chunk", "") for e in acp_events):
        problems.append("acp: the answer given through a non-owner did not reach the agent")
    worst = max(takeovers, default=0.0)
    counts = " ".join(f"{k}={v}" for k, v in totals.items())
    summary = (
        f"FAULT-SUITE cluster-sigkill: replicas={REPLICAS} kills={len(kill_log)} {counts} "
        f"ttl={TTL}s takeover_max={worst:.2f}s elapsed={elapsed:.1f}s "
        f"acp_turns={sum(k in TERMINAL for k in acp_kinds)} acp_turns_lost={lost} "
        f"acp_events={len(acp_events)} acp_routed={len(op.routed)}"
    )
    print()
    for k in kill_log:
        print("  ", k)
    for p in problems:
        print("  FAIL", p)
    report(summary)
    assert not problems, summary + "\n" + "\n".join(problems)
    # A takeover is the dead owner's lease expiring (<= TTL after the kill) plus a survivor's
    # next try: typically 1.6-2.0 s here. Some kills take longer (3.4-6.5 s measured on
    # 2026-12-02, on the tree before that day's work too: 2.96 and 4.54 s), when the survivor
    # that would take the agent stands back from it for a TTL (it lost that lease under load
    # earlier, core/ownership.py) and the replica starting in the dead one's place is not up
    # yet. So: the typical takeover within the lease bound, every one within 4 x TTL.
    typical = statistics.median(takeovers) if takeovers else 0.0
    assert typical <= 1.5 * TTL, summary + f" median={typical:.2f}s"
    assert worst <= 4 * TTL, summary
