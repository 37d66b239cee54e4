"""CalibandClient against the fake caliband over real Unix and TLS sockets (§1.3-§2)."""

from __future__ import annotations

import asyncio
import shutil
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from prospero.core.caliband_client import CalibandClient
from prospero.core.errors import (
    AgentNotFound,
    CalibandUnreachable,
    InvalidConfig,
    InvalidState,
    ProtocolError,
    TransportError,
)
from prospero.core.transport import NetworkSecurity
from prospero.core.wire.control import SpawnSpec, TcpEndpoint, UnixEndpoint
from prospero.testkit import scripts
from prospero.testkit.certs import CertBundle, make_certs, make_self_signed
from prospero.testkit.fake_caliband import FakeCaliband
from prospero.types.model import AgentStatus
from tests.support import short_tmpdir, wait_until

TOKEN = "client-test-token"


@pytest.fixture(scope="module")
def certs() -> CertBundle:
    return make_certs()


@dataclass
class Setup:
    fake: FakeCaliband
    client: CalibandClient
    security: NetworkSecurity | None


@pytest.fixture(params=["unix", "tls"])
async def setup(request: pytest.FixtureRequest, certs: CertBundle) -> AsyncIterator[Setup]:
    d = short_tmpdir()
    script = scripts.text_script(2, final=False)  # agents stay running until killed
    if request.param == "unix":
        fake = await FakeCaliband.start_unix(f"{d}/ctl.sock", script=script)
        sec = None
    else:
        fake = await FakeCaliband.start_tcp(
            "127.0.0.1", 0, certs.cert_pem, certs.key_pem, TOKEN, script=script
        )
        sec = NetworkSecurity(ca_pem=certs.ca_pem, token=TOKEN)
    try:
        yield Setup(fake, CalibandClient(fake.endpoint, sec, timeout=5.0), sec)
    finally:
        await fake.stop()
        shutil.rmtree(d, ignore_errors=True)


async def test_every_operation(setup: Setup) -> None:
    c, fake = setup.client, setup.fake
    assert await c.list() == []
    spec = SpawnSpec(
        initial_prompt="fix it", label="fixer", interactive=True, tool_allowlist=["Read", "Edit"]
    )
    spawned = await c.spawn(spec)
    assert fake.received_specs == [spec]
    if setup.security is None:
        assert isinstance(spawned.endpoint, UnixEndpoint)
    else:
        assert isinstance(spawned.endpoint, TcpEndpoint)
    (rec,) = await c.list()
    assert rec.id == spawned.id and rec.name == "fixer" and rec.spec == spec
    assert rec.status == AgentStatus.running
    assert await c.attach(spawned.id) == spawned.endpoint
    assert fake.received_attach_ids == [spawned.id]
    st = await c.status()
    assert st.agents == 1 and st.endpoint == fake.endpoint and st.uptime_secs >= 0
    with pytest.raises(InvalidState):
        await c.rm(spawned.id)
    await c.kill(spawned.id)
    assert (await c.list())[0].status == AgentStatus.killed
    new_id = await c.respawn(spawned.id)
    assert new_id != spawned.id and [r.id for r in await c.list()] == [new_id]
    await c.rm(new_id, force=True)
    assert await c.list() == []
    for op in (c.attach, c.kill, c.respawn, c.rm):
        with pytest.raises(AgentNotFound):
            await op("nope")
    await c.shutdown()
    assert fake.shutdown_count == 1
    await wait_until(lambda: not fake.accepting)
    with pytest.raises(CalibandUnreachable):
        await c.list()
    assert fake.list_count == 5


async def test_internal_error_is_protocol_error(setup: Setup) -> None:
    with pytest.raises(ProtocolError, match="worktree create"):
        await setup.client.spawn(SpawnSpec(initial_prompt="x", isolation_worktree=True))


async def test_wrong_token_is_unreachable_not_a_hang(certs: CertBundle) -> None:
    fake = await FakeCaliband.start_tcp("127.0.0.1", 0, certs.cert_pem, certs.key_pem, TOKEN)
    try:
        client = CalibandClient(fake.endpoint, NetworkSecurity(ca_pem=certs.ca_pem, token="wrong"))
        with pytest.raises(CalibandUnreachable):
            await asyncio.wait_for(client.list(), 5)
        await wait_until(lambda: fake.auth_failures == 1)
        assert fake.list_count == 0
        # TLS without any token when the server wants one: dropped as well
        client = CalibandClient(fake.endpoint, NetworkSecurity(ca_pem=certs.ca_pem))
        with pytest.raises(CalibandUnreachable):
            await asyncio.wait_for(client.status(), 15)
    finally:
        await fake.stop()


@pytest.mark.parametrize("case", ["wrong_ca", "wrong_name", "plaintext_client"])
async def test_tls_trust_failures(case: str, certs: CertBundle) -> None:
    fake = await FakeCaliband.start_tcp("127.0.0.1", 0, certs.cert_pem, certs.key_pem, TOKEN)
    try:
        if case == "wrong_ca":
            sec = NetworkSecurity(ca_pem=make_certs().ca_pem, token=TOKEN)
        elif case == "wrong_name":
            sec = NetworkSecurity(ca_pem=certs.ca_pem, server_name="other.example", token=TOKEN)
        else:
            sec = NetworkSecurity()
        with pytest.raises(TransportError) as ei:
            await asyncio.wait_for(CalibandClient(fake.endpoint, sec, timeout=2.0).status(), 15)
        if case != "plaintext_client":
            assert "TLS" in str(ei.value)
        assert fake.list_count == 0 and fake.requests == []
    finally:
        await fake.stop()


async def test_self_signed_cert_as_trust_anchor() -> None:
    cert = make_self_signed()
    fake = await FakeCaliband.start_tcp("127.0.0.1", 0, cert.cert_pem, cert.key_pem, TOKEN)
    try:
        for name in ("caliband", "localhost", "127.0.0.1"):
            sec = NetworkSecurity(ca_pem=cert.ca_pem, server_name=name, token=TOKEN)
            assert (await CalibandClient(fake.endpoint, sec).status()).agents == 0
    finally:
        await fake.stop()


async def test_plaintext_tcp_fake_without_token() -> None:
    fake = await FakeCaliband.start_tcp("127.0.0.1", 0, None, None, None)
    try:
        client = CalibandClient(fake.endpoint)
        sp = await client.spawn(SpawnSpec(initial_prompt="x"))
        assert isinstance(sp.endpoint, TcpEndpoint)
    finally:
        await fake.stop()


def _touch(path: str) -> None:
    Path(path).write_text("")


async def test_refused_connection() -> None:
    d = short_tmpdir()
    try:
        with pytest.raises(CalibandUnreachable, match="unreachable"):
            await CalibandClient(UnixEndpoint(path=f"{d}/none.sock")).list()
        _touch(f"{d}/stale.sock")  # not a socket
        with pytest.raises(CalibandUnreachable):
            await CalibandClient(UnixEndpoint(path=f"{d}/stale.sock")).list()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connect is refused
        with pytest.raises(CalibandUnreachable):
            await CalibandClient(TcpEndpoint(addr=f"127.0.0.1:{port}")).status()


async def _one_shot_server(reply: bytes) -> tuple[asyncio.Server, str, str]:
    d = short_tmpdir()
    path = f"{d}/odd.sock"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(handle, path=path)
    return server, path, d


@pytest.mark.parametrize(
    ("reply", "call", "error", "match"),
    [
        (b"this is not json\n", "list", ProtocolError, "bad caliband reply"),
        (b'{"kind":"killed"}\n', "list", ProtocolError, "answered 'killed'"),
        (b'{"kind":"listed","agents":[]}\n', "status", ProtocolError, "answered 'listed'"),
        (b'{"kind":"listed","agents":[{"id":1}]}\n', "list", ProtocolError, "bad caliband reply"),
        (b'{"kind":"mystery"}\n', "kill", ProtocolError, "bad caliband reply"),
        (b'{"kind":"status_reported"}\n', "shutdown", ProtocolError, "answered"),
        (
            b'{"kind":"error","error":{"kind":"internal","message":"boom"}}\n',
            "status",
            ProtocolError,
            "boom",
        ),
        (b'{"kind":"listed"', "list", CalibandUnreachable, "closed the connection"),  # EOF mid-line
        (b"", "list", CalibandUnreachable, "closed the connection"),
    ],
)
async def test_bad_replies(reply: bytes, call: str, error: type[Exception], match: str) -> None:
    server, path, d = await _one_shot_server(reply)
    try:
        client = CalibandClient(UnixEndpoint(path=path), timeout=5.0)
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "list": client.list,
            "status": client.status,
            "shutdown": client.shutdown,
            "kill": lambda: client.kill("a1"),
        }
        with pytest.raises(error, match=match):
            await calls[call]()
    finally:
        server.close()
        shutil.rmtree(d, ignore_errors=True)


async def test_silent_server_times_out_as_unreachable() -> None:
    d = short_tmpdir()
    path = f"{d}/silent.sock"
    hold = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await hold.wait()
        writer.close()

    server = await asyncio.start_unix_server(handle, path=path)
    try:
        with pytest.raises(CalibandUnreachable, match="did not answer"):
            await CalibandClient(UnixEndpoint(path=path), timeout=0.2).status()
    finally:
        hold.set()
        server.close()
        shutil.rmtree(d, ignore_errors=True)


def test_token_without_ca_is_invalid_config() -> None:
    with pytest.raises(InvalidConfig, match="without TLS"):
        NetworkSecurity(token="t")
