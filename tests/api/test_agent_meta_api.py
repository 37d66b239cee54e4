"""Prospero's own agent metadata over HTTP (issue 9): the posture of a supervised spawn
survives a caliband that echoes only its own spec fields, `adopt` drives an agent this control
plane did not spawn, and kill of a finished agent answers 409 and changes nothing."""

from __future__ import annotations

from typing import Any

from prospero.core.wire.control import CALIBAND_SPEC_FIELDS, SpawnSpec
from tests.api.conftest import Stack, StackFactory, envelope
from tests.api.test_decisions_api import acp_stack, pending, spawn
from tests.support import wait_until
from tests.testkit.test_fake_caliband import raw_exchange

T = 20.0


async def _listed_spec(stack: Stack, agent_id: str) -> dict[str, object]:
    """The spec exactly as the fake caliband's `listed` reply carries it."""
    (listed,) = await raw_exchange(stack.fake.endpoint, b'{"kind":"list"}\n')
    (rec,) = [a for a in listed["agents"] if a["id"] == agent_id]
    return dict(rec["spec"])


async def test_supervised_spawn_asks_a_human_though_caliband_drops_the_posture(
    make_stack: StackFactory,
) -> None:
    stack = await acp_stack(make_stack)
    agent_id = await spawn(stack, posture="supervised")
    spec = await _listed_spec(stack, agent_id)
    assert "permission_posture" not in spec and set(spec) <= CALIBAND_SPEC_FIELDS
    assert spec["drive_protocol"] == "acp"
    agent = (await stack.client.get(f"/api/agents/{agent_id}")).json()
    assert (agent["posture"], agent["spawned_here"], agent["drive_protocol"]) == (
        "supervised",
        True,
        "acp",
    )
    [d] = await pending(stack, agent_id)  # the ask waits for a human
    assert d["agent_id"] == agent_id and d["state"] == "pending"


async def test_adopt_drives_an_acp_agent_spawned_elsewhere(make_stack: StackFactory) -> None:
    stack = await acp_stack(make_stack)
    rec = await stack.fake.add_agent(
        spec=SpawnSpec(initial_prompt="edit", drive_protocol="acp"), interactive=True
    )
    listener = stack.fake.acp_listeners[rec.id]

    async def listed() -> bool:
        return (await stack.client.get(f"/api/agents/{rec.id}")).status_code == 200

    await wait_until(listed, T, interval=0.05, what="listed")
    before = stack.fake.list_count
    await wait_until(lambda: stack.fake.list_count >= before + 5, T, what="polls")
    body = (await stack.client.get(f"/api/agents/{rec.id}")).json()
    assert (body["drive_protocol"], body["spawned_here"], body["adopted"]) == ("acp", False, False)
    assert listener.connections_total == 0
    r = await stack.client.post(f"/api/agents/{rec.id}/input", json={"text": "hi"})
    assert "adopt" in envelope(r, 409, "invalid_state")["error"]

    r = await stack.client.post(f"/api/agents/{rec.id}/adopt")
    assert r.status_code == 200, r.text
    assert (r.json()["adopted"], r.json()["drive_protocol"]) == (True, "acp")
    await wait_until(lambda: listener.connections_total >= 1, T, what="driven after adopt")
    again = await stack.client.post(f"/api/agents/{rec.id}/adopt", json={"drive_protocol": "acp"})
    assert again.status_code == 200 and again.json()["adopted"] is True
    envelope(await stack.client.post("/api/agents/nope/adopt"), 404, "not_found")
    bad = await stack.client.post(f"/api/agents/{rec.id}/adopt", json={"drive_protocol": "x"})
    assert bad.status_code == 422


async def test_kill_of_a_finished_agent_answers_409_and_changes_nothing(stack: Stack) -> None:
    agent_id = await stack.spawn()
    await stack.wait_finished(agent_id)
    await stack.wait_status(agent_id, "done")
    history: list[dict[str, Any]] = []

    async def settled() -> bool:  # the fleet's status poll records its own status_changed
        nonlocal history
        history = await stack.history(agent_id)
        return any(
            e["kind"]["kind"] == "status_changed" and e["kind"]["to"] == "done" for e in history
        )

    await wait_until(settled, T, interval=0.05, what="status_changed to done recorded")
    r = await stack.client.post(f"/api/agents/{agent_id}/kill")
    assert "already finished" in envelope(r, 409, "invalid_state")["error"]
    assert not any(type(q).__name__ == "KillReq" for q in stack.fake.requests)
    assert (await stack.client.get(f"/api/agents/{agent_id}")).json()["status"] == "done"
    assert await stack.history(agent_id) == history
    r = await stack.client.post(f"/api/agents/{agent_id}/adopt")
    assert r.status_code == 200  # an NDJSON agent spawned here is already driven here
