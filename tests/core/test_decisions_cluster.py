"""DecisionService with `clustered=True` (several replicas on one decision store, ADR 0012):
no orphans taken at start (another replica's pending decision is live there), the takeover
cancel of what a dead owner left pending (`cancel_stored`: exactly one resolver wins), policies
read through to the store, and an agent's session rules forgotten on takeover. Two services on
one SQLite file stand in for two replicas on one database; the driver-level takeover is in
tests/core/test_acp_resume.py and the two-replica HTTP one in tests/api/test_cluster_decisions.py.
"""

from __future__ import annotations

import asyncio

from prospero.core.decisions import BY_TAKEOVER
from prospero.core.drivers.acp.driver import STOPPED_MID_TURN
from prospero.core.drivers.acp.resume import AcpResumeState
from prospero.core.drivers.base import DriverExit
from prospero.core.permissions import (
    PermissionOption,
    PermissionRequest,
    PermissionToolCall,
    StoredDecisions,
)
from prospero.core.store.decisions import SessionRule
from prospero.core.store.sqlite.decisions import SqliteDecisionStore
from prospero.testkit import acp_scripts as S
from prospero.types.decisions import Decision, PolicyPatch, PolicyRule, WorkspacePolicy
from prospero.types.events import DecisionOption, DecisionToolCall, TurnLost
from tests.core.acp_support import MemoryCursorStore
from tests.core.test_acp_resume import hard_stop
from tests.core.test_decisions import Env, T, ask_turn, env, pending_of
from tests.support import wait_until

__all__ = ["env"]  # the shared fixture

OPTS = (PermissionOption("y", "Yes", "allow_once"), PermissionOption("n", "No", "reject_once"))
REASON = "the replica driving the agent stopped mid-turn; turn 0 was lost"


def request(tool_id: str = "t1", agent_id: str = "ag", session: str = "s1") -> PermissionRequest:
    return PermissionRequest(
        agent_id=agent_id,
        session_id=session,
        tool_call=PermissionToolCall(id=tool_id, title="Edit", kind="edit"),
        options=OPTS,
        posture="supervised",
        workspace="ws",
    )


def stored_pending(decision_id: str, agent_id: str = "ag", tool_id: str = "t9") -> Decision:
    """A decision another replica asked (pending in the shared store, live nowhere here)."""
    return Decision(
        id=decision_id,
        agent_id=agent_id,
        workspace="ws",
        session_id="s1",
        turn=0,
        tool_call=DecisionToolCall(id=tool_id, title="Edit", kind="edit"),
        options=[DecisionOption(id="y", label="Yes", kind="allow_once")],
        created_at="2026-12-01T00:00:00+00:00",
        posture="supervised",
    )


async def test_a_replica_starting_leaves_another_replicas_pending_decision_alone(
    env: Env,
) -> None:
    a = await env.service(clustered=True)
    ask = asyncio.create_task(a.decide(request()))
    [d] = await pending_of(a)
    # A second replica boots on the same store with a grace that would have expired by now.
    b = await env.service(clustered=True, rejoin_grace=0.0)
    assert b._orphans == {} and b._grace_task is None
    assert await b.cancel_agent("ag", "not ours") == 0  # nothing of it is b's to end
    assert (await b.get(d.id)).state == "pending"
    # The owner still answers it.
    await a.decide_by_human(d.id, "y", by="alice")
    assert (await asyncio.wait_for(ask, T)).option_id == "y"
    assert (await b.get(d.id)).decided_by == "alice"


async def test_standalone_start_still_holds_the_previous_runs_decisions_as_orphans(
    env: Env,
) -> None:
    store = SqliteDecisionStore(env.db)
    await store.open()
    await store.insert(stored_pending("dec-left"))
    await store.close()
    svc = await env.service(rejoin_grace=30.0)
    assert list(svc._orphans) == ["dec-left"]
    # cancel_stored is the clustered takeover rule: standalone keeps the rejoin grace.
    assert await svc.cancel_stored("ag", REASON) == 0
    assert (await svc.get("dec-left")).state == "pending"


async def test_cancel_stored_cancels_only_what_is_not_live_here(env: Env) -> None:
    svc = await env.service(clustered=True)
    assert isinstance(svc, StoredDecisions)
    await svc.store.insert(stored_pending("dec-old"))
    await svc.store.insert(stored_pending("dec-other", agent_id="someone-else"))
    ask = asyncio.create_task(svc.decide(request("t1")))
    await wait_until(lambda: svc.pending_count() == 1, T, what="the live ask")
    [live] = [d for d in await svc.query(state="pending") if svc.is_live(d.id)]
    before = len(env.stream.resolved())

    assert await svc.cancel_stored("ag", REASON) == 1
    old = await svc.get("dec-old")
    assert (old.state, old.decided_by, old.note) == ("cancelled", BY_TAKEOVER, REASON)
    [res] = env.stream.resolved()[before:]
    assert (res.id, res.state, res.by, res.note) == ("dec-old", "cancelled", "takeover", REASON)
    assert [(a, k.kind) for _r, a, k in env.stream.emitted[-1:]] == [("ag", "decision_resolved")]
    assert (await svc.get(live.id)).state == "pending" and svc.is_live(live.id)
    assert (await svc.get("dec-other")).state == "pending"
    assert await svc.cancel_stored("ag", REASON) == 0  # once
    await svc.decide_by_human(live.id, "n", by="bob")
    assert (await asyncio.wait_for(ask, T)).option_id == "n"


async def test_two_replicas_cancelling_the_same_stored_decision_exactly_one_wins(
    env: Env,
) -> None:
    a = await env.service(clustered=True)
    b = await env.service(clustered=True)
    for i in range(5):
        await a.store.insert(stored_pending(f"dec-{i}", tool_id=f"t{i}"))
    counts = await asyncio.gather(
        *(s.cancel_stored("ag", REASON) for s in (a, b, a, b)), return_exceptions=True
    )
    assert all(isinstance(n, int) for n in counts), counts
    assert sum(n for n in counts if isinstance(n, int)) == 5
    resolved = [r.id for r in env.stream.resolved()]
    assert sorted(resolved) == [f"dec-{i}" for i in range(5)]  # each announced once
    assert all(d.decided_by == BY_TAKEOVER for d in await a.query(agent_id="ag"))


async def test_clustered_policies_are_read_through_to_the_shared_store(env: Env) -> None:
    a = await env.service(clustered=True)
    b = await env.service(clustered=True)
    assert (await b.policy("ws")).posture is None  # read (and, standalone, cached) before
    await a.set_policy("ws", WorkspacePolicy(posture="supervised", timeout_s=7))
    seen = await b.policy("ws")
    assert (seen.posture, seen.timeout_s) == ("supervised", 7)
    assert await b.default_posture("ws") == "supervised"
    await b.patch_policy("ws", PolicyPatch(rules=[PolicyRule(action="deny", kind="execute")]))
    mine = await a.policy("ws")
    assert (mine.posture, mine.timeout_s, [r.action for r in mine.rules]) == (
        "supervised",
        7,
        ["deny"],
    )


async def test_standalone_policies_stay_cached(env: Env) -> None:
    a = await env.service()
    b = await env.service()
    assert (await b.policy("ws")).posture is None
    await a.set_policy("ws", WorkspacePolicy(posture="supervised"))
    assert (await a.policy("ws")).posture == "supervised"
    assert (await b.policy("ws")).posture is None  # one writer per store: its cache holds


async def test_takeover_forgets_the_agents_cached_session_rules(env: Env) -> None:
    old_owner = await env.service(clustered=True)
    new_owner = await env.service(clustered=True)
    tc = DecisionToolCall(id="c", title="Edit", kind="edit")
    # The new owner drove the agent once before (its rules for the session are cached) ...
    assert await new_owner.session_rules.find("ag", "s1", tc) is None
    await new_owner.session_rules.find("other", "s1", tc)
    # ... then the old owner stored an always-rule for it.
    rule = SessionRule("ag", "s1", "edit", "Edit", "allow", "allow_always", "dec-1", "now")
    await old_owner.store.add_session_rule(rule)
    assert await new_owner.session_rules.find("ag", "s1", tc) is None  # still cached
    assert await new_owner.cancel_stored("ag", REASON) == 0
    assert await new_owner.session_rules.find("ag", "s1", tc) == rule
    ask = await asyncio.wait_for(new_owner.decide(request("t5")), T)  # answered by the rule
    assert (ask.decision, ask.option_id, ask.by) == ("selected", "y", "rule")
    assert ("other", "s1") in new_owner.session_rules._loaded  # other agents kept

    async def recorded() -> bool:
        return any(d.decided_by == "rule" for d in await new_owner.query(agent_id="ag"))

    await wait_until(recorded, T, what="the rule's answer stored")


async def test_the_new_owner_cancels_the_lost_turns_decision_then_drives_the_agent(
    env: Env,
) -> None:
    """Driver level: the owner dies (hard stop) while its agent's permission request is
    pending; the replica that takes the agent over rejoins the session (session/load),
    cancels the decision by `takeover` naming the lost turn, records `turn_lost` once, and
    drives the next turn."""
    cursors = MemoryCursorStore()
    script = S.AcpScript(turns=[ask_turn(), [S.text("again."), S.stop("end_turn")]])
    a = await env.service(clustered=True)
    d1, peer, target = await env.agent(script, a, interactive=True, cursor_store=cursors)
    t1 = asyncio.create_task(d1.run())
    [d] = await pending_of(a)
    a.begin_shutdown()  # a SIGKILL resolves nothing: the ask stays pending in the store
    hard_stop(d1, t1)
    await asyncio.gather(t1, return_exceptions=True)
    state = AcpResumeState.load(cursors.data[target.agent_id])
    assert state is not None and state.in_flight == 0
    assert (await a.get(d.id)).state == "pending"
    before = len(env.stream.events)

    b = await env.service(clustered=True)
    d2, _, _ = await env.agent(
        script, b, interactive=True, peer=peer, agent_id=target.agent_id, cursor_store=cursors
    )
    t2 = asyncio.create_task(d2.run())
    await wait_until(lambda: d2.resumed == 1, T, what="rejoined with session/load")
    assert peer.agent.loads == [d1.session_id] and d2.session_id == d1.session_id
    stored = await b.get(d.id)
    note = "the replica driving the agent stopped mid-turn; turn 0 was lost"
    assert (stored.state, stored.decided_by, stored.note) == ("cancelled", "takeover", note)
    new = env.stream.kinds()[before:]
    assert new.index("decision_resolved") < new.index("turn_lost")
    [res] = env.stream.resolved()
    assert (res.id, res.by, res.note) == (d.id, "takeover", note)
    await d2.send_input("go on")
    await wait_until(lambda: "turn_finished" in env.stream.kinds()[before:], T)
    await d2.end_input()
    assert await asyncio.wait_for(t2, T) is DriverExit.finished
    [lost] = [e for e in env.stream.events if isinstance(e, TurnLost)]
    assert (lost.turn, lost.reason) == (0, STOPPED_MID_TURN)
    assert peer.agent.prompts == ["do the thing", "go on"]  # the lost turn never re-sent
    assert "again." in env.stream.stdout()


async def test_asks_left_by_a_clean_shutdown_are_cancelled_by_the_next_owner(env: Env) -> None:
    """A replica that stops cleanly leaves its abandoned asks pending (its turn ends); the
    replica that drives the agent next cancels them, naming no lost turn."""
    cursors = MemoryCursorStore()
    script = S.AcpScript(turns=[ask_turn()])
    a = await env.service(clustered=True)
    d1, peer, target = await env.agent(script, a, interactive=True, cursor_store=cursors)
    t1 = asyncio.create_task(d1.run())
    [d] = await pending_of(a)
    a.begin_shutdown()
    await d1.close()
    await asyncio.wait_for(t1, T)
    state = AcpResumeState.load(cursors.data[target.agent_id])
    assert state is not None and state.in_flight is None
    assert (await a.get(d.id)).state == "pending"

    b = await env.service(clustered=True)
    d2, _, _ = await env.agent(
        script, b, interactive=True, peer=peer, agent_id=target.agent_id, cursor_store=cursors
    )
    t2 = asyncio.create_task(d2.run())
    await wait_until(lambda: d2.resumed == 1, T, what="rejoined with session/load")
    stored = await b.get(d.id)
    assert (stored.state, stored.decided_by, stored.note) == (
        "cancelled",
        "takeover",
        "the replica driving the agent stopped while the decision was pending",
    )
    await d2.end_input()
    assert await asyncio.wait_for(t2, T) is DriverExit.finished
    assert [r.id for r in env.stream.resolved()] == [d.id]
