"""The MCP server at /mcp (issue 15 item 1), end to end: the official SDK's own client
(`streamable_http_client` + `ClientSession`) over real HTTP against a real prosperod stack
(Runtime + uvicorn + fake caliband), and the npm MCP inspector CLI (test_inspector_*)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent

from prospero.testkit import peers
from prospero.types.mcp import EVENTS_DEFAULT_LIMIT, EVENTS_MAX_LIMIT, SPAWN_MAX_WAIT_S
from tests.api.conftest import Stack, StackFactory, envelope
from tests.api.test_decisions_api import acp_stack
from tests.api.test_scopes import scoped_table
from tests.support import wait_until

T = 20.0
TOOLS = {
    "list_workspaces",
    "list_agents",
    "agent_status",
    "agent_events",
    "spawn",
    "send_input",
    "end_input",
    "cancel_turn",
    "kill",
    "respawn",
    "list_decisions",
    "approve",
    "deny",
}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
MCP_ACCEPT = {"Accept": "application/json, text/event-stream"}


@contextlib.asynccontextmanager
async def mcp_session(stack: Stack, token: str | None = None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx2.Timeout(T, read=60.0)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        streamable_http_client(f"{stack.url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    """A tool call that must succeed: its structured result (the text content says the same)."""
    result = await session.call_tool(tool, args)
    assert isinstance(result, CallToolResult)
    assert not result.is_error, (tool, args, result.content)
    assert result.structured_content is not None
    (text,) = result.content
    assert isinstance(text, TextContent)
    assert json.loads(text.text) == result.structured_content
    return dict(result.structured_content)


async def call_error(session: ClientSession, tool: str, **args: Any) -> str:
    """A tool call that must fail as a tool error (isError), never a protocol error: its text."""
    result = await session.call_tool(tool, args)
    assert isinstance(result, CallToolResult)
    assert result.is_error, (tool, args, result.structured_content)
    (text,) = result.content
    assert isinstance(text, TextContent)
    return text.text


async def all_events(session: ClientSession, agent_id: str, limit: int) -> list[dict[str, Any]]:
    """The agent's whole history through agent_events paging, checking each page's cursor."""
    events: list[dict[str, Any]] = []
    cursor = 0
    while True:
        page = await call(
            session, "agent_events", agent_id=agent_id, limit=limit, **{"from": cursor}
        )
        assert page["agent_id"] == agent_id
        got = page["events"]
        assert len(got) <= limit
        if got:
            assert got[0]["seq"] >= cursor
            assert page["next_from"] == got[-1]["seq"] + 1
        else:
            assert page["next_from"] == cursor
        events += got
        cursor = page["next_from"]
        if not page["truncated"]:
            return events
        assert len(got) == limit


# ------------------------------------------------------------------------------ the tools


async def test_tools_are_listed_with_typed_input_schemas(stack: Stack) -> None:
    async with mcp_session(stack) as session:
        assert session.server_info is not None and session.server_info.name == "prosperod"
        listed = (await session.list_tools()).tools
    tools = {t.name: t for t in listed}
    assert set(tools) == TOOLS
    for t in listed:
        assert t.description, t.name
        assert t.input_schema["type"] == "object", t.name
        assert t.output_schema is not None and t.output_schema["type"] == "object", t.name
        assert "ctx" not in t.input_schema.get("properties", {}), t.name

    spawn = tools["spawn"].input_schema
    props = spawn["properties"]
    assert sorted(spawn["required"]) == ["prompt", "workspace"]
    assert props["drive_protocol"]["enum"] == ["ndjson", "acp"]
    assert props["drive_protocol"]["default"] == "ndjson"
    assert {"supervised", "autonomous"} <= {
        v for b in props["posture"]["anyOf"] for v in b.get("enum", [])
    }
    assert props["interactive"] == {**props["interactive"], "type": "boolean", "default": False}
    assert props["wait_seconds"]["minimum"] == 0
    assert props["wait_seconds"]["maximum"] == SPAWN_MAX_WAIT_S
    assert props["prompt"]["minLength"] == 1 and "pattern" in props["prompt"]
    assert {"label", "model", "isolation", "budget_usd", "budget_tokens"} <= set(props)
    assert props["budget_usd"]["anyOf"][0]["exclusiveMinimum"] == 0

    events = tools["agent_events"].input_schema
    assert events["required"] == ["agent_id"]
    assert events["properties"]["from"]["default"] == 0
    assert events["properties"]["from"]["minimum"] == 0
    assert events["properties"]["limit"]["default"] == EVENTS_DEFAULT_LIMIT
    assert events["properties"]["limit"]["maximum"] == EVENTS_MAX_LIMIT
    assert {"truncated", "next_from", "events"} <= set(
        (tools["agent_events"].output_schema or {})["properties"]
    )
    assert sorted(tools["send_input"].input_schema["required"]) == ["agent_id", "text"]
    for name in ("agent_status", "end_input", "cancel_turn", "kill", "respawn"):
        assert tools[name].input_schema["required"] == ["agent_id"], name
    for name in ("approve", "deny"):
        schema = tools[name].input_schema
        assert schema["required"] == ["decision_id"], name
        assert {"always", "option_id", "note"} <= set(schema["properties"]), name
    assert tools["list_decisions"].input_schema["properties"]["state"]["default"] == "pending"

    for name in ("list_workspaces", "list_agents", "agent_status", "agent_events"):
        assert tools[name].annotations is not None and tools[name].annotations.read_only_hint
    kill = tools["kill"].annotations
    assert kill is not None and kill.destructive_hint and not kill.read_only_hint


async def test_spawn_and_follow_an_agent_to_done_by_paging_its_events(stack: Stack) -> None:
    async with mcp_session(stack) as session:
        workspaces = (await call(session, "list_workspaces"))["workspaces"]
        assert [w["name"] for w in workspaces] == ["ws"]
        spawned = await call(
            session, "spawn", workspace="ws", prompt="do it", label="long-150", isolation="shared"
        )
        agent_id = spawned["agent_id"]
        assert spawned["workspace"] == "ws" and spawned["isolated"] is False
        assert spawned["finished"] is False and spawned["waited_s"] == 0

        async def finished() -> bool:
            page = await call(session, "agent_events", agent_id=agent_id, limit=EVENTS_MAX_LIMIT)
            return bool(page["finished"]) or bool(page["truncated"])

        await wait_until(finished, T, interval=0.05, what="agent_finished stored")
        await stack.wait_finished(agent_id)
        # Paged by 7 (many pages) and by the maximum: the same history the REST route returns.
        rest = await stack.history(agent_id)
        assert len(rest) > 150
        assert await all_events(session, agent_id, 7) == rest
        assert await all_events(session, agent_id, EVENTS_MAX_LIMIT) == rest
        first = await call(session, "agent_events", agent_id=agent_id)
        assert len(first["events"]) == EVENTS_DEFAULT_LIMIT and first["truncated"] is True
        (end,) = [e["seq"] for e in rest if e["kind"]["kind"] == "agent_finished"]
        tail = await call(session, "agent_events", agent_id=agent_id, **{"from": end})
        assert tail["events"] == [e for e in rest if e["seq"] >= end]
        assert tail["finished"] is True and tail["truncated"] is False
        after = await call(session, "agent_events", agent_id=agent_id, **{"from": end + 1})
        assert after["finished"] is False
        beyond = await call(session, "agent_events", agent_id=agent_id, **{"from": 10**6})
        assert beyond["events"] == [] and beyond["next_from"] == 10**6

        await stack.wait_status(agent_id, "done")
        status = await call(session, "agent_status", agent_id=agent_id)
        r = await stack.client.get(f"/api/agents/{agent_id}")
        assert status == {**r.json(), "pending_decisions": status["pending_decisions"]}
        assert status["status"] == "done" and status["label"] == "long-150"
        listed = (await call(session, "list_agents", workspace="ws"))["agents"]
        assert [a["id"] for a in listed] == [agent_id]
        assert (await call(session, "list_agents", status="running"))["agents"] == []
        assert [a["id"] for a in (await call(session, "list_agents", status="done"))["agents"]] == [
            agent_id
        ]


async def test_spawn_waits_for_the_run_and_returns_its_final_status(stack: Stack) -> None:
    async with mcp_session(stack) as session:
        done = await call(
            session, "spawn", workspace="ws", prompt="quick", isolation="shared", wait_seconds=T
        )
        assert done["finished"] is True and done["status"] == "done"
        assert done["finish"]["outcome"] == "EndOfTurn" and done["finish"]["turns"] == 1
        assert 0 < done["waited_s"] < T

        crashed = await call(
            session,
            "spawn",
            workspace="ws",
            prompt="x",
            label="crash",
            isolation="shared",
            wait_seconds=T,
        )
        assert crashed["finished"] is True and crashed["status"] == "crashed"

        capped = await call(
            session,
            "spawn",
            workspace="ws",
            prompt="x",
            label="budget",  # conftest: 8 turns of BUDGET_TURN tokens
            isolation="shared",
            budget_tokens=1500,
            wait_seconds=T,
        )
        assert capped["finished"] is True and capped["status"] == "killed"
        assert capped["finish"]["outcome"] == "budget_exceeded"

        # A run longer than the wait: the answer comes when the wait ends, the run goes on.
        slow = await call(
            session,
            "spawn",
            workspace="ws",
            prompt="x",
            label="slow",
            isolation="shared",
            wait_seconds=0.5,
        )
        assert slow["finished"] is False and slow["finish"] is None
        assert slow["waited_s"] >= 0.5 and slow["status"] in ("spawning", "running", None)
        agent_id = slow["agent_id"]
        await stack.wait_status(agent_id, "running")
        killed = await call(session, "kill", agent_id=agent_id)
        assert killed == {"agent_id": agent_id, "action": "kill", "accepted": True}
        events = await stack.wait_finished(agent_id)
        assert events[-1]["kind"]["outcome"] == "killed"

        respawned = await call(session, "respawn", agent_id=agent_id)
        assert respawned["agent_id"] and respawned["agent_id"] != agent_id
        await stack.wait_status(respawned["agent_id"], "running", "done")


async def test_send_input_and_end_input_drive_an_interactive_agent(stack: Stack) -> None:
    async with mcp_session(stack) as session:
        spawned = await call(
            session, "spawn", workspace="ws", prompt="talk", interactive=True, isolation="shared"
        )
        agent_id = spawned["agent_id"]
        await stack.wait_status(agent_id, "idle")
        sent = await call(session, "send_input", agent_id=agent_id, text="please continue")
        assert sent == {"agent_id": agent_id, "action": "send_input", "accepted": True}

        async def echoed() -> bool:
            page = await call(session, "agent_events", agent_id=agent_id, limit=EVENTS_MAX_LIMIT)
            return any(
                e["kind"]["kind"] == "output" and "please continue" in e["kind"].get("chunk", "")
                for e in page["events"]
            )

        await wait_until(echoed, T, interval=0.05, what="input echoed")
        # cancel_turn is an ACP operation: the NDJSON agent's refusal is a tool error
        text = await call_error(session, "cancel_turn", agent_id=agent_id)
        assert "invalid_state" in text or "unsupported" in text, text
        ended = await call(session, "end_input", agent_id=agent_id)
        assert ended["action"] == "end_input"
        await stack.wait_finished(agent_id)
        await stack.wait_status(agent_id, "done")
        text = await call_error(session, "send_input", agent_id=agent_id, text="too late")
        assert "(invalid_state)" in text, text


async def test_a_supervised_agent_is_approved_through_mcp(
    make_stack: StackFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table, tokens, _ = scoped_table(tmp_path)
    stack = await acp_stack(make_stack, tokens=table, client_token=tokens["admin"])
    caplog.set_level(logging.INFO, logger="prospero.audit")
    async with mcp_session(stack, tokens["operate"]) as session:
        spawned = await call(
            session,
            "spawn",
            workspace="ws",
            prompt="edit",
            drive_protocol="acp",
            posture="supervised",
            isolation="shared",
        )
        agent_id = spawned["agent_id"]
        assert spawned["drive_protocol"] == "acp"
        pending: list[dict[str, Any]] = []

        async def asked() -> bool:
            nonlocal pending
            pending = (await call(session, "list_decisions", agent_id=agent_id))["decisions"]
            return bool(pending)

        await wait_until(asked, T, interval=0.05, what="a pending decision")
        (decision,) = pending
        assert decision["state"] == "pending" and decision["options"]
        status = await call(session, "agent_status", agent_id=agent_id)
        assert status["pending_decisions"] == 1 and status["posture"] == "supervised"
        # An option of the other family is refused, and nothing is decided by it.
        reject = next(o["id"] for o in decision["options"] if o["kind"].startswith("reject_"))
        text = await call_error(session, "approve", decision_id=decision["id"], option_id=reject)
        assert "approve answers with a allow_* option" in text, text

        decided = await call(session, "approve", decision_id=decision["id"], note="via mcp")
        assert decided["state"] == "decided" and decided["decided_by"] == "operate"
        assert decided["note"] == "via mcp"
        chosen = next(o for o in decision["options"] if o["id"] == decided["option_id"])
        assert chosen["kind"] == "allow_once"
        text = await call_error(session, "deny", decision_id=decision["id"])
        assert "already decided by operate" in text and "(conflict)" in text, text
        await stack.wait_finished(agent_id)
        assert (await call(session, "list_decisions", agent_id=agent_id))["decisions"] == []
        everything = await call(session, "list_decisions", state="all", agent_id=agent_id)
        assert [d["id"] for d in everything["decisions"]] == [decision["id"]]
        r = await stack.client.get(f"/api/decisions/{decision['id']}")
        assert r.json()["decided_by"] == "operate" and r.json()["option_id"] == chosen["id"]
    lines = [r for r in caplog.records if r.name == "prospero.audit" and r.method == "MCP"]
    approve = [r for r in lines if r.path == "/mcp#approve"]
    assert [(r.actor, r.status) for r in approve] == [("operate", "refused"), ("operate", "ok")]
    assert all(r.target == decision["id"] for r in approve)
    assert any(r.path == "/mcp#spawn" and r.status == "ok" for r in lines)


async def test_failures_are_tool_errors_with_a_clear_message(stack: Stack) -> None:
    async with mcp_session(stack) as session:
        text = await call_error(session, "agent_status", agent_id="nope")
        assert "agent 'nope' not found (not_found)" in text, text
        for tool in ("agent_events", "kill", "send_input", "end_input", "respawn"):
            args: dict[str, Any] = {"agent_id": "nope"}
            if tool == "send_input":
                args["text"] = "hi"
            text = await call_error(session, tool, **args)
            assert "agent 'nope' not found" in text, (tool, text)
        text = await call_error(session, "list_agents", workspace="elsewhere")
        assert "workspace 'elsewhere' not found (not_found)" in text, text
        text = await call_error(session, "spawn", workspace="elsewhere", prompt="x")
        assert "workspace 'elsewhere' not found" in text, text
        text = await call_error(session, "approve", decision_id="d-nope")
        assert "decision 'd-nope' not found (not_found)" in text, text
        # arguments outside the schema: refused by name, nothing spawned
        text = await call_error(
            session, "spawn", workspace="ws", prompt="x", wait_seconds=SPAWN_MAX_WAIT_S + 1
        )
        assert "wait_seconds" in text, text
        text = await call_error(session, "spawn", workspace="ws", prompt="")
        assert "prompt" in text, text
        text = await call_error(session, "spawn", workspace="ws", prompt="x", budget_usd=0)
        assert "budget_usd" in text, text
        text = await call_error(session, "agent_events", agent_id="x", limit=EVENTS_MAX_LIMIT + 1)
        assert "limit" in text, text
        text = await call_error(session, "agent_status", agent_id="a\x00b")
        assert "control character" in text, text
        text = await call_error(session, "no_such_tool")
        assert "no_such_tool" in text, text
        assert (await call(session, "list_agents"))["agents"] == []


# ------------------------------------------------------------------------------ HTTP layer


async def test_mcp_needs_an_operate_token(make_stack: StackFactory, tmp_path: Path) -> None:
    table, tokens, _ = scoped_table(tmp_path)
    stack = await make_stack(tokens=table, client_token=tokens["admin"])
    async with httpx.AsyncClient(base_url=stack.url, timeout=T) as c:
        r = await c.post("/mcp", json=INITIALIZE, headers=MCP_ACCEPT)
        envelope(r, 401, "unauthorized")
        assert r.headers["www-authenticate"].startswith("Bearer")
        r = await c.post("/mcp", json=INITIALIZE, headers={**MCP_ACCEPT, **bearer("wrong")})
        envelope(r, 401, "unauthorized")
        r = await c.get("/mcp", headers=MCP_ACCEPT)
        envelope(r, 401, "unauthorized")
        r = await c.post("/mcp", json=INITIALIZE, headers={**MCP_ACCEPT, **bearer(tokens["read"])})
        body = envelope(r, 403, "forbidden")
        assert "'operate'" in body["error"] and "'read'" in body["error"]
        for held in ("operate", "admin"):
            r = await c.post(
                "/mcp", json=INITIALIZE, headers={**MCP_ACCEPT, **bearer(tokens[held])}
            )
            assert r.status_code == 200, (held, r.text)
    # The SDK's client: refused without the scope, served with it.
    with pytest.raises(BaseException) as refused:
        async with mcp_session(stack, tokens["read"]):
            pass
    assert (
        refused.group_contains(MCPError)
        if isinstance(refused.value, BaseExceptionGroup)
        else (isinstance(refused.value, MCPError))
    )
    async with mcp_session(stack, tokens["operate"]) as session:
        assert {t.name for t in (await session.list_tools()).tools} == TOOLS


async def test_mcp_keeps_the_api_host_and_origin_guards(stack: Stack) -> None:
    url = f"{stack.url}/mcp"
    own = stack.url
    async with httpx.AsyncClient(timeout=T) as c:
        r = await c.post(url, json=INITIALIZE, headers={**MCP_ACCEPT, "Host": "rebind.example"})
        envelope(r, 421, "host_not_allowed")
        for hdrs in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
            r = await c.post(url, json=INITIALIZE, headers={**MCP_ACCEPT, **hdrs})
            envelope(r, 403, "cross_origin")
            r = await c.get(url, headers={**MCP_ACCEPT, **hdrs})  # the GET stream too
            envelope(r, 403, "cross_origin")
            r = await c.delete(url, headers={**hdrs, "Mcp-Session-Id": "x"})
            envelope(r, 403, "cross_origin")
        # A form-encoded POST (what a cross-site form can send) never reaches the SDK.
        r = await c.post(url, content=b"x=1", headers={"Content-Type": "text/plain"})
        envelope(r, 403, "cross_origin")
        r = await c.post(url, json=INITIALIZE, headers={**MCP_ACCEPT, "Origin": own})
        assert r.status_code == 200, r.text
        # Stateless: no GET stream to open (it would hold the connection with nothing to say),
        # no session to delete.
        for method in ("GET", "DELETE"):
            hdrs = {"Accept": "text/event-stream", "X-Prospero-Client": "test"}
            r = await c.request(method, url, headers=hdrs)
            body = envelope(r, 405, "method_not_allowed")
            assert "stateless" in body["error"] and r.headers["allow"] == "POST"
        r = await c.post(url, json=INITIALIZE, headers={**MCP_ACCEPT, "Host": "localhost"})
        assert r.status_code == 200, r.text


async def test_stopping_the_server_ends_a_waiting_spawn(make_stack: StackFactory) -> None:
    stack = await make_stack()
    async with mcp_session(stack) as session:
        waiting = asyncio.create_task(
            session.call_tool(
                "spawn",
                {
                    "workspace": "ws",
                    "prompt": "x",
                    "label": "slow",
                    "isolation": "shared",
                    "wait_seconds": 120,
                },
            )
        )

        async def running() -> bool:
            return any(a.status == "running" for a in stack.runtime.manager.list_agents("ws"))  # type: ignore[union-attr]

        await wait_until(running, T, interval=0.05, what="the slow agent running")
        loop = asyncio.get_running_loop()
        start = loop.time()
        await stack.server.stop()
        assert loop.time() - start < 10
        # The call ends with the stream (the tool was cancelled): it does not wait 120 s.
        with pytest.raises(MCPError, match="ended without a response"):
            await asyncio.wait_for(waiting, T)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ------------------------------------------------------------------------------ the npm inspector


async def inspector(stack: Stack, token: str | None, *args: str) -> tuple[int, str, str]:
    """Run the MCP inspector CLI (`@modelcontextprotocol/inspector-cli`, tests/peers) against
    the stack's /mcp: (exit code, stdout, stderr)."""
    cmd = [
        *peers.mcp_inspector_cli_command(),
        "--cli",
        f"{stack.url}/mcp",
        "--transport",
        "http",
        *args,
    ]
    if token is not None:
        cmd += ["--header", f"Authorization: Bearer {token}"]
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        cwd=peers.mcp_inspector_cli_dir(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_inspector_cli_lists_and_calls_the_tools(
    make_stack: StackFactory, tmp_path: Path
) -> None:
    table, tokens, _ = scoped_table(tmp_path)
    stack = await make_stack(tokens=table, client_token=tokens["admin"])
    token = tokens["operate"]

    code, out, err = await inspector(stack, token, "--method", "tools/list")
    assert code == 0, (out, err)
    listed = json.loads(out)["tools"]
    assert {t["name"] for t in listed} == TOOLS
    spawn = next(t for t in listed if t["name"] == "spawn")
    assert sorted(spawn["inputSchema"]["required"]) == ["prompt", "workspace"]

    code, out, err = await inspector(
        stack, token, "--method", "tools/call", "--tool-name", "list_workspaces"
    )
    assert code == 0, (out, err)
    assert [w["name"] for w in json.loads(out)["structuredContent"]["workspaces"]] == ["ws"]

    code, out, err = await inspector(
        stack,
        token,
        "--method",
        "tools/call",
        "--tool-name",
        "spawn",
        "--tool-arg",
        "workspace=ws",
        "prompt=from the inspector",
        "isolation=shared",
        f"wait_seconds={T}",
    )
    assert code == 0, (out, err)
    result = json.loads(out)
    assert not result.get("isError"), result
    spawned = result["structuredContent"]
    assert spawned["finished"] is True and spawned["status"] == "done"
    events = await stack.wait_finished(spawned["agent_id"])

    code, out, err = await inspector(
        stack,
        token,
        "--method",
        "tools/call",
        "--tool-name",
        "agent_events",
        "--tool-arg",
        f"agent_id={spawned['agent_id']}",
        "limit=2",
    )
    assert code == 0, (out, err)
    page = json.loads(out)["structuredContent"]
    assert page["events"] == events[:2] and page["truncated"] is True and page["next_from"] == 3

    code, out, err = await inspector(
        stack,
        token,
        "--method",
        "tools/call",
        "--tool-name",
        "agent_status",
        "--tool-arg",
        "agent_id=nope",
    )
    assert code == 0, (out, err)
    result = json.loads(out)
    assert result["isError"] is True
    assert "agent 'nope' not found" in result["content"][0]["text"]

    # Without the operate scope the inspector cannot connect.
    for held in (None, tokens["read"]):
        code, out, err = await inspector(stack, held, "--method", "tools/list")
        assert code != 0, (held, out, err)
