"""Notifications through the API (issue 15, deliverable 4): webhook targets get Slack-,
Discord- or plain-JSON messages when a run needs attention; the Done-when case (an agent with a
$0.01 cap is stopped and a notification is delivered); retries, the delivery log, the test
message, bad input, masked URLs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.api.conftest import Stack, StackFactory
from tests.receiver import Receiver
from tests.support import wait_until


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = await Receiver().start()
    yield r
    await r.stop()


async def add_target(stack: Stack, url: str, **body: Any) -> dict[str, Any]:
    r = await stack.client.post(
        "/api/notifications/targets", json={"name": "ops", "url": url, **body}
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


async def deliveries(stack: Stack, target: str | None = None) -> list[dict[str, Any]]:
    params = {"target": target} if target else {}
    r = await stack.client.get("/api/notifications/deliveries", params=params)
    assert r.status_code == 200, r.text
    return list(r.json())


async def test_an_agent_stopped_at_its_budget_is_notified(
    make_stack: StackFactory, receiver: Receiver
) -> None:
    stack = await make_stack(notify_interval=0.05)
    target = await add_target(stack, receiver.url)
    assert target["url"] == f"{receiver.url.split('/hooks')[0]}/…"  # the secret part masked
    assert target["events"] == [
        "decision_pending", "agent_finished", "agent_failed", "budget_warning", "budget_exceeded"
    ]  # fmt: skip
    agent = await stack.spawn("budget", budget_usd=0.01)
    await stack.wait_finished(agent, within=30)

    async def told() -> bool:
        return "budget_exceeded" in receiver.events()

    await wait_until(told, 20, what="the budget stop notified")
    # The warning, then the stop; the run's end (outcome budget_exceeded) is that same stop.
    assert receiver.events() == ["budget_warning", "budget_exceeded"], receiver.bodies
    stop = receiver.bodies[1]
    assert stop["agent_id"] == agent and stop["workspace"] == "ws"
    assert "stopped at its budget" in stop["summary"] and "$0.0100" in stop["summary"]
    assert stop["data"]["kind"]["kind"] == "budget_exceeded"
    log = await deliveries(stack, "ops")
    assert [(d["event"], d["state"], d["attempts"]) for d in log] == [
        ("budget_exceeded", "delivered", 1),
        ("budget_warning", "delivered", 1),
    ]
    assert log[0]["http_status"] == 200 and log[0]["agent_id"] == agent


async def test_slack_and_discord_payloads_for_a_finished_run(make_stack: StackFactory) -> None:
    slack, discord = await Receiver().start(), await Receiver().start()
    try:
        stack = await make_stack(notify_interval=0.05, public_url="https://prospero.example")
        await add_target(stack, slack.url, name="s", format="slack")
        await add_target(stack, discord.url, name="d", format="discord", events=["agent_finished"])
        agent = await stack.spawn()
        await stack.wait_finished(agent, within=30)

        async def both() -> bool:
            return bool(slack.bodies) and bool(discord.bodies)

        await wait_until(both, 20, what="both targets told")
        [s] = slack.bodies
        assert set(s) == {"text"}
        assert s["text"].startswith("[Prospero] Agent finished: agent ")
        assert f"<https://prospero.example/#/agents/{agent}|open>" in s["text"]
        [d] = discord.bodies
        assert d["content"].startswith("[Prospero] Agent finished:")
        assert d["allowed_mentions"] == {"parse": []}
        assert len(d["content"]) <= 2000
    finally:
        await slack.stop()
        await discord.stop()


async def test_filters_by_event_and_workspace(make_stack: StackFactory, receiver: Receiver) -> None:
    stack = await make_stack(notify_interval=0.05)
    await add_target(stack, receiver.url, name="failures", events=["agent_failed"])
    await add_target(stack, receiver.url, name="elsewhere", workspaces=["other"])
    agent = await stack.spawn()
    await stack.wait_finished(agent, within=30)
    other = await Receiver().start()
    try:
        await add_target(stack, other.url, name="late")
        second = await stack.spawn()
        await stack.wait_finished(second, within=30)

        async def late_told() -> bool:
            return bool(other.bodies)

        await wait_until(late_told, 20, what="the catch-all target told")
        assert [b["agent_id"] for b in other.bodies] == [second]  # not the run before it
        assert receiver.bodies == []  # neither filter matched a successful run in ws
    finally:
        await other.stop()


async def test_retries_then_delivers_and_a_refusal_fails_at_once(make_stack: StackFactory) -> None:
    flaky, refusing = await Receiver([503, 503]).start(), await Receiver([400]).start()
    try:
        stack = await make_stack(notify_interval=0.05, notify_backoff=0.05)
        await add_target(stack, flaky.url, name="flaky")
        await add_target(stack, refusing.url, name="refusing")
        agent = await stack.spawn()
        await stack.wait_finished(agent, within=30)

        async def settled() -> bool:
            log = await deliveries(stack)
            return len(log) == 2 and all(d["state"] != "pending" for d in log)

        await wait_until(settled, 20, what="both deliveries settled")
        by = {d["target_id"]: d for d in await deliveries(stack)}
        targets = {
            t["name"]: t["id"]
            for t in (await stack.client.get("/api/notifications/targets")).json()
        }
        ok, bad = by[targets["flaky"]], by[targets["refusing"]]
        assert (ok["state"], ok["attempts"], ok["http_status"]) == ("delivered", 3, 200)
        assert (bad["state"], bad["attempts"], bad["http_status"]) == ("failed", 1, 400)
        assert bad["error"].startswith("HTTP 400")
        assert flaky.attempts == 3 and refusing.attempts == 1
        metrics = (await stack.client.get("/metrics")).text
        assert 'prospero_notifications_failed_total{event="agent_finished"} 1.0' in metrics
        assert "prospero_notification_retries_total 2.0" in metrics
    finally:
        await flaky.stop()
        await refusing.stop()


async def test_the_test_message(make_stack: StackFactory, receiver: Receiver) -> None:
    stack = await make_stack()
    await add_target(stack, receiver.url, format="slack")
    r = await stack.client.post("/api/notifications/targets/ops/test")
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["delivered"] is True and got["delivery"]["http_status"] == 200
    assert receiver.bodies[0]["text"].startswith("[Prospero] Test:")
    receiver.statuses = [503]  # one attempt only: a test says what happened now
    r = await stack.client.post("/api/notifications/targets/ops/test")
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["delivered"] is False and got["delivery"]["state"] == "failed"
    assert got["delivery"]["http_status"] == 503 and receiver.attempts == 2
    await add_target(stack, "http://127.0.0.1:9/nothing-listens", name="dead")
    r = await stack.client.post("/api/notifications/targets/dead/test")
    got = r.json()
    assert got["delivered"] is False and got["delivery"]["http_status"] is None
    assert "Connect" in got["delivery"]["error"], got
    log = await deliveries(stack, "ops")
    assert [(d["event"], d["state"]) for d in log] == [("test", "failed"), ("test", "delivered")]


async def test_targets_are_managed_and_bad_input_is_refused(
    make_stack: StackFactory, receiver: Receiver
) -> None:
    stack = await make_stack()
    created = await add_target(stack, receiver.url)
    c = stack.client
    for body, words in (
        ({"name": "x", "url": "ftp://host/x"}, "http:// or https://"),
        ({"name": "x", "url": "https://"}, "no host"),
        ({"name": "x", "url": "https://u:p@host/x"}, "credentials"),
        ({"name": "x", "url": receiver.url, "format": "teams"}, "format"),
        ({"name": "x", "url": receiver.url, "events": ["agent_exploded"]}, "events"),
        ({"name": "x", "url": receiver.url, "events": []}, "events"),
        ({"name": "bad name", "url": receiver.url}, "name"),
        ({"name": "x", "url": receiver.url, "colour": "red"}, "colour"),
    ):
        r = await c.post("/api/notifications/targets", json=body)
        assert r.status_code == 422, (body, r.text)
        assert words in r.text, (body, r.text)
    r = await c.post("/api/notifications/targets", json={"name": "ops", "url": receiver.url})
    assert r.status_code == 409 and "exists" in r.json()["error"]
    listed = (await c.get("/api/notifications/targets")).json()
    assert [t["name"] for t in listed] == ["ops"]
    assert "secretpart" not in str(listed)
    r = await c.patch(
        f"/api/notifications/targets/{created['id']}",
        json={"enabled": False, "events": ["agent_failed"]},
    )
    assert r.status_code == 200, r.text
    assert (r.json()["enabled"], r.json()["events"]) == (False, ["agent_failed"])
    r = await c.patch("/api/notifications/targets/ops", json={"events": None})
    assert r.json()["events"][0] == "decision_pending"  # null: all of them again
    assert (await c.get("/api/notifications/targets/nope")).status_code == 404
    assert (await c.delete("/api/notifications/targets/ops")).status_code == 204
    assert (await c.get("/api/notifications/targets")).json() == []
    assert (await c.get("/api/notifications/deliveries?target=ops")).status_code == 404


async def test_a_pending_decision_is_notified(make_stack: StackFactory, receiver: Receiver) -> None:
    from tests.api.test_decisions_api import acp_stack, pending, spawn

    stack = await acp_stack(make_stack, notify_interval=0.05)
    await add_target(stack, receiver.url, format="slack", events=["decision_pending"])
    agent = await spawn(stack)
    [d] = await pending(stack, agent)

    async def told() -> bool:
        return bool(receiver.bodies)

    await wait_until(told, 20, what="the pending decision notified")
    [body] = receiver.bodies
    assert body["text"].startswith(f"[Prospero] Decision pending: agent {agent} in ws asks")
    title = d["tool_call"]["title"]
    assert title and title in body["text"]
    r = await stack.client.post(f"/api/decisions/{d['id']}", json={"option_id": "allow-once"})
    assert r.status_code == 200, r.text
