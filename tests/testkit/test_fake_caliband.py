"""The fake caliband testkit behaves like caliband on the wire (caliband-wire.md §1-§4, §10)."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from prospero.core.caliband_client import CalibandClient
from prospero.core.errors import AgentNotFound, InvalidState, ProtocolError
from prospero.core.transport import NetworkSecurity, open_endpoint, read_line, send_one_line
from prospero.core.wire.control import (
    AGENT_RECORD_FIELDS,
    CALIBAND_SPEC_FIELDS,
    Endpoint,
    SpawnSpec,
    TcpEndpoint,
    UnixEndpoint,
)
from prospero.testkit import scripts
from prospero.testkit.certs import CertBundle, make_certs
from prospero.testkit.fake_agent import FakeAgentWorker, exit_code_for
from prospero.testkit.fake_caliband import FakeCaliband
from prospero.types.model import AgentStatus
from tests.support import fixture_lines, short_tmpdir, wait_until

TOKEN = "s3cr3t-token"


@pytest.fixture(scope="module")
def certs() -> CertBundle:
    return make_certs()


@pytest.fixture
def sockdir() -> Iterator[str]:
    d = short_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def read_all(
    ep: Endpoint, security: NetworkSecurity | None = None, limit: float = 10.0
) -> list[bytes]:
    reader, writer = await open_endpoint(ep, security)
    out: list[bytes] = []
    try:
        async with asyncio.timeout(limit):
            while (line := await read_line(reader)) is not None:
                out.append(line)
    finally:
        writer.close()
    return out


async def read_n(reader: asyncio.StreamReader, n: int, limit: float = 10.0) -> list[bytes]:
    out: list[bytes] = []
    async with asyncio.timeout(limit):
        while len(out) < n:
            line = await read_line(reader)
            assert line is not None, f"EOF after {len(out)} of {n} lines"
            out.append(line)
    return out


async def read_to_eof(reader: asyncio.StreamReader, limit: float = 10.0) -> list[bytes]:
    out: list[bytes] = []
    async with asyncio.timeout(limit):
        while (line := await read_line(reader)) is not None:
            out.append(line)
    return out


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _isdir(path: str) -> bool:
    return os.path.isdir(path)


def _read(path: Path) -> bytes:
    return path.read_bytes()


def types_of(lines: list[bytes]) -> list[str]:
    return [orjson.loads(ln).get("type", "?") for ln in lines]


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    run = ["git", "-C", str(path), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*run[:3], "init", "-q"], check=True)
    (path / "README.md").write_text("# demo\n")
    subprocess.run([*run, "add", "README.md"], check=True)
    subprocess.run([*run, "commit", "-q", "-m", "init"], check=True)
    return path


def branches(repo: Path) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(repo), "branch", "--format=%(refname:short)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()


# =============================================================================================
# FakeAgentWorker
# =============================================================================================


async def test_worker_replays_history_then_live_then_eof(sockdir: str) -> None:
    exits: list[int] = []
    w = FakeAgentWorker("a1", scripts.text_script(5), on_exit=exits.append)
    ep = await w.serve_unix(f"{sockdir}/a.sock")
    w.pause()
    w.start()
    reader, writer = await open_endpoint(ep)
    w.resume()
    lines = await read_to_eof(reader)
    writer.close()
    assert lines == w.history and len(lines) == 8
    assert types_of(lines)[0] == "TurnStart" and types_of(lines)[-1] == "RunEnd"
    assert [orjson.loads(ln)["text"] for ln in lines[1:6]] == [
        f"line {i:04d}\n" for i in range(1, 6)
    ]
    assert await w.wait_finished(5) == 0 and exits == [0]
    assert not _exists(ep.path)  # unlinked at exit
    with pytest.raises(OSError):
        await asyncio.open_unix_connection(ep.path)


async def test_worker_snapshot_and_subscribe_is_atomic(sockdir: str) -> None:
    """Clients joining at arbitrary points mid-stream each see every line exactly once."""
    w = FakeAgentWorker("a1", scripts.long_script(600, per_turn=50))
    ep = await w.serve_unix(f"{sockdir}/a.sock")
    w.start()
    readers = []
    for target in (0, 100, 250, 400):
        await wait_until(lambda t=target: w.lines_emitted >= t, 10)  # type: ignore[misc]
        readers.append(asyncio.create_task(read_all(ep)))
    results = await asyncio.gather(*readers)
    assert await w.wait_finished(5) == 0
    for lines in results:
        assert lines == w.history
    assert w.lines_dropped == 0


async def test_worker_ring_keeps_only_the_last_lines(sockdir: str) -> None:
    w = FakeAgentWorker("a1", scripts.text_script(30, final=False), ring_size=10)
    ep = await w.serve_unix(f"{sockdir}/a.sock")
    w.start()
    await wait_until(lambda: w.lines_emitted == 32)
    reader, writer = await open_endpoint(ep)
    got = await read_n(reader, 10)
    assert got == w.history[-10:]
    w.emit(scripts.text_delta("live one"))
    (live,) = await read_n(reader, 1)
    assert orjson.loads(live)["text"] == "live one"
    await w.stop()
    assert await read_to_eof(reader) == []
    writer.close()
    assert w.exit_code == 143  # stopped as if SIGTERMed


async def test_worker_slow_client_loses_oldest_lines_and_continues(sockdir: str) -> None:
    w = FakeAgentWorker("a1", [])
    ep = await w.serve_unix(f"{sockdir}/a.sock")
    w.start()
    reader, writer = await open_endpoint(ep)
    await wait_until(lambda: w.active_clients == 1)
    burst = 1500  # more than the 1024-deep live queue, emitted before the client can read
    for i in range(burst):
        w.emit(scripts.text_delta(f"burst {i:05d}"))
    assert w.lines_dropped == burst - 1024
    got = await read_n(reader, 1024)
    assert [orjson.loads(ln)["text"] for ln in got] == [
        f"burst {i:05d}" for i in range(burst - 1024, burst)
    ]
    w.emit(scripts.text_delta("after"))
    (after,) = await read_n(reader, 1)
    assert orjson.loads(after)["text"] == "after"
    await w.stop()
    writer.close()


@pytest.mark.parametrize(
    ("stopped_for", "code"),
    [
        ("EndOfTurn", 0),
        ({"MaxTurnsReached": 3}, 75),
        ("Cancelled", 124),
        ({"ProviderError": "boom"}, 1),
        ("MaxTokensExhausted", 1),
        ({"StreamIdle": {"secs": 1, "nanos": 0}}, 1),
    ],
)
async def test_worker_exit_codes(stopped_for: Any, code: int, sockdir: str) -> None:
    assert exit_code_for(stopped_for) == code
    exits: list[int] = []
    w = FakeAgentWorker("a1", [scripts.run_end(stopped_for)], on_exit=exits.append, linger=0)
    await w.serve_unix(f"{sockdir}/a.sock")
    w.start()
    assert await w.wait_finished(5) == code
    assert exits == [code]


async def test_worker_crash_directive_ends_without_run_end(sockdir: str) -> None:
    w = FakeAgentWorker("a1", scripts.crash_script(2, code=1))
    ep = await w.serve_unix(f"{sockdir}/a.sock")
    w.pause()
    w.start()
    reader, writer = await open_endpoint(ep)
    w.resume()
    lines = await read_to_eof(reader)
    writer.close()
    assert "RunEnd" not in types_of(lines) and len(lines) == 4
    assert await w.wait_finished(5) == 1


async def test_worker_raw_and_string_entries_are_verbatim(sockdir: str) -> None:
    script: list[Any] = [
        scripts.turn_start(0),
        scripts.raw("this is {not json"),
        '{"type":"future_thing","data":1}',
        scripts.sleep(0.01),
        scripts.run_end(),
    ]
    w = FakeAgentWorker("a1", script, linger=0)
    ep = await w.serve_unix(f"{sockdir}/a.sock")
    w.pause()
    w.start()
    reader, writer = await open_endpoint(ep)
    w.resume()
    lines = await read_to_eof(reader)
    writer.close()
    assert lines[1] == b"this is {not json"
    assert lines[2] == b'{"type":"future_thing","data":1}'
    assert len(lines) == scripts.wire_line_count(script) == 4


async def test_worker_pause_and_resume(sockdir: str) -> None:
    w = FakeAgentWorker("a1", scripts.text_script(3), linger=0)
    await w.serve_unix(f"{sockdir}/a.sock")
    w.pause()
    w.start()
    for _ in range(20):
        await asyncio.sleep(0)
    assert w.lines_emitted == 0
    w.resume()
    assert await w.wait_finished(5) == 0
    assert w.lines_emitted == 6


async def test_worker_line_delay_paces_output(sockdir: str) -> None:
    w = FakeAgentWorker("a1", scripts.text_script(4), line_delay=0.02, linger=0)
    await w.serve_unix(f"{sockdir}/a.sock")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    w.start()
    await w.wait_finished(5)
    assert loop.time() - t0 >= 0.02 * 6


async def test_worker_interactive_echo_and_end_input(sockdir: str) -> None:
    statuses: list[str] = []
    w = FakeAgentWorker(
        "a1", scripts.interactive_script(), interactive=True, on_status=statuses.append
    )
    ep = await w.serve_unix(f"{sockdir}/a.sock")
    w.start()
    reader, writer = await open_endpoint(ep)
    first = await read_n(reader, 3)
    assert types_of(first) == ["TurnStart", "AssistantTextDelta", "TurnEnd"]
    await wait_until(lambda: w.waiting_input)
    assert statuses == ["idle"]
    await send_one_line(
        ep, None, b'{"type":"UserMessage","text":"also update the changelog"}', drain_timeout=0.2
    )
    reply = await read_n(reader, 3)
    assert types_of(reply) == ["TurnStart", "AssistantTextDelta", "TurnEnd"]
    assert orjson.loads(reply[0])["turn_index"] == 1
    assert "also update the changelog" in orjson.loads(reply[1])["text"]
    await wait_until(lambda: statuses == ["idle", "running", "idle"])
    await send_one_line(ep, None, b'{"type":"EndInput"}', drain_timeout=0.2)
    rest = await read_to_eof(reader)
    writer.close()
    assert types_of(rest) == ["RunEnd"]
    assert await w.wait_finished(5) == 0
    assert statuses == ["idle", "running", "idle", "running"]
    assert w.inbound == [
        {"type": "UserMessage", "text": "also update the changelog"},
        {"type": "EndInput"},
    ]


async def test_worker_interactive_without_boundary_waits_before_run_end(sockdir: str) -> None:
    w = FakeAgentWorker("a1", scripts.default_script(), interactive=True, linger=0)
    ep = await w.serve_unix(f"{sockdir}/a.sock")
    w.start()
    await wait_until(lambda: w.waiting_input)
    assert types_of(w.history) == ["TurnStart"]
    await send_one_line(ep, None, b'{"type":"EndInput"}', drain_timeout=0.2)
    assert await w.wait_finished(5) == 0
    assert types_of(w.history) == ["TurnStart", "RunEnd"]


async def test_worker_non_interactive_ignores_inbound(sockdir: str) -> None:
    w = FakeAgentWorker("a1", scripts.text_script(1, final=False))
    ep = await w.serve_unix(f"{sockdir}/a.sock")
    w.start()
    await wait_until(lambda: w.lines_emitted == 3)
    await send_one_line(ep, None, b'{"type":"UserMessage","text":"hello?"}', drain_timeout=0.2)
    await wait_until(lambda: w.inbound_ignored == 1)
    assert w.lines_emitted == 3 and w.status_reports == []
    await w.stop()


async def test_worker_inbox_is_bounded_and_skips_garbage(sockdir: str) -> None:
    w = FakeAgentWorker("a1", [scripts.wait_input(), scripts.run_end()], interactive=True)
    ep = await w.serve_unix(f"{sockdir}/a.sock")
    w.pause()  # never reaches the boundary, so nothing is consumed
    w.start()
    frames = b"not json\n" + b'{"type":"Nope"}\n\n' + b'{"type":"UserMessage","text":"m"}\n' * 70
    await send_one_line(ep, None, frames, drain_timeout=0.2)
    await wait_until(lambda: len(w.inbound) == 70)
    assert w.inbound_malformed == 2
    assert w.inbox_dropped == 70 - 64
    await w.stop()


async def test_worker_cut_connections_then_reconnect_replays(sockdir: str) -> None:
    w = FakeAgentWorker("a1", scripts.text_script(5, final=False))
    ep = await w.serve_unix(f"{sockdir}/a.sock")
    w.start()
    await wait_until(lambda: w.lines_emitted == 7)
    reader, writer = await open_endpoint(ep)
    await read_n(reader, 7)
    w.cut_connections()
    with pytest.raises((ConnectionError, AssertionError)):
        await read_n(reader, 1, limit=5)
    writer.close()
    await wait_until(lambda: w.active_clients == 0)
    reader2, writer2 = await open_endpoint(ep)
    assert await read_n(reader2, 7) == w.history  # replay from the first retained line
    writer2.close()
    assert w.connections_total == 2
    await w.stop()


async def test_worker_tls_token_stream_and_clean_close(sockdir: str, certs: CertBundle) -> None:
    w = FakeAgentWorker("a1", scripts.tool_run_script(), interactive=True)
    ep = await w.serve_tcp("127.0.0.1", 0, certs.server_context(), TOKEN)
    assert isinstance(ep, TcpEndpoint) and ep.host_port()[0] == "127.0.0.1"
    sec = NetworkSecurity(ca_pem=certs.ca_pem, token=TOKEN)
    w.pause()
    w.start()
    reader, writer = await open_endpoint(ep, sec)
    await wait_until(lambda: w.active_clients == 1)
    # wrong token / garbage / oversized preamble: silently dropped
    for bad in (
        NetworkSecurity(ca_pem=certs.ca_pem, token="wrong"),
        NetworkSecurity(ca_pem=certs.ca_pem),
    ):
        r2, w2 = await open_endpoint(ep, bad)
        if bad.token is None:
            w2.write(b"x" * 5000)
        assert await read_to_eof(r2, limit=5) == []
        w2.close()
    await wait_until(lambda: w.auth_failures == 2)
    # a write-only connection delivers its frame (and is served the replay, which it drains)
    w.resume()
    await send_one_line(ep, sec, b'{"type":"UserMessage","text":"over tls"}', drain_timeout=0.2)
    await wait_until(lambda: w.waiting_input or w.finished)
    await send_one_line(ep, sec, b'{"type":"EndInput"}', drain_timeout=0.2)
    lines = await read_to_eof(reader)  # ends with a clean EOF, not a reset
    writer.close()
    assert lines == w.history and types_of(lines)[-1] == "RunEnd"
    assert {"type": "UserMessage", "text": "over tls"} in w.inbound
    assert await w.wait_finished(5) == 0
    assert w.connections_total == 3


async def test_worker_transcript_file(tmp_path: Path, sockdir: str) -> None:
    t = tmp_path / "stdout.ndjson"
    w = FakeAgentWorker("a1", scripts.text_script(2), transcript_path=t, linger=0)
    await w.serve_unix(f"{sockdir}/a.sock")
    w.start()
    await w.wait_finished(5)
    assert t.read_bytes().splitlines() == w.history


def test_scripts_helpers(tmp_path: Path) -> None:
    s = scripts.tool_run_script()
    assert types_of([orjson.dumps(e) for e in s]) == [
        "TurnStart",
        "AssistantThinkingDelta",
        "AssistantTextDelta",
        "ToolCallStart",
        "ToolCallInputDelta",
        "ToolCallInputDelta",
        "ToolCallEnd",
        "TurnEnd",
        "TurnStart",
        "AssistantTextDelta",
        "TurnEnd",
        "RunEnd",
    ]
    partial = "".join(
        e["partial_json"]
        for e in s
        if isinstance(e, dict) and e.get("type") == "ToolCallInputDelta"
    )
    assert orjson.loads(partial) == {"path": "README.md"}
    long = scripts.long_script(250, per_turn=100)
    texts = [
        e["text"] for e in long if isinstance(e, dict) and e.get("type") == "AssistantTextDelta"
    ]
    assert len(texts) == len(set(texts)) == 250
    assert scripts.wire_line_count(long) == 250 + 3 * 2 + 1
    assert scripts.wire_line_count(scripts.text_script(4)) == 7
    f = tmp_path / "s.ndjson"
    mixed: list[Any] = [
        scripts.turn_start(0),
        "raw garbage {",
        scripts.sleep(0.1),
        scripts.run_end(),
    ]
    scripts.dump_script(mixed, f)
    f.write_text(f.read_text() + "\n\n")
    assert scripts.load_script(f) == mixed


# =============================================================================================
# FakeCaliband control plane
# =============================================================================================


async def raw_exchange(
    ep: Endpoint, payload: bytes, security: NetworkSecurity | None = None
) -> list[dict[str, Any]]:
    """Write `payload` on one connection, half-close, read every reply line."""
    reader, writer = await open_endpoint(ep, security)
    writer.write(payload)
    await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()
    lines = await read_to_eof(reader)
    writer.close()
    return [orjson.loads(ln) for ln in lines]


@pytest.fixture
async def fake(sockdir: str) -> AsyncIterator[FakeCaliband]:
    f = await FakeCaliband.start_unix(f"{sockdir}/ctl.sock")
    yield f
    await f.stop()


async def test_several_requests_per_connection_and_bad_requests(fake: FakeCaliband) -> None:
    payload = (
        b'{"kind":"status"}\n'
        b"this is not json\n"
        b"\n"
        b'{"kind":"drain"}\n'
        b'{"id":"x"}\n'
        b"[1,2]\n"
        b'{"kind":"attach"}\n'
        b'{"kind":"attach","id":"nope"}\n'
        b'{"kind":"list"}'  # final line without newline is still answered
    )
    replies = await raw_exchange(fake.endpoint, payload)
    assert [r["kind"] for r in replies] == [
        "status",
        "error",
        "error",
        "error",
        "error",
        "error",
        "error",
        "listed",
    ]
    errors = [r["error"] for r in replies[1:7]]
    assert all(
        e["kind"] == "internal" and e["message"].startswith("bad request: ") for e in errors[:5]
    )
    assert "unknown variant `drain`" in errors[1]["message"]
    assert "missing field `kind`" in errors[2]["message"]
    assert errors[5] == {"kind": "not_found", "id": "nope"}
    assert fake.list_count == 1 and len(fake.bad_requests) == 5
    assert fake.received_attach_ids == ["nope"]
    assert [r.kind for r in fake.requests] == ["status", "attach", "list"]  # type: ignore[attr-defined]


async def test_oversized_request_closes_without_reply(fake: FakeCaliband) -> None:
    reader, writer = await open_endpoint(fake.endpoint)
    writer.write(b'{"kind":"list","pad":"' + b"x" * (1 << 20))
    await writer.drain()
    assert await read_to_eof(reader) == []
    writer.close()
    assert fake.oversized_requests == 1
    # a line of exactly 1 MiB is fine
    line = b'{"kind":"status","pad":"'
    line += b"y" * ((1 << 20) - len(line) - 2) + b'"}'
    assert len(line) == 1 << 20
    (reply,) = await raw_exchange(fake.endpoint, line + b"\n")
    assert reply["kind"] == "status"


async def test_shutdown_acks_then_stops_accepting(fake: FakeCaliband) -> None:
    path = fake.endpoint.path  # type: ignore[union-attr]
    kept = await fake.add_agent(serve=False, status="done")
    replies = await raw_exchange(fake.endpoint, b'{"kind":"shutdown"}\n{"kind":"list"}\n')
    assert replies == [{"kind": "shutdown_ack"}]  # connection closed after the ack
    await asyncio.wait_for(fake.wait_shutdown(), 5)
    assert fake.shutdown_count == 1 and not fake.accepting
    assert not _exists(path)
    with pytest.raises(OSError):
        await asyncio.open_unix_connection(path)
    # a "restarted" daemon keeps its records
    await fake.listen_unix(path)
    assert fake.accepting and [r.id for r in await CalibandClient(fake.endpoint).list()] == [
        kept.id
    ]


async def test_spawn_record_shape_and_lifecycle(fake: FakeCaliband) -> None:
    client = CalibandClient(fake.endpoint)
    spec = SpawnSpec(initial_prompt="hi", label="fixer", tool_allowlist=["Read"])
    spawned = await client.spawn(spec)
    assert re.fullmatch(r"[0-9a-f]{12}", spawned.id)
    ep = spawned.endpoint
    assert isinstance(ep, UnixEndpoint)
    ctl_dir = os.path.dirname(fake.endpoint.path)  # type: ignore[union-attr]
    assert re.fullmatch(re.escape(ctl_dir) + r"/agents/[0-9a-f]{8}-agent\.sock", ep.path)
    assert fake.received_specs == [spec]
    (rec,) = await client.list()
    assert rec.id == spawned.id and rec.name == "fixer" and rec.endpoint == ep
    assert rec.status in (AgentStatus.running, AgentStatus.done)
    assert dt.datetime.fromisoformat(rec.started_at).tzinfo is not None
    assert _isdir(rec.session_dir)
    assert rec.spec.drive_protocol == "ndjson"
    manifest = orjson.loads(_read(Path(rec.session_dir, "manifest.json")))
    assert manifest["id"] == spawned.id
    # the listed spec carries caliban's `source: null`
    (raw,) = (await raw_exchange(fake.endpoint, b'{"kind":"list"}\n'))[0]["agents"]
    # (an ACP spawn's `drive_protocol` round trip: tests/testkit/test_fake_acp.py)
    assert raw["spec"]["source"] is None and "drive_protocol" not in raw["spec"]
    # default script: TurnStart then RunEnd(EndOfTurn) -> done
    await fake.workers[spawned.id].wait_finished(5)
    assert types_of(fake.workers[spawned.id].history) == ["TurnStart", "RunEnd"]
    assert (await client.list())[0].status == AgentStatus.done
    assert not _exists(ep.path)
    transcript = _read(Path(rec.session_dir, "stdout.ndjson")).splitlines()
    assert transcript == fake.workers[spawned.id].history


async def test_failed_exit_marks_failed(sockdir: str) -> None:
    f = await FakeCaliband.start_unix(f"{sockdir}/ctl.sock", script=scripts.crash_script(1, code=1))
    try:
        client = CalibandClient(f.endpoint)
        sp = await client.spawn(SpawnSpec(initial_prompt="hi"))
        await f.workers[sp.id].wait_finished(5)
        assert f.status_of(sp.id) == AgentStatus.failed
    finally:
        await f.stop()


async def test_script_for_selects_per_spec(sockdir: str) -> None:
    def pick(spec: SpawnSpec) -> list[Any]:
        return scripts.text_script(int(spec.initial_prompt), final=False)

    f = await FakeCaliband.start_unix(f"{sockdir}/ctl.sock", script_for=pick)
    try:
        client = CalibandClient(f.endpoint)
        a = await client.spawn(SpawnSpec(initial_prompt="2"))
        b = await client.spawn(SpawnSpec(initial_prompt="5"))
        await wait_until(
            lambda: f.workers[a.id].lines_emitted == 4 and f.workers[b.id].lines_emitted == 7
        )
        assert [r.id for r in await client.list()] == [a.id, b.id]  # sorted by started_at
        assert {r.status for r in await client.list()} == {AgentStatus.running}
    finally:
        await f.stop()


async def test_kill_respawn_rm(sockdir: str) -> None:
    f = await FakeCaliband.start_unix(
        f"{sockdir}/ctl.sock", script=scripts.text_script(1, final=False)
    )
    try:
        c = CalibandClient(f.endpoint)
        a = await c.spawn(SpawnSpec(initial_prompt="p", label="L"))
        # rm without force on a running agent
        with pytest.raises(InvalidState) as ei:
            await c.rm(a.id)
        assert (ei.value.op, ei.value.status) == ("rm", "running")
        reply = await raw_exchange(f.endpoint, orjson.dumps({"kind": "rm", "id": a.id}) + b"\n")
        assert reply == [
            {
                "kind": "error",
                "error": {"kind": "invalid_state", "op": "rm", "id": a.id, "status": "running"},
            }
        ]
        # kill: worker stops, status killed, socket gone
        await c.kill(a.id)
        assert f.status_of(a.id) == AgentStatus.killed and f.workers[a.id].finished
        assert not _exists(a.endpoint.path)  # type: ignore[union-attr]
        # respawn: new id, same spec, old record gone
        new_id = await c.respawn(a.id)
        assert new_id != a.id
        recs = await c.list()
        assert [r.id for r in recs] == [new_id] and recs[0].spec.label == "L"
        # kill overwrites terminal states too
        f.set_status(new_id, "done")
        await c.kill(new_id)
        assert f.status_of(new_id) == AgentStatus.killed
        # rm of a terminal agent without force; session dir deleted
        session = f.record(new_id).session_dir
        await c.rm(new_id)
        assert not _exists(session) and await c.list() == []
        # force rm of a running agent stops it
        b = await c.spawn(SpawnSpec(initial_prompt="p"))
        await c.rm(b.id, force=True)
        assert f.workers[b.id].finished and await c.list() == []
        # unknown ids
        for op in (c.kill, c.respawn, c.rm, c.attach):
            with pytest.raises(AgentNotFound):
                await op("nope")
    finally:
        await f.stop()


async def test_respawn_does_not_signal_old_worker(sockdir: str) -> None:
    f = await FakeCaliband.start_unix(
        f"{sockdir}/ctl.sock", script=scripts.text_script(1, final=False)
    )
    try:
        c = CalibandClient(f.endpoint)
        a = await c.spawn(SpawnSpec(initial_prompt="p"))
        new_id = await c.respawn(a.id)
        assert not f.workers[a.id].finished and not f.workers[new_id].finished
        assert f.status_of(a.id) is None
    finally:
        await f.stop()


async def test_report_status_and_interactive_flip(sockdir: str) -> None:
    f = await FakeCaliband.start_unix(f"{sockdir}/ctl.sock", script=scripts.interactive_script())
    try:
        c = CalibandClient(f.endpoint)
        a = await c.spawn(SpawnSpec(initial_prompt="p", interactive=True))
        await wait_until(lambda: f.status_of(a.id) == AgentStatus.idle)
        assert (await c.list())[0].status == AgentStatus.idle
        ep = await c.attach(a.id)
        await send_one_line(ep, None, b'{"type":"UserMessage","text":"more"}', drain_timeout=0.2)
        await wait_until(
            lambda: f.workers[a.id].replies_emitted == 1 and f.status_of(a.id) == AgentStatus.idle
        )
        # report_status: only running<->idle; always acknowledged
        payload = b"".join(
            orjson.dumps({"kind": "report_status", "id": i, "status": s}) + b"\n"
            for i, s in ((a.id, "running"), ("unknown", "idle"), (a.id, "done"))
        )
        assert [r["kind"] for r in await raw_exchange(f.endpoint, payload)] == [
            "status_reported"
        ] * 3
        assert f.status_of(a.id) == AgentStatus.running
        f.set_status(a.id, "killed")
        await raw_exchange(
            f.endpoint,
            orjson.dumps({"kind": "report_status", "id": a.id, "status": "idle"}) + b"\n",
        )
        assert f.status_of(a.id) == AgentStatus.killed
        f.set_status(a.id, "idle")
        await send_one_line(ep, None, b'{"type":"EndInput"}', drain_timeout=0.2)
        await f.workers[a.id].wait_finished(5)
        assert f.status_of(a.id) == AgentStatus.done
    finally:
        await f.stop()


async def test_hooks_add_set_remove(fake: FakeCaliband) -> None:
    c = CalibandClient(fake.endpoint)
    rec = await fake.add_agent(
        id="pre000000001",
        name="old",
        script=scripts.text_script(2, final=False),
        started_at="2020-01-01T00:00:00+00:00",
    )
    dead = await fake.add_agent(status="done", serve=False)
    listed = await c.list()
    assert [r.id for r in listed] == ["pre000000001", dead.id]
    assert listed[0].name == "old" and listed[0].status == AgentStatus.running
    lines = await asyncio.wait_for(_read_some(rec.endpoint, 4), 5)
    assert types_of(lines) == ["TurnStart", "AssistantTextDelta", "AssistantTextDelta", "TurnEnd"]
    fake.set_status(rec.id, AgentStatus.idle)
    fake.set_interactive(rec.id, True)
    assert fake.workers[rec.id].interactive
    rec2 = (await c.list())[0]
    assert rec2.status == AgentStatus.idle and rec2.spec.interactive
    assert fake.remove_agent(rec.id) is not None
    assert [r.id for r in await c.list()] == [dead.id]
    st = await c.status()
    assert st.agents == 1 and st.pid == os.getpid() and st.endpoint == fake.endpoint
    assert fake.list_count == 3


async def _read_some(ep: Endpoint, n: int) -> list[bytes]:
    reader, writer = await open_endpoint(ep)
    try:
        return await read_n(reader, n)
    finally:
        writer.close()


async def test_worktree_isolation_real_git(tmp_path: Path, sockdir: str) -> None:
    repo = git_repo(tmp_path / "repo")
    f = await FakeCaliband.start_unix(
        f"{sockdir}/ctl.sock", root=repo, script=scripts.text_script(1, final=False)
    )
    try:
        c = CalibandClient(f.endpoint)
        a = await c.spawn(SpawnSpec(initial_prompt="p", isolation_worktree=True))
        rec = f.record(a.id)
        wt = Path(rec.working_dir)
        assert wt.parent == repo / ".caliban" / "worktrees" and re.fullmatch(
            r"[0-9a-f]{32}", wt.name
        )
        assert (wt / "README.md").read_text() == "# demo\n"
        assert f"caliban/{wt.name}" in branches(repo)
        shared = await c.spawn(SpawnSpec(initial_prompt="p"))
        assert f.record(shared.id).working_dir == str(repo)
        await c.kill(a.id)
        await wait_until(lambda: not wt.exists() and f"caliban/{wt.name}" not in branches(repo), 10)
    finally:
        await f.stop()
    assert branches(repo) == [branches(repo)[0]] and not any(
        (repo / ".caliban" / "worktrees").iterdir()
    )


async def test_worktree_outside_git_is_internal_error(tmp_path: Path, sockdir: str) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    f = await FakeCaliband.start_unix(f"{sockdir}/ctl.sock", root=plain)
    try:
        c = CalibandClient(f.endpoint)
        with pytest.raises(ProtocolError, match="worktree create"):
            await c.spawn(SpawnSpec(initial_prompt="p", isolation_worktree=True))
        reply = await raw_exchange(
            f.endpoint,
            b'{"kind":"spawn","spec":{"initial_prompt":"p","isolation_worktree":true}}\n',
        )
        assert reply[0]["error"]["kind"] == "internal"
        assert reply[0]["error"]["message"].startswith("worktree create: ")
        assert await c.list() == []
        with pytest.raises(ProtocolError, match="source resolve"):
            await c.spawn(SpawnSpec(initial_prompt="p", source="../x"))
    finally:
        await f.stop()


async def test_tcp_mode_agents_get_tcp_endpoints(certs: CertBundle) -> None:
    f = await FakeCaliband.start_tcp(
        "127.0.0.1",
        0,
        certs.cert_pem,
        certs.key_pem,
        TOKEN,
        script=scripts.text_script(2),
        start_paused=True,
    )
    try:
        sec = NetworkSecurity(ca_pem=certs.ca_pem, token=TOKEN)
        c = CalibandClient(f.endpoint, sec)
        a = await c.spawn(SpawnSpec(initial_prompt="p"))
        assert isinstance(a.endpoint, TcpEndpoint) and a.endpoint.host_port()[0] == "127.0.0.1"
        reading = asyncio.create_task(read_all(a.endpoint, sec))
        await wait_until(lambda: f.workers[a.id].active_clients == 1)
        f.workers[a.id].resume()
        lines = await reading
        assert types_of(lines)[-1] == "RunEnd"
        # agent port base: next ports in order; exhaustion is an internal error
        f.agent_port_base = f._next_port = 65536
        with pytest.raises(ProtocolError, match="agent port range exhausted"):
            await c.spawn(SpawnSpec(initial_prompt="p"))
        # the control listener drops a bad token silently
        bad = CalibandClient(f.endpoint, NetworkSecurity(ca_pem=certs.ca_pem, token="nope"))
        with pytest.raises(Exception, match=r"unreachable|closed"):
            await bad.status()
        assert f.auth_failures == 1
    finally:
        await f.stop()


async def test_tcp_agent_port_base_allocates_sequentially(certs: CertBundle) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
    f = await FakeCaliband.start_tcp(
        "127.0.0.1",
        0,
        certs.cert_pem,
        certs.key_pem,
        TOKEN,
        agent_port_base=base,
        advertise_host="localhost",
        script=scripts.text_script(1, final=False),
    )
    try:
        c = CalibandClient(f.endpoint, NetworkSecurity(ca_pem=certs.ca_pem, token=TOKEN))
        a = await c.spawn(SpawnSpec(initial_prompt="p"))
        assert a.endpoint == TcpEndpoint(addr=f"localhost:{base}")
        b = await c.spawn(SpawnSpec(initial_prompt="p"))
        assert (
            b.endpoint == TcpEndpoint(addr=f"localhost:{base + 1}")
            or f.status_of(b.id) == AgentStatus.failed
        )
    finally:
        await f.stop()


# =============================================================================================
# As a process
# =============================================================================================


async def _start_process(*args: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prospero.testkit.fake_caliband",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 20)
    if not line.startswith(b"ready "):
        err = await proc.stderr.read() if proc.stderr else b""
        raise AssertionError(f"fake caliband did not start: {line!r} {err!r}")
    return proc, line.decode().split(" ", 1)[1].strip()


async def test_process_network_mode(tmp_path: Path, certs: CertBundle) -> None:
    files = certs.write(tmp_path)
    script = tmp_path / "script.ndjson"
    scripts.dump_script(
        [*scripts.text_script(3, final=False), scripts.wait_input(), scripts.run_end()], script
    )
    proc, addr = await _start_process(
        "--listen", "127.0.0.1:0", "--tls-cert", str(files.cert), "--tls-key", str(files.key),
        "--token", TOKEN, "--script", str(script),
    )  # fmt: skip
    try:
        ep = TcpEndpoint(addr=addr)
        sec = NetworkSecurity(ca_pem=files.ca.read_bytes(), token=TOKEN)
        c = CalibandClient(ep, sec)
        a = await c.spawn(SpawnSpec(initial_prompt="p", interactive=True))
        reader, writer = await open_endpoint(a.endpoint, sec)
        assert len(await read_n(reader, 5)) == 5
        await send_one_line(a.endpoint, sec, b'{"type":"EndInput"}', drain_timeout=0.2)
        assert types_of(await read_to_eof(reader)) == ["RunEnd"]
        writer.close()
        await wait_until(lambda: _status(c, a.id, "done"), 10)
        await c.shutdown()
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _status(c: CalibandClient, agent_id: str, want: str) -> bool:
    return any(r.id == agent_id and r.status == want for r in await c.list())


async def test_process_unix_mode_and_sigterm(sockdir: str) -> None:
    path = f"{sockdir}/ctl.sock"
    proc, shown = await _start_process("--socket", path)
    try:
        assert shown == path
        st = await CalibandClient(UnixEndpoint(path=path)).status()
        assert st.pid == proc.pid
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        assert not _exists(path)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_process_network_mode_fails_closed(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "prospero.testkit.fake_caliband",
        "--listen",
        "127.0.0.1:0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "CALIBAN_DAEMON_TOKEN": ""},
    )
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 78 and b"--token" in err


# --- golden: the fake's replies carry exactly the recorded wire's keys ------------------------


def _fixture_reply(kind: str) -> dict[str, Any]:
    replies = [orjson.loads(ln) for ln in fixture_lines("control-replies.ndjson")]
    return next(r for r in replies if r["kind"] == kind)


async def test_listed_and_spawned_key_sets_match_the_recorded_wire(fake: FakeCaliband) -> None:
    """caliband echoes only its own spec fields: a spawn carrying an unknown key (as
    Prospero's `permission_posture` once did) comes back in `listed` without it, and every
    record and spec has exactly the keys of the recorded `listed` reply. No test can pass on a
    field the real wire does not carry."""
    recorded_listed = _fixture_reply("listed")
    (recorded_rec,) = recorded_listed["agents"]
    recorded_spawned = _fixture_reply("spawned")
    spec = orjson.loads(fixture_lines("spawn-specs.ndjson")[0])
    spec["permission_posture"] = "supervised"  # not a caliband field
    spec["isolation_worktree"] = False
    line = orjson.dumps({"kind": "spawn", "spec": spec}) + b"\n"
    (spawned,) = await raw_exchange(fake.endpoint, line)
    assert set(spawned) == set(recorded_spawned)
    assert set(spawned["endpoint"]) == set(recorded_spawned["endpoint"])
    assert fake.received_spec_keys[-1] == sorted(spec)  # it did arrive ...
    (listed,) = await raw_exchange(fake.endpoint, b'{"kind":"list"}\n')
    assert set(listed) == set(recorded_listed)
    (rec,) = listed["agents"]
    assert set(rec) == set(recorded_rec) == AGENT_RECORD_FIELDS
    assert set(rec["spec"]) == set(recorded_rec["spec"])  # ... and was dropped
    assert "permission_posture" not in rec["spec"] and rec["spec"]["source"] is None
    assert set(rec["endpoint"]) == set(recorded_rec["endpoint"])
    # optional caliban keys appear only when set; `drive_protocol` only for ACP (caliban 0.14)
    hooks = orjson.loads(fixture_lines("spawn-specs.ndjson")[-1])
    hooks.pop("source")  # the fake's root has no `gonzalo` checkout
    hooks["isolation_worktree"] = False
    (reply,) = await raw_exchange(
        fake.endpoint, orjson.dumps({"kind": "spawn", "spec": hooks}) + b"\n"
    )
    assert reply["kind"] == "spawned", reply
    (listed,) = await raw_exchange(fake.endpoint, b'{"kind":"list"}\n')
    last = next(a for a in listed["agents"] if a["id"] == reply["id"])
    assert set(last["spec"]) == set(recorded_rec["spec"]) | {"inherited_hooks_config"}
    assert set(last["spec"]) <= CALIBAND_SPEC_FIELDS
    acp = {"initial_prompt": "hi", "drive_protocol": "acp", "permission_posture": "supervised"}
    (reply,) = await raw_exchange(
        fake.endpoint, orjson.dumps({"kind": "spawn", "spec": acp}) + b"\n"
    )
    (listed,) = await raw_exchange(fake.endpoint, b'{"kind":"list"}\n')
    acp_rec = next(a for a in listed["agents"] if a["id"] == reply["id"])
    assert set(acp_rec) == AGENT_RECORD_FIELDS
    assert set(acp_rec["spec"]) == set(recorded_rec["spec"]) | {"drive_protocol"}
    assert acp_rec["spec"]["drive_protocol"] == "acp"
