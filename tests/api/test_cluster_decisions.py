"""Permission decisions across two prosperod replicas on one PostgreSQL database (whole HTTP
stacks in process, one fake caliband serving the scripted ACP agent): a replica that boots
leaves another replica's live pending decision alone; when the replica driving a supervised
ACP agent dies with a decision pending, the replica that takes the agent over rejoins the
session (session/load), records the lost turn once, cancels the decision with the reason and
drives the agent on."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from prospero.core.drivers.acp import registry
from tests.api.conftest import Stack, StackFactory
from tests.api.test_cluster_takeover import holder
from tests.api.test_decisions_api import acp_stack, kinds_of, of_kind, pending
from tests.support import wait_until

TTL = 1.0
BEAT = 0.25
T = 20.0


def clustered(replica: str, pg_dsn: str) -> dict[str, Any]:
    return {
        "replica_id": replica,
        "database_url": pg_dsn,
        "lease_ttl": TTL,
        "heartbeat_interval": BEAT,
    }


async def spawn_supervised(stack: Stack) -> str:
    body = {
        "prompt": "edit",  # the scripted agent's first turn asks to edit (ask_turn)
        "isolation": "shared",
        "drive_protocol": "acp",
        "posture": "supervised",
        "interactive": True,
    }
    r = await stack.client.post("/api/workspaces/ws/agents", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["agent_id"])


async def hard_crash(stack: Stack) -> None:
    """The replica dies as under SIGKILL: no lease renewed or released, no decision resolved,
    no driver closed (its ACP connection just drops), no more polls or HTTP."""
    rt = stack.runtime
    assert rt.manager is not None and rt.ownership is not None and rt.decisions is not None
    await rt.ownership.keeper.close(release=False)
    if rt.presence is not None:  # the process's presence lease too
        await rt.presence.close(release=False)
    rt.decisions.begin_shutdown()  # the asks its drivers abandon stay pending in the store
    relay = getattr(rt, "relay", None)  # calls routed to this replica go unanswered
    if relay is not None:
        with contextlib.suppress(Exception):
            await relay.close()
    manager = rt.manager
    manager._stopping = True
    if manager._poll_task is not None:
        manager._poll_task.cancel()
    tasks = [s.task for s in manager._slots.values() if s.task is not None and not s.task.done()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for s in manager._slots.values():
        if s.driver is not None:
            # One ACP driver per agent per process: the dead replica's no longer counts.
            registry.release(s.driver)
    await stack.server.stop()


async def test_a_booting_replica_leaves_a_live_pending_decision_of_another_alone(
    make_stack: StackFactory, pg_dsn: str
) -> None:
    a = await acp_stack(make_stack, **clustered("a", pg_dsn))
    agent = await spawn_supervised(a)
    [d] = await pending(a, agent)
    # Booting with a rejoin grace of 0: had it taken a's decision for an orphan of its own,
    # its grace task would cancel it at once.
    b = await make_stack(workspace=False, decision_rejoin_grace=0.0, **clustered("b", pg_dsn))
    assert b.runtime.decisions is not None
    assert b.runtime.decisions._orphans == {} and b.runtime.decisions._grace_task is None
    r = await b.client.get(f"/api/decisions/{d['id']}")
    assert r.status_code == 200 and r.json()["state"] == "pending"
    assert await holder(a, agent) == "a"
    # The owner still answers it, and the agent acts on the answer.
    r = await a.client.post(f"/api/decisions/{d['id']}", json={"option_id": "allow-once"})
    assert r.status_code == 200, r.text
    r = await a.client.post(f"/api/agents/{agent}/end-input")
    assert r.status_code in (200, 202, 204), r.text
    events = await a.wait_finished(agent, T)
    [res] = of_kind(events, "decision_resolved")
    assert (res["id"], res["state"], res["option_id"]) == (d["id"], "decided", "allow-once")
    assert [k["ok"] for k in of_kind(events, "tool_finished")] == [True]
    r = await b.client.get(f"/api/decisions/{d['id']}")
    assert r.json()["state"] == "decided"


async def test_takeover_cancels_the_dead_owners_pending_decision_and_drives_on(
    make_stack: StackFactory, pg_dsn: str
) -> None:
    a = await acp_stack(make_stack, **clustered("a", pg_dsn))
    agent = await spawn_supervised(a)
    [d] = await pending(a, agent)
    b = await make_stack(workspace=False, **clustered("b", pg_dsn))  # the same registry
    assert await holder(a, agent) == "a"
    listener = a.fakes["ws"].acp_listeners[agent]
    assert listener.agent is not None
    fake_agent = listener.agent

    await hard_crash(a)

    async def taken_over() -> bool:
        return await holder(b, agent) == "b"

    await wait_until(taken_over, 5 * TTL + 5.0, interval=0.05, what="takeover by b")
    await wait_until(lambda: len(fake_agent.loads) == 1, T, what="session/load by b")
    assert fake_agent.loads == [d["session_id"]]

    async def resolved() -> bool:
        r = await b.client.get(f"/api/decisions/{d['id']}")
        return bool(r.json()["state"] != "pending")

    # Cancelled as b loaded the agent's state, before it dialled the agent.
    await wait_until(resolved, T, interval=0.05, what="the decision resolved")
    got = (await b.client.get(f"/api/decisions/{d['id']}")).json()
    assert (got["state"], got["decided_by"]) == ("cancelled", "takeover")
    assert got["note"] == "the replica driving the agent stopped mid-turn; turn 0 was lost"

    # b drives the agent: a new turn (the scripted agent echoes it) completes.
    r = await b.client.post(f"/api/agents/{agent}/input", json={"text": "carry on"})
    assert r.status_code in (200, 202, 204), r.text

    async def second_turn_done() -> bool:
        return len(of_kind(await b.history(agent), "turn_finished")) == 1

    await wait_until(second_turn_done, T, interval=0.05, what="b's turn finished")
    r = await b.client.post(f"/api/agents/{agent}/end-input")
    assert r.status_code in (200, 202, 204), r.text
    events = await b.wait_finished(agent, T)

    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))  # no hole, nothing twice
    kinds = kinds_of(events)
    [lost] = of_kind(events, "turn_lost")
    assert lost["turn"] == 0
    [res] = of_kind(events, "decision_resolved")
    assert (res["id"], res["state"], res["by"]) == (d["id"], "cancelled", "takeover")
    assert kinds.count("decision_pending") == 1
    assert kinds.index("decision_pending") < kinds.index("decision_resolved")
    assert kinds.index("decision_resolved") < kinds.index("turn_lost")
    [turn] = of_kind(events, "turn_finished")
    assert turn["turn"] == 1
    assert kinds.index("turn_lost") < kinds.index("turn_finished")
    assert "carry on" in "".join(k.get("chunk", "") for k in of_kind(events, "output"))
    assert kinds.count("agent_finished") == 1
    assert fake_agent.prompts == ["edit", "carry on"]  # the lost turn was never re-sent
    assert fake_agent.loads == [d["session_id"]]
