"""Two prosperod replicas on one PostgreSQL database driving a supervised ACP agent: requests
that need the agent's driver (a permission answer, input, cancel, end of input, kill) reach the
replica that drives it from either replica, through the relay (core/relay), with the same
exactly-one-wins rule as within one process; a stalled owner gives a clear 503 saying nothing
was done."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.api.conftest import Stack, StackFactory, envelope
from tests.api.test_cluster_takeover import holder
from tests.api.test_decisions_api import add_acp_workspace
from tests.support import wait_until

TTL = 1.0
BEAT = 0.25
T = 20.0


async def replicas(make_stack: StackFactory, pg_dsn: str) -> tuple[Stack, Stack]:
    common: dict[str, Any] = {
        "database_url": pg_dsn,
        "lease_ttl": TTL,
        "heartbeat_interval": BEAT,
        "allow_acp": True,
    }
    a = await make_stack(replica_id="a", workspace=False, **common)
    await add_acp_workspace(a)  # its agents ask permission once, then echo each input
    b = await make_stack(replica_id="b", workspace=False, **common)  # the same registry

    async def b_knows() -> bool:
        r = await b.client.get("/api/workspaces")
        return any(w["name"] == "ws" for w in r.json())

    await wait_until(b_knows, T, interval=0.05, what="the workspace on b")
    return a, b


async def spawn_pending(a: Stack, b: Stack) -> tuple[str, dict[str, Any], Stack, Stack]:
    """A supervised interactive ACP agent with its permission request pending; returns the
    agent, the decision, the replica driving it and the other one."""
    r = await a.client.post(
        "/api/workspaces/ws/agents",
        json={
            "prompt": "edit",
            "isolation": "shared",
            "drive_protocol": "acp",
            "posture": "supervised",
            "interactive": True,
        },
    )
    assert r.status_code == 201, r.text
    agent = str(r.json()["agent_id"])
    found: list[dict[str, Any]] = []

    async def asked() -> bool:
        nonlocal found
        r = await b.client.get("/api/decisions", params={"state": "pending", "agent": agent})
        found = r.json()
        return len(found) == 1

    await wait_until(asked, T, interval=0.05, what="the pending decision, seen from b")
    owner = await holder(a, agent)
    assert owner in ("a", "b")
    driver, other = (a, b) if owner == "a" else (b, a)
    assert driver.runtime.decisions is not None and other.runtime.decisions is not None
    assert driver.runtime.decisions.is_live(found[0]["id"])
    assert not other.runtime.decisions.is_live(found[0]["id"])
    return agent, found[0], driver, other


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["kind"].get("chunk", "") for e in events)


async def test_answer_and_steering_through_the_replica_that_does_not_drive_the_agent(
    make_stack: StackFactory, pg_dsn: str
) -> None:
    a, b = await replicas(make_stack, pg_dsn)
    agent, d, driver, other = await spawn_pending(a, b)
    r = await other.client.post(
        f"/api/decisions/{d['id']}", json={"option_id": "allow-once", "note": "ok from afar"}
    )
    assert r.status_code == 200, r.text
    assert (r.json()["state"], r.json()["option_id"], r.json()["note"]) == (
        "decided",
        "allow-once",
        "ok from afar",
    )

    async def history_has(s: str) -> bool:
        return s in text_of(await other.history(agent))

    await wait_until(lambda: history_has("call_edit done."), T, what="the allowed edit")
    r = await other.client.post(f"/api/decisions/{d['id']}", json={"option_id": "allow-once"})
    assert "already decided" in envelope(r, 409, "conflict")["error"]
    # Input, a cancel with no turn in flight (a no-op) and the end of input, all through the
    # replica that does not drive the agent.
    r = await other.client.post(f"/api/agents/{agent}/input", json={"text": "and the docs"})
    assert r.status_code == 202, r.text
    await wait_until(lambda: history_has("echo: and the docs"), T, what="the second turn")
    assert (await other.client.post(f"/api/agents/{agent}/cancel")).status_code == 202
    assert (await other.client.post(f"/api/agents/{agent}/end-input")).status_code == 202
    events = await other.wait_finished(agent)
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))
    kinds = [e["kind"]["kind"] for e in events]
    assert kinds.count("decision_pending") == 1 and kinds.count("decision_resolved") == 1
    assert kinds.count("turn_finished") == 2 and kinds.count("agent_finished") == 1
    assert "turn_lost" not in kinds
    assert await holder(a, agent) in (driver.runtime.cluster.replica_id, None)  # never moved


async def test_concurrent_answers_on_both_replicas_exactly_one_wins(
    make_stack: StackFactory, pg_dsn: str
) -> None:
    a, b = await replicas(make_stack, pg_dsn)
    agent, d, _driver, _other = await spawn_pending(a, b)

    async def answer(s: Stack, i: int) -> httpx.Response:
        return await s.client.post(
            f"/api/decisions/{d['id']}",
            json={"option_id": "allow-once" if i % 2 else "reject-once", "note": f"#{i}"},
        )

    results = await asyncio.gather(*(answer(a if i % 2 else b, i) for i in range(20)))
    codes = sorted(r.status_code for r in results)
    assert codes == [200] + [409] * 19, [(r.status_code, r.text) for r in results]
    winner = next(r.json() for r in results if r.status_code == 200)
    r = await b.client.get(f"/api/decisions/{d['id']}")
    assert (r.json()["state"], r.json()["note"]) == ("decided", winner["note"])

    async def resolved_once() -> bool:
        kinds = [e["kind"]["kind"] for e in await a.history(agent)]
        return kinds.count("decision_resolved") == 1 and kinds.count("turn_finished") == 1

    await wait_until(resolved_once, T, what="one resolution, then the turn's end")


async def test_kill_through_the_other_replica_concludes_the_session_on_its_owner(
    make_stack: StackFactory, pg_dsn: str
) -> None:
    a, b = await replicas(make_stack, pg_dsn)
    agent, d, _driver, other = await spawn_pending(a, b)
    assert (await other.client.post(f"/api/agents/{agent}/kill")).status_code == 202
    r = await other.client.get(f"/api/decisions/{d['id']}")
    assert (r.json()["state"], r.json()["decided_by"], r.json()["note"]) == (
        "cancelled",
        "cancel",
        "the agent was killed",
    )
    events = await other.wait_finished(agent)
    [fin] = [e["kind"] for e in events if e["kind"]["kind"] == "agent_finished"]
    assert fin["outcome"] == "killed"


async def test_an_owner_that_takes_no_calls_gives_503_and_nothing_is_done(
    make_stack: StackFactory, pg_dsn: str
) -> None:
    a, b = await replicas(make_stack, pg_dsn)
    agent, d, driver, other = await spawn_pending(a, b)
    # The owner keeps its leases but stops taking relayed calls (a stalled replica).
    assert driver.runtime.relay is not None and other.runtime.manager is not None
    await driver.runtime.relay.close()
    routing = other.runtime.manager.routing
    assert routing is not None
    routing.timeout = 0.8
    r = await other.client.post(f"/api/decisions/{d['id']}", json={"option_id": "allow-once"})
    err = envelope(r, 503, "unreachable")["error"]
    assert "did not take" in err and "nothing was done" in err
    r = await other.client.get(f"/api/decisions/{d['id']}")
    assert r.json()["state"] == "pending"  # nothing was done
    r = await other.client.post(f"/api/agents/{agent}/input", json={"text": "x"})
    envelope(r, 503, "unreachable")
    # The owner itself still answers it.
    r = await driver.client.post(f"/api/decisions/{d['id']}", json={"option_id": "reject-once"})
    assert r.status_code == 200, r.text
