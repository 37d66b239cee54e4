"""SSE: replay then tail, id lines, resume by ?from and Last-Event-ID under random disconnects,
gap self-heal for a slow consumer, heartbeats, unknown ids, shutdown."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
import orjson
import pytest
from fastapi.sse import format_sse_event

from prospero.api.settings import ApiSettings
from prospero.api.sse import HEARTBEAT_FRAME, StreamHub, fleet_frame_for
from prospero.core import subscription
from prospero.core.metrics import Metrics
from prospero.core.store.base import StoredEvent
from prospero.types.events import FleetEvent, Output
from tests.api.conftest import SseMessage, SseReader, Stack, StackFactory, envelope, sse_headers
from tests.support import wait_until


async def read_all(
    client: httpx.AsyncClient, path: str, headers: dict[str, str] | None = None, **params: Any
) -> list[SseMessage]:
    out: list[SseMessage] = []
    async with client.stream("GET", path, params=params, headers=sse_headers(headers)) as resp:
        assert resp.status_code == 200
        reader = SseReader(resp)
        while (msg := await reader.next()) is not None:
            out.append(msg)
    return out


async def no_open_streams(stack: Stack) -> None:
    hub = stack.server.app.state.api.hub
    await wait_until(lambda: hub.open_streams == 0, 10, what="SSE connections cleaned up")


async def test_follow_agent_until_finished(stack: Stack) -> None:
    agent_id = await stack.spawn("tools")
    async with stack.client.stream(
        "GET", f"/api/agents/{agent_id}/stream", headers=sse_headers()
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["cache-control"] == "no-cache"
        reader = SseReader(resp)
        msgs: list[SseMessage] = []
        while (msg := await asyncio.wait_for(reader.next(), 20)) is not None:
            msgs.append(msg)
    # the server closed the stream right after agent_finished
    assert all(m.event is None for m in msgs)
    events = [m.json() for m in msgs]
    assert [int(m.id or 0) for m in msgs] == [e["seq"] for e in events]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["kind"]["kind"] == "agent_finished"
    assert events[0]["kind"]["kind"] == "agent_spawned"
    kinds = {e["kind"]["kind"] for e in events}
    assert {"output", "tool_started", "tool_finished", "turn_finished"} <= kinds
    tool = next(e["kind"] for e in events if e["kind"]["kind"] == "tool_started")
    assert tool["name"] == "Read" and tool["input"] == {"path": "README.md"}
    # the stream matches stored history exactly
    history = await stack.history(agent_id)
    assert history[: len(events)] == events
    await no_open_streams(stack)


async def test_resume_by_from_and_last_event_id(stack: Stack) -> None:
    agent_id = await stack.spawn("tools")
    history = await stack.wait_finished(agent_id)
    path = f"/api/agents/{agent_id}/stream"
    finished_seq = next(e["seq"] for e in history if e["kind"]["kind"] == "agent_finished")

    msgs = await read_all(stack.client, path, **{"from": 4})
    assert [int(m.id or 0) for m in msgs] == list(range(4, finished_seq + 1))
    # Last-Event-ID: resume strictly after it
    msgs = await read_all(stack.client, path, {"Last-Event-ID": "4"})
    assert [int(m.id or 0) for m in msgs] == list(range(5, finished_seq + 1))
    # both: the header wins (EventSource auto-reconnect keeps the original URL)
    msgs = await read_all(stack.client, path, {"Last-Event-ID": "6"}, **{"from": 2})
    assert int(msgs[0].id or 0) == 7
    # invalid values are request errors, in the envelope
    envelope(
        await stack.client.get(path, headers={"Last-Event-ID": "seven"}), 422, "invalid_request"
    )
    envelope(await stack.client.get(path, params={"from": "-3"}), 422, "invalid_request")


async def test_unknown_agent_stream_waits_with_heartbeats(make_stack: StackFactory) -> None:
    stack = await make_stack(heartbeat=0.1)
    async with stack.client.stream(
        "GET", "/api/agents/nobody/stream", headers=sse_headers()
    ) as resp:
        assert resp.status_code == 200  # no 404: the stream just waits
        reader = SseReader(resp)
        lines = resp.aiter_lines()
        seen: list[str] = []

        async def two_heartbeats() -> None:
            async for line in lines:
                seen.append(line)
                if sum(1 for s in seen if s == ": heartbeat") >= 2:
                    return

        await asyncio.wait_for(two_heartbeats(), 10)
        assert all(s in (": heartbeat", "") for s in seen), seen
        del reader
    await no_open_streams(stack)


async def _resume_loop(
    stack: Stack,
    path: str,
    rng: random.Random,
    done: Any,
    *,
    max_chunk: int,
) -> tuple[list[SseMessage], int]:
    """Follow `path`, disconnecting after a random number of messages and resuming from the
    last id (alternating ?from and Last-Event-ID) until `done(messages)`. Returns the union of
    received messages and the number of connections used."""
    received: list[SseMessage] = []
    last: int | None = None
    connections = 0
    while not done(received):
        connections += 1
        assert connections < 500, "too many reconnects"
        headers: dict[str, str] = {}
        params: dict[str, Any] = {}
        if last is not None:
            if rng.random() < 0.5:
                headers["Last-Event-ID"] = str(last)
            else:
                params["from"] = last + 1
        budget = rng.randint(1, max_chunk)
        async with stack.client.stream(
            "GET", path, params=params, headers=sse_headers(headers)
        ) as resp:
            assert resp.status_code == 200
            reader = SseReader(resp)
            while budget > 0:
                msg = await asyncio.wait_for(reader.next(), 20)
                if msg is None:
                    break
                if msg.event is None:
                    received.append(msg)
                    last = int(msg.id or 0)
                    budget -= 1
                if done(received):
                    break
        # leaving the context closes the connection mid-stream
    return received, connections


async def test_agent_stream_resume_under_random_disconnects(make_stack: StackFactory) -> None:
    stack = await make_stack(line_delay=0.0003)
    agent_id = await stack.spawn("long-3000")
    rng = random.Random(20260101)

    def finished(msgs: list[SseMessage]) -> bool:
        return bool(msgs) and msgs[-1].json()["kind"]["kind"] == "agent_finished"

    received, connections = await _resume_loop(
        stack, f"/api/agents/{agent_id}/stream", rng, finished, max_chunk=400
    )
    assert connections > 5
    seqs = [int(m.id or 0) for m in received]
    assert seqs == list(range(1, len(seqs) + 1)), "gap or duplicate in the union"
    events = [m.json() for m in received]
    assert [e["seq"] for e in events] == seqs
    history = await stack.history(agent_id)
    assert events == history[: len(events)]
    texts = [e["kind"]["chunk"] for e in events if e["kind"]["kind"] == "output"]
    assert len(texts) == 3000 and len(set(texts)) == 3000
    await no_open_streams(stack)


async def test_fleet_stream_resume_under_random_disconnects(make_stack: StackFactory) -> None:
    stack = await make_stack(line_delay=0.0003)
    a = await stack.spawn("long-1200")
    b = await stack.spawn("long-1200")
    rng = random.Random(7)

    def both_finished(msgs: list[SseMessage]) -> bool:
        done = {m.json()["agent_id"] for m in msgs if m.json()["kind"]["kind"] == "agent_finished"}
        return {a, b} <= done

    received, connections = await _resume_loop(
        stack, "/api/stream", rng, both_finished, max_chunk=300
    )
    assert connections > 3
    ordinals = [int(m.id or 0) for m in received]
    assert len(set(ordinals)) == len(ordinals), "duplicate in the union"
    assert ordinals == sorted(ordinals)
    store = stack.runtime.store
    assert store is not None
    stored = [se for se in await store.replay_fleet(0) if se.ordinal <= ordinals[-1]]
    assert [se.ordinal for se in stored] == ordinals, "gap in the union"
    assert [se.event.to_json() for se in stored] == [m.json() for m in received]
    # per-agent order inside the fleet feed
    for agent in (a, b):
        seqs = [m.json()["seq"] for m in received if m.json()["agent_id"] == agent]
        assert seqs == list(range(1, len(seqs) + 1))
    # ?from=N means ordinal >= N
    msgs: list[SseMessage] = []
    async with stack.client.stream(
        "GET", "/api/stream", params={"from": ordinals[10]}, headers=sse_headers()
    ) as resp:
        reader = SseReader(resp)
        while len(msgs) < 5:
            msg = await asyncio.wait_for(reader.next(), 10)
            assert msg is not None
            msgs.append(msg)
    assert [int(m.id or 0) for m in msgs] == ordinals[10:15]
    await no_open_streams(stack)


async def test_slow_consumer_gets_gap_then_every_event(make_stack: StackFactory) -> None:
    # A tiny bus buffer: a reader that stops reading while ~25 MB are produced (more than the
    # socket buffers hold) must lag, then heal from the store.
    stack = await make_stack(bus_buffer=4)
    agent_id = await stack.spawn("big-250", interactive=True)
    await stack.wait_status(agent_id, "idle")
    store = stack.runtime.store
    assert store is not None
    async with stack.client.stream(
        "GET", f"/api/agents/{agent_id}/stream", headers=sse_headers()
    ) as resp:
        reader = SseReader(resp)
        first = await asyncio.wait_for(reader.next(), 10)
        assert first is not None and first.id == "1"
        # start the flood, and do not read until all of it is stored
        assert (await stack.client.post(f"/api/agents/{agent_id}/end-input")).status_code == 202

        async def all_stored() -> bool:
            # agent_finished may already be followed by status_changed(done): look at a tail
            tail = await store.replay(agent_id, max(1, await store.high_water(agent_id) - 10))
            return any(e.kind.kind == "agent_finished" for e in tail)

        await wait_until(all_stored, 60, interval=0.05, what="flood stored")
        msgs = [first]
        while (msg := await asyncio.wait_for(reader.next(), 30)) is not None:
            msgs.append(msg)
    gaps = [m for m in msgs if m.event == "gap"]
    assert gaps, "the slow consumer should have lagged"
    for g in gaps:
        data = g.json()
        assert set(data) == {"skipped", "last_seq"} and data["skipped"] > 0
        assert g.id is None
        idx = msgs.index(g)
        before = [int(m.id or 0) for m in msgs[:idx] if m.event is None]
        assert data["last_seq"] == before[-1]
        after = next(m for m in msgs[idx + 1 :] if m.event is None)
        assert int(after.id or 0) == data["last_seq"] + 1  # replayed from the store
    data_msgs = [m for m in msgs if m.event is None]
    seqs = [int(m.id or 0) for m in data_msgs]
    assert seqs == list(range(1, len(seqs) + 1)), "gap or duplicate after self-heal"
    assert data_msgs[-1].json()["kind"]["kind"] == "agent_finished"
    chunks = [m.json()["kind"]["chunk"] for m in data_msgs if m.json()["kind"]["kind"] == "output"]
    assert len([c for c in chunks if len(c) > 1000]) == 250
    assert stack.runtime.metrics.get("bus_lagged") > 0
    await no_open_streams(stack)


async def test_shutdown_closes_open_streams(stack: Stack) -> None:
    async with stack.client.stream("GET", "/api/stream", headers=sse_headers()) as resp:
        assert resp.status_code == 200
        reader = SseReader(resp)
        hub = stack.server.app.state.api.hub
        await wait_until(lambda: hub.open_streams == 1, 10, what="stream open")
        stopper = asyncio.create_task(stack.server.stop())

        async def drain() -> None:
            while await reader.next() is not None:
                pass

        await asyncio.wait_for(drain(), 10)  # the server ended the stream
        await asyncio.wait_for(stopper, 15)
    assert hub.open_streams == 0


async def test_fleet_stream_kind_filter(stack: Stack) -> None:
    agent_id = await stack.spawn("tools")
    await stack.wait_finished(agent_id)
    store = stack.runtime.store
    assert store is not None
    wanted = {"status_changed", "agent_finished"}
    expected = [se for se in await store.replay_fleet(0) if se.event.kind.kind in wanted]
    assert any(se.event.kind.kind == "agent_finished" for se in expected)
    msgs: list[SseMessage] = []
    async with stack.client.stream(
        "GET",
        "/api/stream",
        params={"kinds": " status_changed , agent_finished "},
        headers=sse_headers(),
    ) as resp:
        assert resp.status_code == 200
        reader = SseReader(resp)
        while len(msgs) < len(expected):
            msg = await asyncio.wait_for(reader.next(), 10)
            assert msg is not None
            msgs.append(msg)
    # only those kinds, in store order, each with its store ordinal as id (ids skip)
    assert [int(m.id or 0) for m in msgs] == [se.ordinal for se in expected]
    assert [m.json() for m in msgs] == [se.event.to_json() for se in expected]
    # resuming a filtered stream by Last-Event-ID starts after that ordinal, still filtered
    async with stack.client.stream(
        "GET",
        "/api/stream",
        params={"kinds": "agent_finished"},
        headers=sse_headers({"Last-Event-ID": str(expected[0].ordinal)}),
    ) as resp:
        msg = await asyncio.wait_for(SseReader(resp).next(), 10)
        assert msg is not None and msg.json()["kind"]["kind"] == "agent_finished"
        assert int(msg.id or 0) > expected[0].ordinal
    # bad filters are request errors, in the envelope, naming what is wrong
    body = envelope(
        await stack.client.get("/api/stream", params={"kinds": "output,bogus"}),
        422,
        "invalid_request",
    )
    assert "bogus" in body["error"] and "status_changed" in body["error"]
    envelope(await stack.client.get("/api/stream", params={"kinds": " , "}), 422, "invalid_request")
    await no_open_streams(stack)


async def test_filtered_busy_stream_still_heartbeats() -> None:
    """Items that the filter drops are not traffic: a stream whose every item is filtered out
    must still send heartbeats, although its queue is never empty long enough to time out."""
    heartbeats = 0

    async def busy_output() -> Any:
        n = 0
        while heartbeats < 2:
            n += 1
            ev = FleetEvent(seq=n, ts="t", repo="ws", agent_id="a", kind=Output(chunk="x"))
            yield StoredEvent(n, ev)

    hub = StreamHub(ApiSettings(heartbeat_interval=0.05), Metrics())
    session = hub.open(busy_output(), fleet_frame_for(frozenset({"agent_finished"})))
    try:

        async def consume() -> None:
            nonlocal heartbeats
            async for chunk in session.chunks():
                assert chunk == HEARTBEAT_FRAME, chunk  # nothing but heartbeats gets through
                heartbeats += 1
                if heartbeats >= 2:
                    return

        await asyncio.wait_for(consume(), 10)
    finally:
        await session.close()
    assert hub.open_streams == 0


async def test_replay_bytes_are_the_old_wire_bytes(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """History leaves the store as bytes, a page of frames per write: the wire is exactly what
    formatting each decoded event gave (SSE per agent and fleet, filtered too, and REST)."""
    monkeypatch.setattr(subscription, "RAW_PAGE", 3)
    agent_id = await stack.spawn("tools")
    await stack.wait_finished(agent_id)
    store = stack.runtime.store
    assert store is not None
    stored = await store.replay(agent_id)
    end = next(i for i, e in enumerate(stored) if e.kind.kind == "agent_finished")

    def frame(e: FleetEvent, cursor: int) -> bytes:
        return format_sse_event(data_str=orjson.dumps(e.to_json()).decode(), id=str(cursor))

    async with stack.client.stream(
        "GET", f"/api/agents/{agent_id}/stream", headers=sse_headers()
    ) as resp:
        body = await resp.aread()
    assert body == b"".join(frame(e, e.seq) for e in stored[: end + 1])

    r = await stack.client.get(f"/api/agents/{agent_id}/events", params={"from": 2, "limit": 5})
    assert r.content == orjson.dumps([e.to_json() for e in stored[1:6]])

    fleet = await store.replay_fleet()
    for params, want in (
        ({}, fleet),
        (
            {"kinds": "output,agent_finished"},
            [s for s in fleet if s.event.kind.kind in {"output", "agent_finished"}],
        ),
    ):
        expected = b"".join(frame(s.event, s.ordinal) for s in want)
        got = b""
        async with stack.client.stream(
            "GET", "/api/stream", params=params, headers=sse_headers()
        ) as resp:
            async for chunk in resp.aiter_bytes():
                got += chunk
                if len(got) >= len(expected):
                    break
        # (later events, e.g. the workspace's own, may follow in the same write)
        assert got[: len(expected)] == expected, params
    await no_open_streams(stack)
