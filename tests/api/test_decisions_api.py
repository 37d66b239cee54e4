"""Permission decisions over HTTP (ADR 0006) on a real prosperod stack: Runtime + uvicorn + fake
caliband serving ACP agents (the scripted peer, or the TypeScript SDK's example agent behind
the per-agent TLS + token bridge)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prospero.api.app import create_app
from prospero.api.server import ApiServer
from prospero.api.settings import ApiSettings
from prospero.core.discovery import socket_path_for
from prospero.core.fleet.local import CalibandNetworkConfig
from prospero.core.sources import canonical_root
from prospero.core.transport import NetworkSecurity
from prospero.core.wire.control import SpawnSpec
from prospero.daemon.runtime import DaemonConfig, Runtime
from prospero.testkit import acp_scripts as S
from prospero.testkit import peers
from prospero.testkit.certs import CertBundle, make_certs
from prospero.testkit.fake_caliband import FakeCaliband
from tests.api.conftest import SseReader, Stack, StackFactory, envelope, sse_headers
from tests.core.test_decisions import WebhookSink, ask_turn
from tests.support import short_tmpdir, wait_until

T = 20.0
PEER_T = 40.0  # the TS example agent pauses 1 s between steps
PEER_TOKEN = "peer-token"
DASHBOARD_FIELDS = {
    "id",
    "agent_id",
    "workspace",
    "tool_call",
    "options",
    "created_at",
    "deadline",
    "state",
}


def acp_script_for(spec: SpawnSpec) -> S.AcpScript:
    """The scripted ACP agent's session, chosen by the spawn prompt."""
    prompt = spec.initial_prompt
    if prompt.startswith("twice"):
        return S.AcpScript(turns=[[*ask_turn("c1")[:-1], *ask_turn("c2")[1:]]])
    if prompt.startswith("run"):
        return S.AcpScript(
            turns=[
                ask_turn("sh", "make test", "execute", raw_input={"command": "make test"}),
            ]
        )
    return S.AcpScript(turns=[ask_turn()])


async def add_acp_workspace(stack: Stack, name: str = "ws") -> Path:
    root = stack.tmp / name
    root.mkdir(exist_ok=True)
    canon = canonical_root(str(root))
    stack.fakes[name] = await FakeCaliband.start_unix(
        socket_path_for(canon), root=canon, acp_script_for=acp_script_for
    )
    stack.roots[name] = root
    assert stack.runtime.manager is not None
    await stack.runtime.manager.add_workspace(name, str(root))
    return root


async def acp_stack(make_stack: StackFactory, **kw: Any) -> Stack:
    stack = await make_stack(workspace=False, allow_acp=True, **kw)
    await add_acp_workspace(stack)
    return stack


async def spawn(
    stack: Stack, prompt: str = "edit", posture: str | None = "supervised", ws: str = "ws"
) -> str:
    body: dict[str, Any] = {"prompt": prompt, "isolation": "shared", "drive_protocol": "acp"}
    if posture is not None:
        body["posture"] = posture
    r = await stack.client.post(f"/api/workspaces/{ws}/agents", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["agent_id"])


async def pending(stack: Stack, agent_id: str, n: int = 1) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    async def ready() -> bool:
        nonlocal found
        r = await stack.client.get("/api/decisions", params={"state": "pending", "agent": agent_id})
        assert r.status_code == 200, r.text
        found = r.json()
        return len(found) >= n

    await wait_until(ready, T, interval=0.05, what=f"{n} pending decision(s) of {agent_id}")
    return found


def kinds_of(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"]["kind"] for e in events]


def of_kind(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["kind"] for e in events if e["kind"]["kind"] == kind]


# ---- the TypeScript SDK's example agent, through the TLS + token bridge -----------------------------


@pytest.fixture(scope="module")
def certs() -> CertBundle:
    return make_certs()


@contextlib.asynccontextmanager
async def ts_stack(make_stack: StackFactory, certs: CertBundle) -> AsyncIterator[Stack]:
    fake = await FakeCaliband.start_tcp(
        "127.0.0.1",
        0,
        certs.cert_pem,
        certs.key_pem,
        PEER_TOKEN,
        acp_command=peers.ts_example_agent_command(),
    )
    try:
        net = CalibandNetworkConfig(
            endpoint=fake.endpoint, security=NetworkSecurity(ca_pem=certs.ca_pem, token=PEER_TOKEN)
        )
        stack = await make_stack(
            workspace=False,
            allow_acp=True,
            caliband_network=net,
            tokens={"alice": "tok-alice", "bob": "tok-bob"},
            client_token="tok-alice",
        )
        await stack.add_workspace("ws", fake=False)
        yield stack
    finally:
        await fake.stop()


async def test_ts_agent_approved_over_http_completes_the_edit(
    make_stack: StackFactory, certs: CertBundle
) -> None:
    async with ts_stack(make_stack, certs) as stack:
        agent_id = await spawn(stack, "improve the config")
        # The dashboard's view: exactly these fields (plus the audit ones).
        [d] = await pending(stack, agent_id)
        assert DASHBOARD_FIELDS <= set(d)
        assert (d["agent_id"], d["workspace"], d["state"], d["deadline"]) == (
            agent_id,
            "ws",
            "pending",
            None,
        )
        assert d["tool_call"] == {
            "id": "call_2",
            "title": "Modifying critical configuration file",
            "kind": "edit",
            "input": {
                "path": "/home/user/project/config.json",
                "content": '{"database": {"host": "new-host"}}',
            },
        }
        assert d["options"] == [
            {"id": "allow", "label": "Allow this change", "kind": "allow_once"},
            {"id": "reject", "label": "Skip this change", "kind": "reject_once"},
        ]
        r = await stack.client.get("/api/decisions", params={"state": "pending"})
        assert [x["id"] for x in r.json()] == [d["id"]]
        r = await stack.client.post(
            f"/api/decisions/{d['id']}", json={"option_id": "allow", "note": "ship it"}
        )
        assert r.status_code == 200, r.text
        decided = r.json()
        assert (decided["state"], decided["decided_by"], decided["option_id"], decided["note"]) == (
            "decided",
            "alice",
            "allow",
            "ship it",
        )
        events = await stack.wait_finished(agent_id, PEER_T)
        finished = [k for k in of_kind(events, "tool_finished") if k["id"] == "call_2"]
        assert finished and finished[0]["ok"] is True
        assert "Configuration updated" in finished[0]["result"]["text"]
        assert any(k["chunk"].startswith(" Perfect!") for k in of_kind(events, "output"))
        kinds = kinds_of(events)
        assert kinds.index("decision_pending") < kinds.index("decision_resolved")
        [res] = of_kind(events, "decision_resolved")
        assert (res["id"], res["state"], res["option_id"], res["by"], res["note"]) == (
            d["id"],
            "decided",
            "allow",
            "alice",
            "ship it",
        )
        # Audit: per agent and by id; a second answer is a conflict.
        r = await stack.client.get("/api/decisions", params={"agent": agent_id})
        assert [(x["id"], x["decided_by"]) for x in r.json()] == [(d["id"], "alice")]
        r = await stack.client.get(f"/api/decisions/{d['id']}")
        assert r.json()["decided_at"] and r.json()["state"] == "decided"
        r = await stack.client.post(
            f"/api/decisions/{d['id']}",
            json={"option_id": "reject"},
            headers={"Authorization": "Bearer tok-bob"},
        )
        assert envelope(r, 409, "conflict")["error"].endswith("already decided by alice")


async def test_ts_agent_denied_over_http_skips_the_edit(
    make_stack: StackFactory, certs: CertBundle
) -> None:
    async with ts_stack(make_stack, certs) as stack:
        agent_id = await spawn(stack, "improve the config")
        [d] = await pending(stack, agent_id)
        r = await stack.client.post(
            f"/api/decisions/{d['id']}",
            json={"option_id": "reject"},
            headers={"Authorization": "Bearer tok-bob"},
        )
        assert r.status_code == 200 and r.json()["decided_by"] == "bob"
        events = await stack.wait_finished(agent_id, PEER_T)
        outputs = "".join(k["chunk"] for k in of_kind(events, "output"))
        assert "I understand you prefer not to make that change" in outputs
        finished = [k for k in of_kind(events, "tool_finished") if k["id"] == "call_2"]
        assert finished and finished[0]["ok"] is False
        assert of_kind(events, "agent_finished")[0]["outcome"] == "EndOfTurn"


# ---- deciding: race, errors -------------------------------------------------------------------------


async def test_twenty_concurrent_deciders_exactly_one_wins(make_stack: StackFactory) -> None:
    stack = await acp_stack(make_stack)
    agent_id = await spawn(stack)
    [d] = await pending(stack, agent_id)
    async with httpx.AsyncClient(base_url=stack.url, timeout=T) as c:
        results = await asyncio.gather(
            *(
                c.post(
                    f"/api/decisions/{d['id']}",
                    json={"option_id": "allow-once" if i % 2 else "reject-once", "note": f"#{i}"},
                )
                for i in range(20)
            )
        )
    codes = sorted(r.status_code for r in results)
    assert codes == [200] + [409] * 19, codes
    winner = next(r.json() for r in results if r.status_code == 200)
    for r in results:
        if r.status_code == 409:
            envelope(r, 409, "conflict")
    events = await stack.wait_finished(agent_id)
    resolved = of_kind(events, "decision_resolved")
    assert len(resolved) == 1 and resolved[0]["option_id"] == winner["option_id"]
    assert resolved[0]["by"] == "anonymous"  # no auth configured
    r = await stack.client.get(f"/api/decisions/{d['id']}")
    assert (r.json()["note"], r.json()["decided_by"]) == (winner["note"], "anonymous")


async def test_decide_errors(make_stack: StackFactory) -> None:
    stack = await acp_stack(make_stack)
    r = await stack.client.post("/api/decisions/dec-nope", json={"option_id": "allow-once"})
    envelope(r, 404, "not_found")
    r = await stack.client.get("/api/decisions/dec-nope")
    envelope(r, 404, "not_found")
    agent_id = await spawn(stack)
    [d] = await pending(stack, agent_id)
    # The fleet view says the agent awaits approval (its status alone reads running).
    fleet = (await stack.client.get("/api/fleet")).json()
    [view] = [a for ws in fleet["workspaces"] for a in ws["agents"] if a["id"] == agent_id]
    assert (view["status"], view["pending_decisions"]) == ("running", 1)
    one = (await stack.client.get(f"/api/agents/{agent_id}")).json()  # the agent's own view
    assert (one["status"], one["pending_decisions"]) == ("running", 1)
    r = await stack.client.post(f"/api/decisions/{d['id']}", json={"option_id": "maybe"})
    assert "offered: allow-once (allow_once)" in envelope(r, 400, "invalid_option")["error"]
    r = await stack.client.post(f"/api/decisions/{d['id']}", json={})
    envelope(r, 422, "invalid_request")
    r = await stack.client.post(
        f"/api/decisions/{d['id']}", json={"option_id": "allow-once", "bogus": 1}
    )
    envelope(r, 422, "invalid_request")
    r = await stack.client.get("/api/decisions", params={"state": "weird"})
    envelope(r, 422, "invalid_request")
    r = await stack.client.post(f"/api/decisions/{d['id']}", json={"option_id": "allow-once"})
    assert r.status_code == 200
    r = await stack.client.post(f"/api/decisions/{d['id']}", json={"option_id": "allow-once"})
    envelope(r, 409, "conflict")
    await stack.wait_finished(agent_id)
    r = await stack.client.get("/api/decisions", params={"state": "decided"})
    assert [x["id"] for x in r.json()] == [d["id"]]
    assert (await stack.client.get("/api/decisions?state=pending")).json() == []
    fleet = (await stack.client.get("/api/fleet")).json()
    assert [a["pending_decisions"] for ws in fleet["workspaces"] for a in ws["agents"]] == [0]
    assert (await stack.client.get(f"/api/agents/{agent_id}")).json()["pending_decisions"] == 0


async def test_fleet_and_agent_streams_carry_decision_events(make_stack: StackFactory) -> None:
    stack = await acp_stack(make_stack)
    r = await stack.client.get("/api/decisions?state=pending")
    after = int(r.headers["X-Prospero-Last-Ordinal"])
    seen: list[dict[str, Any]] = []

    async def read_fleet() -> None:
        async with stack.client.stream(
            "GET", "/api/stream", params={"from": after + 1}, headers=sse_headers()
        ) as resp:
            reader = SseReader(resp)
            while (msg := await reader.next()) is not None:
                ev = msg.json()
                if ev["kind"]["kind"].startswith("decision_"):
                    seen.append(ev)
                    if ev["kind"]["kind"] == "decision_resolved":
                        return

    reader_task = asyncio.create_task(read_fleet())
    agent_id = await spawn(stack)
    [d] = await pending(stack, agent_id)
    await wait_until(lambda: len(seen) == 1, T, what="decision_pending on the fleet stream")
    p = seen[0]
    assert (p["agent_id"], p["repo"]) == (agent_id, "ws")
    assert {"id", "tool_call", "options", "deadline", "created_at"} <= set(p["kind"])
    assert p["kind"]["id"] == d["id"] and p["kind"]["options"] == d["options"]
    await stack.client.post(f"/api/decisions/{d['id']}", json={"option_id": "reject-always"})
    await asyncio.wait_for(reader_task, T)
    res = seen[1]["kind"]
    assert (res["state"], res["option_id"], res["option_kind"], res["by"]) == (
        "decided",
        "reject-always",
        "reject_always",
        "anonymous",
    )
    # The agent's own history has both, in order, after the tool call they are about.
    events = await stack.wait_finished(agent_id)
    kinds = kinds_of(events)
    assert kinds.index("tool_started") < kinds.index("decision_pending")
    assert kinds.index("decision_pending") < kinds.index("decision_resolved")


# ---- posture, policy, always rules ------------------------------------------------------------------


async def test_policy_api_and_workspace_default_posture(make_stack: StackFactory) -> None:
    stack = await acp_stack(make_stack)
    r = await stack.client.get("/api/workspaces/ws/policy")
    assert r.status_code == 200 and r.json() == {"posture": None, "timeout_s": None, "rules": []}
    envelope(await stack.client.get("/api/workspaces/nope/policy"), 404, "not_found")
    envelope(
        await stack.client.put("/api/workspaces/nope/policy", json={"rules": []}), 404, "not_found"
    )
    bad = await stack.client.put("/api/workspaces/ws/policy", json={"rules": [{"action": "maybe"}]})
    envelope(bad, 422, "invalid_request")
    bad = await stack.client.put("/api/workspaces/ws/policy", json={"timeout_s": -1})
    envelope(bad, 422, "invalid_request")
    policy = {
        "posture": "supervised",
        "timeout_s": None,
        "rules": [
            {"action": "allow", "kind": "execute", "command": "make *", "name": "make-ok"},
            {"action": "ask", "kind": "edit"},
        ],
    }
    r = await stack.client.put("/api/workspaces/ws/policy", json=policy)
    assert r.status_code == 200 and r.json() == policy
    r = await stack.client.patch("/api/workspaces/ws/policy", json={"timeout_s": 120})
    assert r.json() == {**policy, "timeout_s": 120}
    r = await stack.client.patch("/api/workspaces/ws/policy", json={"timeout_s": None})
    assert r.json() == policy
    assert (await stack.client.get("/api/workspaces/ws/policy")).json() == policy

    # A spawn without a posture gets the workspace's default, recorded on the agent.
    agent_id = await spawn(stack, posture=None)
    assert (await stack.client.get(f"/api/agents/{agent_id}")).json()["posture"] == "supervised"
    [d] = await pending(stack, agent_id)  # edit: "ask" -> a human
    assert d["posture"] == "supervised"
    await stack.client.post(f"/api/decisions/{d['id']}", json={"option_id": "allow-once"})
    await stack.wait_finished(agent_id)
    # The allow rule answers without a human and names itself.
    agent2 = await spawn(stack, "run the tests", posture=None)
    events = await stack.wait_finished(agent2)
    [res] = of_kind(events, "decision_resolved")
    assert (res["by"], res["rule"], res["option_id"]) == ("policy", "make-ok", "allow-once")
    assert of_kind(events, "decision_pending") == []
    assert [k["ok"] for k in of_kind(events, "tool_finished")] == [True]


async def test_autonomous_posture_is_answered_by_policy(make_stack: StackFactory) -> None:
    stack = await acp_stack(make_stack)
    agent_id = await spawn(stack, posture="autonomous")
    events = await stack.wait_finished(agent_id)
    [res] = of_kind(events, "decision_resolved")
    assert (res["state"], res["by"], res["rule"], res["option_id"]) == (
        "decided",
        "policy",
        "autonomous-default-deny",
        "reject-once",
    )
    r = await stack.client.get("/api/decisions", params={"agent": agent_id})
    assert [(x["decided_by"], x["posture"]) for x in r.json()] == [("policy", "autonomous")]
    assert [k["ok"] for k in of_kind(events, "tool_finished")] == [False]


async def test_allow_always_answers_the_sessions_next_ask(make_stack: StackFactory) -> None:
    stack = await acp_stack(make_stack)
    agent_id = await spawn(stack, "twice")
    [d] = await pending(stack, agent_id)
    r = await stack.client.post(f"/api/decisions/{d['id']}", json={"option_id": "allow-always"})
    assert r.status_code == 200
    events = await stack.wait_finished(agent_id)
    r = await stack.client.get("/api/decisions", params={"agent": agent_id})
    assert [(x["tool_call"]["id"], x["decided_by"], x["rule"]) for x in r.json()] == [
        ("c1", "anonymous", None),
        ("c2", "rule", f"session:{d['id']}"),
    ]
    assert [k["ok"] for k in of_kind(events, "tool_finished")] == [True, True]


# ---- timeouts, kill, restart ---------------------------------------------------------------------


async def test_timeout_answers_reject(make_stack: StackFactory) -> None:
    stack = await acp_stack(make_stack)
    r = await stack.client.patch("/api/workspaces/ws/policy", json={"timeout_s": 0.5})
    assert r.status_code == 200
    agent_id = await spawn(stack)
    events = await stack.wait_finished(agent_id)
    [p] = of_kind(events, "decision_pending")
    assert p["deadline"] is not None
    [res] = of_kind(events, "decision_resolved")
    assert (res["state"], res["by"], res["note"], res["option_id"]) == (
        "expired",
        "timeout",
        "timed out",
        "reject-once",
    )
    r = await stack.client.post(f"/api/decisions/{res['id']}", json={"option_id": "allow-once"})
    envelope(r, 409, "conflict")


async def test_kill_cancels_the_pending_ask(make_stack: StackFactory) -> None:
    stack = await acp_stack(make_stack)
    agent_id = await spawn(stack)
    [d] = await pending(stack, agent_id)
    assert (await stack.client.post(f"/api/agents/{agent_id}/kill")).status_code == 202
    r = await stack.client.get(f"/api/decisions/{d['id']}")
    assert (r.json()["state"], r.json()["decided_by"], r.json()["note"]) == (
        "cancelled",
        "cancel",
        "the agent was killed",
    )
    r = await stack.client.post(f"/api/decisions/{d['id']}", json={"option_id": "allow-once"})
    assert "already cancelled" in envelope(r, 409, "conflict")["error"]


async def test_cancel_turn_cancels_the_pending_ask(make_stack: StackFactory) -> None:
    stack = await acp_stack(make_stack)
    agent_id = await spawn(stack)
    [d] = await pending(stack, agent_id)
    assert (await stack.client.post(f"/api/agents/{agent_id}/cancel")).status_code == 202
    events = await stack.wait_finished(agent_id)
    [res] = of_kind(events, "decision_resolved")
    assert (res["id"], res["state"], res["note"]) == (
        d["id"],
        "cancelled",
        "the turn was cancelled",
    )
    assert [k["stop_reason"] for k in of_kind(events, "turn_finished")] == ["cancelled"]


async def test_pending_at_shutdown_is_cancelled_on_restart(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rundir = short_tmpdir()
    monkeypatch.setenv("CALIBAN_DAEMON_RUNTIME_DIR", rundir)
    root = tmp_path / "ws"
    root.mkdir()
    canon = canonical_root(str(root))
    fake = await FakeCaliband.start_unix(
        socket_path_for(canon), root=canon, acp_script_for=acp_script_for
    )

    async def daemon(grace: float) -> tuple[Runtime, ApiServer, httpx.AsyncClient]:
        cfg = DaemonConfig(
            bind_host="127.0.0.1",
            port=0,
            data_dir=tmp_path / "data",
            autostart=False,
            poll_interval=0.05,
            allow_acp=True,
            decision_rejoin_grace=grace,
        )
        rt = Runtime(cfg)
        await rt.start()
        srv = ApiServer(create_app(rt, ApiSettings()), "127.0.0.1", 0, graceful_timeout=3)
        await srv.start()
        return rt, srv, httpx.AsyncClient(base_url=srv.url, timeout=T)

    try:
        rt, srv, client = await daemon(30.0)
        assert rt.manager is not None
        await rt.manager.add_workspace("ws", str(root))
        r = await client.post(
            "/api/workspaces/ws/agents",
            json={
                "prompt": "edit",
                "isolation": "shared",
                "drive_protocol": "acp",
                "posture": "supervised",
            },
        )
        agent_id = r.json()["agent_id"]

        async def one_pending() -> list[Any]:
            r = await client.get("/api/decisions?state=pending")
            return list(r.json())

        await wait_until(one_pending, T)
        [d] = await one_pending()
        await client.aclose()
        await srv.stop()
        await rt.stop()  # the decision stays pending in the store

        rt, srv, client = await daemon(0.3)
        try:
            r = await client.get(f"/api/decisions/{d['id']}")
            assert r.json()["state"] in ("pending", "cancelled")

            async def cancelled() -> bool:
                r = await client.get(f"/api/decisions/{d['id']}")
                return bool(r.json()["state"] == "cancelled")

            await wait_until(cancelled, T, interval=0.05, what="cancelled on restart")
            r = await client.get(f"/api/decisions/{d['id']}")
            assert r.json()["decided_by"] == "restart"
            # the decision store answers first; its decision_resolved event is committed to
            # the event store after that
            resolved: list[dict[str, Any]] = []

            async def resolved_recorded() -> bool:
                nonlocal resolved
                events = (await client.get(f"/api/agents/{agent_id}/events")).json()
                resolved = of_kind(events, "decision_resolved")
                return bool(resolved)

            await wait_until(resolved_recorded, T, interval=0.05, what="decision_resolved stored")
            assert [(x["id"], x["by"]) for x in resolved] == [(d["id"], "restart")]

            # The turn in flight when prosperod stopped ended cancelled (its permission request
            # was answered `cancelled` before session/cancel) or, after a hard stop, lost.
            async def turn_ended() -> bool:
                events = (await client.get(f"/api/agents/{agent_id}/events")).json()
                cancelled = [
                    k for k in of_kind(events, "turn_finished") if k["stop_reason"] == "cancelled"
                ]
                return bool(cancelled or of_kind(events, "turn_lost"))

            await wait_until(turn_ended, T, interval=0.05, what="the turn's end recorded")
        finally:
            await client.aclose()
            await srv.stop()
            await rt.stop()
    finally:
        await fake.stop()
        shutil.rmtree(rundir, ignore_errors=True)


# ---- webhooks -------------------------------------------------------------------------------------


async def test_daemon_webhooks_get_pending_and_resolved(make_stack: StackFactory) -> None:
    sink = await WebhookSink([500]).start()
    try:
        stack = await acp_stack(make_stack, decision_webhooks=[sink.url])
        agent_id = await spawn(stack)
        [d] = await pending(stack, agent_id)
        await wait_until(lambda: len(sink.bodies) == 1, T, what="pending notification")
        assert sink.bodies[0]["event"] == "decision_pending"
        assert sink.bodies[0]["decision"]["id"] == d["id"]
        await stack.client.post(f"/api/decisions/{d['id']}", json={"option_id": "allow-once"})
        await wait_until(lambda: len(sink.bodies) == 2, T, what="resolved notification")
        assert sink.events() == [("decision_pending", "pending"), ("decision_resolved", "decided")]
        assert sink.attempts == 3  # the first try failed with a 500 and was retried

        async def both_delivered() -> bool:
            # the sink records a body before it answers; the notifier counts after the answer
            m = (await stack.client.get("/api/metrics")).json()
            return bool(m["decision_webhook_deliveries"] == 2)

        await wait_until(both_delivered, T, what="deliveries counted")
        m = (await stack.client.get("/api/metrics")).json()
        assert m["decision_webhook_deliveries"] == 2 and m["decision_webhook_retries"] == 1
    finally:
        await sink.stop()
