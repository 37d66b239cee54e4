"""Every endpoint of prospero-surface.md §1.2: success codes, bodies and the {error, kind}
envelope for 400/404/405/409/413/422/502/503, against a real uvicorn server."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import Stack, envelope
from tests.support import wait_until

# ------------------------------------------------------------------------------ health & meta


async def test_healthz_readyz_capabilities(stack: Stack) -> None:
    r = await stack.client.get("/healthz")
    assert r.status_code == 200 and r.text == "ok"
    assert r.headers["content-type"].startswith("text/plain")

    r = await stack.client.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {
        "ready": True,
        "store_writable": True,
        "workspaces_total": 1,
        "workspaces_healthy": 1,
        "workspaces_unreachable": 0,
    }

    r = await stack.client.get("/api/capabilities")
    assert r.status_code == 200
    assert r.json() == {"admin": True, "async_workspace_ops": False, "drive_protocols": ["ndjson"]}


async def test_readyz_503_when_store_not_writable(stack: Stack) -> None:
    store = stack.runtime.store
    assert store is not None

    async def not_writable() -> bool:
        return False

    store.writable = not_writable  # type: ignore[method-assign]
    r = await stack.client.get("/readyz")
    assert r.status_code == 503
    assert r.json()["ready"] is False and r.json()["store_writable"] is False


async def test_openapi_lists_every_endpoint(stack: Stack) -> None:
    r = await stack.client.get("/openapi.json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    expected = {
        "/healthz": {"get"},
        "/readyz": {"get"},
        "/metrics": {"get"},
        "/api/metrics": {"get"},
        "/api/capabilities": {"get"},
        "/api/fleet": {"get"},
        "/api/stream": {"get"},
        "/api/usage": {"get"},
        "/api/workspaces": {"get", "post"},
        "/api/workspaces/{name}": {"delete"},
        "/api/workspaces/{name}/config": {"put", "patch"},
        "/api/workspaces/{workspace}/agents": {"get", "post"},
        "/api/agents/{agent_id}": {"get", "delete"},
        "/api/cluster": {"get"},
        "/api/agents/{agent_id}/events": {"get"},
        "/api/agents/{agent_id}/stream": {"get"},
        "/api/agents/{agent_id}/kill": {"post"},
        "/api/agents/{agent_id}/respawn": {"post"},
        "/api/agents/{agent_id}/input": {"post"},
        "/api/agents/{agent_id}/end-input": {"post"},
        "/api/agents/{agent_id}/cancel": {"post"},
        "/api/agents/{agent_id}/drain": {"post"},
    }
    for path, methods in expected.items():
        assert path in paths, path
        assert methods <= set(paths[path]), (path, paths[path].keys())
    stream = paths["/api/agents/{agent_id}/stream"]["get"]
    assert "text/event-stream" in stream["responses"]["200"]["content"]


async def test_metrics_json_and_prometheus_text(stack: Stack) -> None:
    agent = await stack.spawn()
    await stack.wait_finished(agent)

    r = await stack.client.get("/api/metrics")
    assert r.status_code == 200
    body = r.json()
    for key in (
        "events_appended",
        "append_failures",
        "unknown_frames",
        "repos_polled",
        "active_attaches",
    ):
        assert isinstance(body[key], int), key
    assert body["events_appended"] > 0 and body["repos_polled"] > 0

    r = await stack.client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert r.text.endswith("\n")
    # parsed as Prometheus parses it (tests/api/test_prometheus.py checks the series)
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    ours = {n: f for n, f in families.items() if n.startswith("prospero_")}
    assert set(families) - set(ours) <= {
        n for n in families if n.startswith(("process_", "python_"))
    }
    assert ours["prospero_events_appended"].type == "counter"
    assert ours["prospero_active_attaches"].type == "gauge"
    assert ours["prospero_api_sse_streams"].type == "gauge"
    assert ours["prospero_ingest_publish_seconds"].type == "histogram"
    for f in ours.values():
        for s in f.samples:
            if f.type == "counter":
                assert s.name == f.name + "_total", s
    appended = sum(s.value for s in ours["prospero_events_appended"].samples)
    # the same counter, read a moment later (a poll may append a status change in between)
    assert appended >= body["events_appended"]
    assert ours["prospero_repos_polled"].samples[0].value > 0


# ------------------------------------------------------------------------------ framework errors


async def test_unknown_route_and_wrong_method(stack: Stack) -> None:
    envelope(await stack.client.get("/api/nope"), 404, "not_found")
    r = await stack.client.put("/api/fleet")
    envelope(r, 405, "method_not_allowed")
    assert "GET" in r.headers.get("allow", "")


async def test_malformed_json_is_400_and_validation_is_422(stack: Stack) -> None:
    r = await stack.client.post(
        "/api/workspaces", content=b"{not json", headers={"content-type": "application/json"}
    )
    envelope(r, 400, "invalid_request")
    body = envelope(
        await stack.client.post("/api/workspaces", json={"root": "/x"}), 422, "invalid_request"
    )
    assert "name" in body["error"]
    envelope(
        await stack.client.post("/api/workspaces", json={"name": "../bad", "root": "/x"}),
        422,
        "invalid_request",
    )
    envelope(
        await stack.client.post("/api/workspaces", json={"name": "a", "root": "/x", "bogus": 1}),
        422,
        "invalid_request",
    )
    envelope(await stack.client.post("/api/workspaces", json=[1, 2]), 422, "invalid_request")
    # a JSON body without a JSON content type is not parsed (CSRF "simple requests")
    envelope(
        await stack.client.post(
            "/api/workspaces",
            content=b'{"name": "a", "root": "/x"}',
            headers={"content-type": "text/plain"},
        ),
        415,
        "unsupported_media_type",
    )
    envelope(await stack.client.post("/api/workspaces"), 422, "invalid_request")
    # query validation
    envelope(
        await stack.client.get("/api/agents/x/events", params={"from": "-1"}),
        422,
        "invalid_request",
    )
    envelope(
        await stack.client.get("/api/agents/x/events", params={"from": "abc"}),
        422,
        "invalid_request",
    )
    envelope(await stack.client.get("/api/usage", params={"days": "many"}), 422, "invalid_request")
    envelope(
        await stack.client.get("/api/usage", params={"since": "yesterday"}), 422, "invalid_request"
    )
    envelope(
        await stack.client.post("/api/agents/x/drain", params={"timeout_ms": "-5"}),
        422,
        "invalid_request",
    )


async def test_body_over_1mib_is_413(stack: Stack) -> None:
    big = b'{"prompt": "' + b"a" * (1024 * 1024) + b'"}'
    # declared Content-Length
    r = await stack.client.post(
        "/api/workspaces/ws/agents", content=big, headers={"content-type": "application/json"}
    )
    envelope(r, 413, "payload_too_large")

    # chunked upload (no Content-Length): counted while streaming
    async def chunks():  # type: ignore[no-untyped-def]
        for i in range(0, len(big), 64 * 1024):
            yield big[i : i + 64 * 1024]

    r = await stack.client.post(
        "/api/workspaces/ws/agents", content=chunks(), headers={"content-type": "application/json"}
    )
    assert "content-length" not in r.request.headers
    envelope(r, 413, "payload_too_large")
    # an endpoint that ignores its body still refuses an oversized one
    envelope(await stack.client.post("/api/agents/x/kill", content=big), 413, "payload_too_large")
    # just under the limit is fine (and then fails validation, not size)
    ok = b'{"prompt": "' + b"a" * 1000 + b'", "isolation": "shared", "label": "x"}'
    r = await stack.client.post(
        "/api/workspaces/ws/agents", content=ok, headers={"content-type": "application/json"}
    )
    assert r.status_code == 201, r.text


# ------------------------------------------------------------------------------ workspaces


async def test_workspace_lifecycle(stack: Stack) -> None:
    c = stack.client
    root2 = stack.tmp / "second"
    root2.mkdir()
    r = await c.post("/api/workspaces", json={"name": "second", "root": str(root2)})
    # the workspace as listed, its health as the first reach of its caliband found it (no
    # caliband serves this root and autostart is off: the cause and the fix)
    assert r.status_code == 201, r.text
    added = r.json()
    assert added["name"] == "second" and added["root"] == str(root2.resolve())
    assert added["agent_count"] == 0 and added["config"] == {}
    assert added["health"]["state"] == "unreachable", added
    assert "autostart is off: start `caliband --workspace-root" in added["health"]["reason"]
    # same name + same root again: idempotent
    again = await c.post("/api/workspaces", json={"name": "second", "root": str(root2)})
    assert again.status_code == 201 and again.json()["name"] == "second"
    # same name, other root / same root, other name: conflict
    other = stack.tmp / "other"
    other.mkdir()
    envelope(
        await c.post("/api/workspaces", json={"name": "second", "root": str(other)}),
        409,
        "conflict",
    )
    envelope(
        await c.post("/api/workspaces", json={"name": "third", "root": str(root2)}), 409, "conflict"
    )
    # local workspaces need a root
    envelope(await c.post("/api/workspaces", json={"name": "rootless"}), 400, "invalid_config")
    # a keyless provider with api_key_from_env
    envelope(
        await c.post(
            "/api/workspaces",
            json={
                "name": "bad",
                "root": str(other),
                "config": {"provider": "ollama", "api_key_from_env": "X"},
            },
        ),
        400,
        "provider_misconfigured",
    )

    r = await c.get("/api/workspaces")
    assert r.status_code == 200
    rows = {w["name"]: w for w in r.json()}
    assert set(rows) == {"ws", "second"}
    assert rows["second"]["config"] == {}  # absent/empty fields omitted
    assert rows["second"]["agent_count"] == 0
    assert rows["second"]["health"]["state"] in ("healthy", "unreachable")

    envelope(await c.get("/api/workspaces/nope/agents"), 404, "not_found")
    envelope(await c.delete("/api/workspaces/nope"), 404, "not_found")
    r = await c.delete("/api/workspaces/second")
    assert r.status_code == 204 and r.content == b""
    envelope(await c.delete("/api/workspaces/second"), 404, "not_found")
    assert [w["name"] for w in (await c.get("/api/workspaces")).json()] == ["ws"]


async def test_put_config_replaces_and_restarts_caliband(stack: Stack) -> None:
    c = stack.client
    await stack.add_workspace("cfg")
    fake = stack.fakes["cfg"]
    body = {"provider": "ollama", "base_url": "http://gpu:11434", "env": {"A": "1"}}
    r = await c.put("/api/workspaces/cfg/config", json=body)
    assert r.status_code == 204 and r.content == b""
    assert fake.shutdown_count == 1
    rows = {w["name"]: w for w in (await c.get("/api/workspaces")).json()}
    assert rows["cfg"]["config"] == body
    fleet = {w["name"]: w for w in (await c.get("/api/fleet")).json()["workspaces"]}
    assert fleet["cfg"]["config"] == body
    # replaced wholesale: omitted fields are cleared
    assert (await c.put("/api/workspaces/cfg/config", json={"env": {"B": "2"}})).status_code == 204
    rows = {w["name"]: w for w in (await c.get("/api/workspaces")).json()}
    assert rows["cfg"]["config"] == {"env": {"B": "2"}}

    envelope(await c.put("/api/workspaces/nope/config", json={}), 404, "not_found")
    envelope(
        await c.put(
            "/api/workspaces/ws/config", json={"provider": "ollama", "api_key_from_env": "K"}
        ),
        400,
        "provider_misconfigured",
    )
    envelope(
        await c.put("/api/workspaces/ws/config", json={"env": {"": "x"}}),
        400,
        "provider_misconfigured",
    )
    envelope(await c.put("/api/workspaces/ws/config", json={"env": "nope"}), 422, "invalid_request")


async def test_patch_config_changes_only_the_fields_given(stack: Stack) -> None:
    c = stack.client
    await stack.add_workspace("pat")
    fake = stack.fakes["pat"]

    async def config() -> dict[str, Any]:
        rows = {w["name"]: w for w in (await c.get("/api/workspaces")).json()}
        return dict(rows["pat"]["config"])

    # nothing changes: nothing is restarted (the fake caliband counts its shutdowns)
    for same in ({}, {"provider": None}, {"env": {"GONE": None}}, {"env": None}):
        r = await c.patch("/api/workspaces/pat/config", json=same)
        assert r.status_code == 200 and r.json()["config"] == {}, r.text
    assert fake.shutdown_count == 0
    # a change restarts the workspace's caliband; the answer is the workspace as listed
    body = {"provider": "ollama", "base_url": "http://gpu:11434", "env": {"A": "1", "B": "2"}}
    r = await c.patch("/api/workspaces/pat/config", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "pat" and r.json()["config"] == body
    assert fake.shutdown_count == 1
    # one field: the others are kept
    r = await c.patch("/api/workspaces/pat/config", json={"env": {"C": "3"}})
    assert r.status_code == 200, r.text
    want = {**body, "env": {"A": "1", "B": "2", "C": "3"}}
    assert r.json()["config"] == want and await config() == want
    # null clears a field; an env variable given null is removed; env null removes them all
    r = await c.patch("/api/workspaces/pat/config", json={"base_url": None, "env": {"A": None}})
    assert r.status_code == 200, r.text
    assert await config() == {"provider": "ollama", "env": {"B": "2", "C": "3"}}
    r = await c.patch("/api/workspaces/pat/config", json={"env": None})
    assert await config() == {"provider": "ollama"}

    # bad input is refused and loses nothing
    envelope(await c.patch("/api/workspaces/nope/config", json={}), 404, "not_found")
    for bad in ({"api_key_from_env": "K"}, {"env": {"": "x"}}):  # (ollama takes no key)
        envelope(
            await c.patch("/api/workspaces/pat/config", json=bad), 400, "provider_misconfigured"
        )
    for bad in ({"bogus": 1}, {"env": "nope"}, {"caliband": {"x": 1}}, {"provider": 7}):
        envelope(await c.patch("/api/workspaces/pat/config", json=bad), 422, "invalid_request")
    envelope(await c.patch("/api/workspaces/pat/config", json=[1]), 422, "invalid_request")
    assert await config() == {"provider": "ollama"}


# ------------------------------------------------------------------------------ agents


async def test_spawn_list_get_events(stack: Stack) -> None:
    c = stack.client
    r = await c.post(
        "/api/workspaces/ws/agents",
        json={"prompt": "summarise", "label": "tools", "isolation": "shared", "model": "m1"},
    )
    assert r.status_code == 201
    spawned = r.json()
    assert spawned == {
        "agent_id": spawned["agent_id"],
        "workspace": "ws",
        "isolated": False,
        "created": True,
        "drive_protocol": "ndjson",
    }
    agent_id = spawned["agent_id"]
    events = await stack.wait_finished(agent_id)
    kinds = [e["kind"]["kind"] for e in events]
    assert kinds[0] == "agent_spawned"
    assert {"tool_started", "tool_finished", "agent_finished"} <= set(kinds)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert all(e["agent_id"] == agent_id and e["repo"] == "ws" for e in events)
    status_changes = [e["kind"] for e in events if e["kind"]["kind"] == "status_changed"]
    assert all("from" in k and "to" in k for k in status_changes)  # serialised by alias

    r = await c.get(f"/api/agents/{agent_id}/events", params={"from": 3})
    got = [e["seq"] for e in r.json()]
    # from 3 on, contiguous, at least up to the history read above (a poll may have stored
    # the status change to done since)
    assert got == list(range(3, 3 + len(got))) and got[-1] >= len(events)
    r = await c.get(f"/api/agents/{agent_id}/events", params={"from": 2, "limit": 2})
    assert [e["seq"] for e in r.json()] == [2, 3]
    r = await c.get(f"/api/agents/{agent_id}/events", params={"from": 10_000})
    assert r.status_code == 200 and r.json() == []  # live agent, nothing that late

    r = await c.get(f"/api/agents/{agent_id}")
    assert r.status_code == 200
    agent = r.json()
    assert agent["id"] == agent_id and agent["workspace"] == "ws" and agent["label"] == "tools"
    assert agent["isolated"] is False and agent["model"] == "m1"

    r = await c.get("/api/workspaces/ws/agents")
    assert r.status_code == 200 and [a["id"] for a in r.json()] == [agent_id]
    fleet = (await c.get("/api/fleet")).json()
    assert fleet["host"] == "local"
    assert [a["id"] for a in fleet["workspaces"][0]["agents"]] == [agent_id]


async def test_spawn_errors(stack: Stack) -> None:
    c = stack.client
    envelope(await c.post("/api/workspaces/nope/agents", json={"prompt": "x"}), 404, "not_found")
    envelope(await c.post("/api/workspaces/ws/agents", json={"prompt": ""}), 422, "invalid_request")
    envelope(await c.post("/api/workspaces/ws/agents", json={}), 422, "invalid_request")
    envelope(
        await c.post("/api/workspaces/ws/agents", json={"prompt": "x", "colour": "red"}),
        422,
        "invalid_request",
    )
    envelope(
        await c.post("/api/workspaces/ws/agents", json={"prompt": "x", "drive_protocol": "telnet"}),
        422,
        "invalid_request",
    )
    # ACP is off unless --allow-acp
    envelope(
        await c.post(
            "/api/workspaces/ws/agents",
            json={"prompt": "x", "drive_protocol": "acp", "isolation": "shared"},
        ),
        409,
        "conflict",
    )
    # worktree isolation in a root that is not a git repo: caliband refuses -> 502 protocol
    envelope(await c.post("/api/workspaces/ws/agents", json={"prompt": "x"}), 502, "protocol")
    # a workspace whose caliband is not running (autostart off) -> 503 unreachable
    await stack.add_workspace("down", fake=False)
    envelope(
        await c.post("/api/workspaces/down/agents", json={"prompt": "x", "isolation": "shared"}),
        503,
        "unreachable",
    )


async def test_unknown_agent_is_404_everywhere(stack: Stack) -> None:
    c = stack.client
    for method, path, kwargs in [
        ("GET", "/api/agents/ghost", {}),
        ("DELETE", "/api/agents/ghost", {}),
        ("GET", "/api/agents/ghost/events", {}),
        ("POST", "/api/agents/ghost/kill", {}),
        ("POST", "/api/agents/ghost/respawn", {}),
        ("POST", "/api/agents/ghost/input", {"json": {"text": "hi"}}),
        ("POST", "/api/agents/ghost/end-input", {}),
        ("POST", "/api/agents/ghost/cancel", {}),
        ("POST", "/api/agents/ghost/drain", {}),
    ]:
        r = await c.request(method, path, **kwargs)
        body = envelope(r, 404, "not_found")
        assert "ghost" in body["error"], (method, path)


async def test_kill_respawn_remove(stack: Stack) -> None:
    c = stack.client
    agent_id = await stack.spawn("slow")
    await stack.wait_status(agent_id, "running")
    r = await c.post(
        f"/api/agents/{agent_id}/kill",
        content=b"null",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 202 and r.content == b""
    await stack.wait_status(agent_id, "killed")

    r = await c.post(f"/api/agents/{agent_id}/respawn")
    assert r.status_code == 200
    new_id = r.json()["agent_id"]
    assert set(r.json()) == {"agent_id"} and new_id != agent_id
    await stack.wait_status(new_id, "running")

    # rm of a running agent without force: caliband says invalid state -> 409
    envelope(await c.delete(f"/api/agents/{new_id}"), 409, "invalid_state")
    r = await c.delete(f"/api/agents/{new_id}", params={"force": "true"})
    assert r.status_code == 204 and r.content == b""
    envelope(await c.get(f"/api/agents/{new_id}"), 404, "not_found")
    # history outlives registry presence
    r = await c.get(f"/api/agents/{new_id}/events")
    assert r.status_code == 200
    assert r.json()[-1]["kind"]["kind"] == "agent_gone"

    # caliband's respawn replaced the old agent: it is gone from the live snapshot
    envelope(await c.get(f"/api/agents/{agent_id}"), 404, "not_found")
    envelope(await c.delete(f"/api/agents/{agent_id}"), 404, "not_found")


async def test_input_end_input_and_state_errors(stack: Stack) -> None:
    c = stack.client
    plain = await stack.spawn()
    await stack.wait_finished(plain)
    await stack.wait_status(plain, "done")
    envelope(await c.post(f"/api/agents/{plain}/input", json={"text": "hi"}), 409, "invalid_state")
    envelope(await c.post(f"/api/agents/{plain}/end-input"), 409, "invalid_state")
    envelope(await c.post(f"/api/agents/{plain}/cancel"), 409, "invalid_state")

    agent_id = await stack.spawn("interactive", interactive=True)
    await stack.wait_status(agent_id, "idle")
    envelope(
        await c.post(f"/api/agents/{agent_id}/input", json={"text": ""}), 422, "invalid_request"
    )
    envelope(await c.post(f"/api/agents/{agent_id}/input", json={}), 422, "invalid_request")
    envelope(
        await c.post(f"/api/agents/{agent_id}/input", json={"text": "x", "y": 1}),
        422,
        "invalid_request",
    )
    # cancel is an ACP operation: NDJSON agents answer 409
    envelope(await c.post(f"/api/agents/{agent_id}/cancel"), 409, "invalid_state")
    r = await c.post(f"/api/agents/{agent_id}/input", json={"text": "please continue"})
    assert r.status_code == 202 and r.content == b""

    async def echoed() -> bool:
        return any(
            e["kind"]["kind"] == "output" and "please continue" in e["kind"].get("chunk", "")
            for e in await stack.history(agent_id)
        )

    await wait_until(echoed, 15, interval=0.05, what="input echoed")
    r = await c.post(f"/api/agents/{agent_id}/end-input")
    assert r.status_code == 202 and r.content == b""
    await stack.wait_finished(agent_id)


async def test_drain_runs_in_background(stack: Stack) -> None:
    agent_id = await stack.spawn("slow")
    await stack.wait_status(agent_id, "running")
    r = await stack.client.post(f"/api/agents/{agent_id}/drain", params={"timeout_ms": 200})
    assert r.status_code == 202 and r.content == b""
    await stack.wait_status(agent_id, "killed", "done", "failed")


async def test_events_404_only_without_history_and_not_live(stack: Stack) -> None:
    c = stack.client
    envelope(await c.get("/api/agents/never-seen/events"), 404, "not_found")
    agent_id = await stack.spawn()
    await stack.wait_finished(agent_id)
    await stack.wait_status(agent_id, "done")
    assert (await c.delete(f"/api/agents/{agent_id}")).status_code == 204
    # gone from the registry, but its history stays; a late `from` is an empty page, not 404
    assert (await c.get(f"/api/agents/{agent_id}/events")).status_code == 200
    r = await c.get(f"/api/agents/{agent_id}/events", params={"from": 999})
    assert r.status_code == 200 and r.json() == []
    # the repo:<ws> quirk: workspace-level stream through the agent path
    r = await c.get("/api/agents/repo:ws/events")
    assert r.status_code in (200, 404)


async def test_store_failure_maps_to_500_envelope(stack: Stack) -> None:
    store = stack.runtime.store
    assert store is not None
    from prospero.core.errors import StoreError

    async def broken(*_a: object, **_k: object) -> list[object]:
        raise StoreError("disk on fire")

    store.usage = broken  # type: ignore[method-assign]
    body = envelope(await stack.client.get("/api/usage"), 500, "internal")
    assert "disk on fire" in body["error"]


async def test_http_client_can_keep_alive_across_requests(stack: Stack) -> None:
    # many small requests on one connection (keep-alive path + body middleware replay)
    async with httpx.AsyncClient(base_url=stack.url) as c:
        for _ in range(20):
            assert (await c.get("/healthz")).status_code == 200
            envelope(await c.post("/api/agents/ghost/input", json={"text": "x"}), 404, "not_found")
