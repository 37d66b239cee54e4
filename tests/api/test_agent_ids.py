"""`GET /api/agent-ids/{prefix}`: a unique prefix of an agent id resolves (issue 14, item 3);
several matches are a 409 `ambiguous` listing the candidates, none a 404."""

from __future__ import annotations

from prospero.types.agent_ids import MAX_CANDIDATES, AgentIdResolution, AmbiguousAgentId
from prospero.types.events import AgentGone, FleetEvent, now_ts
from tests.api.conftest import Stack, envelope
from tests.support import wait_until

T = 20.0


async def listed(stack: Stack, *ids: str) -> None:
    async def all_listed() -> bool:
        for agent_id in ids:
            if (await stack.client.get(f"/api/agents/{agent_id}")).status_code != 200:
                return False
        return True

    await wait_until(all_listed, T, interval=0.05, what=f"{ids} listed")


async def resolve(stack: Stack, prefix: str) -> AgentIdResolution:
    r = await stack.client.get(f"/api/agent-ids/{prefix}")
    assert r.status_code == 200, r.text
    return AgentIdResolution.model_validate(r.json())


async def test_unique_prefix_ambiguous_and_unknown(stack: Stack) -> None:
    for agent_id in ("65b7aaaa0001", "65b7bbbb0002", "c0ffee000001"):
        await stack.fake.add_agent(id=agent_id, status="done", serve=False, name=f"n-{agent_id}")
    await listed(stack, "65b7aaaa0001", "65b7bbbb0002", "c0ffee000001")

    got = await resolve(stack, "c0f")
    assert (got.prefix, got.agent.agent_id, got.exact) == ("c0f", "c0ffee000001", False)
    assert (got.agent.workspace, got.agent.status) == ("ws", "done")
    assert (await resolve(stack, "65b7a")).agent.agent_id == "65b7aaaa0001"
    whole = await resolve(stack, "65b7bbbb0002")
    assert whole.exact and whole.agent.agent_id == "65b7bbbb0002"

    r = await stack.client.get("/api/agent-ids/65b7")
    assert r.status_code == 409, r.text
    amb = AmbiguousAgentId.model_validate(r.json())
    assert amb.kind == "ambiguous" and amb.prefix == "65b7" and amb.more == 0
    assert [c.agent_id for c in amb.candidates] == ["65b7aaaa0001", "65b7bbbb0002"]
    assert {c.workspace for c in amb.candidates} == {"ws"}
    assert "65b7aaaa0001, 65b7bbbb0002" in amb.error

    body = envelope(await stack.client.get("/api/agent-ids/zzz"), 404, "not_found")
    assert "zzz" in body["error"]
    envelope(await stack.client.get("/api/agent-ids/a%01b"), 422, "invalid_request")


async def test_a_whole_id_wins_over_longer_ids_and_candidates_are_capped(stack: Stack) -> None:
    ids = ["ab", "abcdef"] + [f"dd{i:04d}" for i in range(MAX_CANDIDATES + 2)]
    for agent_id in ids:
        await stack.fake.add_agent(id=agent_id, status="done", serve=False)
    await listed(stack, *ids)
    got = await resolve(stack, "ab")
    assert got.exact and got.agent.agent_id == "ab"
    assert (await resolve(stack, "abc")).agent.agent_id == "abcdef"

    r = await stack.client.get("/api/agent-ids/dd")
    assert r.status_code == 409
    amb = AmbiguousAgentId.model_validate(r.json())
    assert [c.agent_id for c in amb.candidates] == ids[2 : 2 + MAX_CANDIDATES]
    assert amb.more == 2 and amb.error.endswith("and 2 more")


async def test_agents_resolve_after_removal(stack: Stack) -> None:
    """An agent spawned here or discovered resolves by prefix after it is gone (Prospero's
    own metadata keeps it); history without metadata resolves by the whole id."""
    spawned = await stack.spawn()
    await stack.wait_finished(spawned)
    await stack.wait_status(spawned, "done")
    assert (await stack.client.delete(f"/api/agents/{spawned}")).status_code == 204

    async def gone(agent_id: str) -> bool:
        return (await stack.client.get(f"/api/agents/{agent_id}")).status_code == 404

    await wait_until(lambda: gone(spawned), T, interval=0.05, what="removed")
    got = await resolve(stack, spawned[:6])
    assert got.agent.agent_id == spawned and got.agent.workspace == "ws"
    assert got.agent.status is None  # not listed any more

    # One only discovered keeps its metadata too (written when it is first listed).
    await stack.fake.add_agent(id="feed00000001", status="done", serve=False)
    await listed(stack, "feed00000001")
    stack.fake.remove_agent("feed00000001")
    await wait_until(lambda: gone("feed00000001"), T, interval=0.05, what="agent_gone")
    assert (await resolve(stack, "feed")).agent.agent_id == "feed00000001"

    # History with no metadata (stored before Prospero kept any): the whole id only.
    await stack.runtime.store.append_batch(
        [FleetEvent(seq=1, ts=now_ts(), repo="ws", agent_id="0ld000000001", kind=AgentGone())]
    )
    envelope(await stack.client.get("/api/agent-ids/0ld"), 404, "not_found")
    whole = await resolve(stack, "0ld000000001")
    assert whole.exact and whole.agent.workspace is None and whole.agent.status is None


async def test_the_route_is_documented(stack: Stack) -> None:
    doc = (await stack.client.get("/openapi.json")).json()
    op = doc["paths"]["/api/agent-ids/{prefix}"]["get"]
    assert op["operationId"] == "resolveAgentId" and op["x-prospero-scope"] == "read"
    assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/AgentIdResolution"
    )
    refs = op["responses"]["409"]["content"]["application/json"]["schema"]["anyOf"]
    assert {"$ref": "#/components/schemas/AmbiguousAgentId"} in refs
    assert set(doc["components"]["schemas"]["AmbiguousAgentId"]["properties"]) == {
        "error",
        "kind",
        "prefix",
        "candidates",
        "more",
    }
