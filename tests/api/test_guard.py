"""The Host allowlist (DNS rebinding) and the same-origin guard on state-changing requests
(api/guard.py; issue 10), over real sockets against a real stack.

Probe used throughout: a body-less `POST /api/agents/nope/kill`. Past the guards it is a 404
(`not_found`); refused it is 421 `host_not_allowed` or 403 `cross_origin`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from prospero.api.app import create_app
from prospero.api.guard import (
    HostPolicy,
    has_non_simple_property,
    normalize_host,
    same_origin_evidence,
)
from prospero.api.server import ApiServer
from prospero.api.settings import ApiSettings
from prospero.daemon.config import ConfigError, load_config
from prospero.daemon.main import serve
from prospero.daemon.runtime import DaemonConfig
from tests.api.conftest import Stack
from tests.support import wait_until

PROBE = "/api/agents/nope/kill"
CLIENT = {"X-Prospero-Client": "test"}
# Bound on a raw-socket exchange with the server.
RAW_TIMEOUT = 10.0

ServeFactory = Callable[..., Awaitable[str]]


@pytest.fixture
async def serve_app(stack: Stack) -> AsyncIterator[ServeFactory]:
    """Serve another app over the stack's runtime with the given ApiSettings fields; returns
    its base URL."""
    servers: list[ApiServer] = []

    async def factory(**fields: Any) -> str:
        app = create_app(stack.runtime, ApiSettings(access_log=False, **fields))
        server = ApiServer(app, "127.0.0.1", 0, graceful_timeout=2)
        await server.start()
        servers.append(server)
        return server.url

    yield factory
    for s in servers:
        await s.stop()


def kind(r: httpx.Response) -> str:
    return str(r.json().get("kind"))


async def probe(url: str, headers: dict[str, str], method: str = "POST") -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        return await c.request(method, PROBE, headers=headers)


async def raw(url: str, request: bytes) -> bytes:
    """Send `request` on a fresh connection; the whole answer (the server closes or we stop
    at the end of the first response's headers + a short body)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), RAW_TIMEOUT)
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await asyncio.wait_for(reader.readexactly(length), RAW_TIMEOUT)
        return head + body
    finally:
        writer.close()


# ------------------------------------------------------------------------------ Host allowlist


async def test_the_issues_rebinding_curl_gets_421_and_spawns_nothing(stack: Stack) -> None:
    port = stack.url.rsplit(":", 1)[1]
    r = await stack.client.post(
        "/api/workspaces/ws/agents",
        json={"prompt": "x"},
        headers={"Host": f"rebind.attacker.example:{port}"},
    )
    assert r.status_code == 421, r.text
    assert kind(r) == "host_not_allowed"
    assert "rebind.attacker.example" in r.json()["error"]
    assert "--allowed-host" in r.json()["error"]
    for path in ("/api/fleet", "/", "/ui/app.js", "/healthz", "/openapi.json"):
        r = await stack.client.get(path, headers={"Host": f"rebind.attacker.example:{port}"})
        assert r.status_code == 421, (path, r.status_code)
    fleet = (await stack.client.get("/api/fleet")).json()
    assert [a for w in fleet["workspaces"] for a in w["agents"]] == []
    assert stack.fake.received_specs == []


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:7878",
        "LOCALHOST:1",
        "localhost.",
        "127.0.0.1",
        "127.0.0.1:80",
        "127.9.8.7:7878",
        "[::1]",
        "[::1]:7878",
        "::1",
        "[::ffff:127.0.0.1]:7878",
    ],
)
async def test_every_loopback_form_is_allowed(stack: Stack, host: str) -> None:
    r = await stack.client.get("/api/fleet", headers={"Host": host})
    assert r.status_code == 200, (host, r.text)
    r = await stack.client.post(PROBE, headers={"Host": host})
    assert r.status_code == 404, (host, r.text)


@pytest.mark.parametrize(
    "host",
    [
        "rebind.attacker.example",
        "localhost.attacker.example:7878",
        "app.localhost",
        "127.0.0.1.nip.io",
        "10.1.2.3:7878",
        "[fe80::1]",
        "evil.test:7878:1",
        "bad_host!",
        "",
    ],
)
async def test_other_hosts_are_refused(stack: Stack, host: str) -> None:
    r = await stack.client.get("/api/fleet", headers={"Host": host})
    assert r.status_code == 421, (host, r.text)
    assert kind(r) == "host_not_allowed"


async def test_missing_or_repeated_host_is_refused(stack: Stack) -> None:
    answer = await raw(stack.url, b"GET /api/fleet HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 421 "), answer[:200]
    assert b'"kind":"host_not_allowed"' in answer
    answer = await raw(
        stack.url,
        b"GET /api/fleet HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n",
    )
    assert answer.split(b" ", 2)[1] in (b"400", b"421"), answer[:200]


async def test_allowed_hosts_names_and_wildcards(serve_app: ServeFactory) -> None:
    url = await serve_app(allowed_hosts=["prospero.lan", "*.corp.example", "192.0.2.7"])
    ok = ["prospero.lan", "PROSPERO.LAN:7878", "a.corp.example", "a.b.corp.example:1", "192.0.2.7"]
    for host in ok:
        r = await probe(url, {**CLIENT, "Host": host})
        assert r.status_code == 404, (host, r.text)
    for host in ("corp.example", "xcorp.example", "evilprospero.lan", "prospero.lan.evil.test"):
        r = await probe(url, {**CLIENT, "Host": host})
        assert r.status_code == 421, (host, r.text)
    # loopback keeps working next to the configured names
    assert (await probe(url, {**CLIENT, "Host": "localhost"})).status_code == 404


async def test_public_origin_allows_its_host_and_counts_as_same_origin(
    serve_app: ServeFactory,
) -> None:
    url = await serve_app(public_origins=["https://prospero.example.com"])
    host = {"Host": "prospero.example.com"}
    assert (await probe(url, {**CLIENT, **host})).status_code == 404
    # Behind a TLS proxy: the request arrives over http, the browser's Origin is https.
    ok = {**CLIENT, **host, "Origin": "https://prospero.example.com"}
    assert (await probe(url, ok)).status_code == 404
    bad = {**CLIENT, **host, "Origin": "https://prospero.example.com:8443"}
    r = await probe(url, bad)
    assert r.status_code == 403 and kind(r) == "cross_origin"
    r = await probe(url, {**CLIENT, "Host": "other.example.com"})
    assert r.status_code == 421


async def test_star_disables_the_host_check(serve_app: ServeFactory) -> None:
    url = await serve_app(allowed_hosts=["*"])
    r = await probe(url, {**CLIENT, "Host": "rebind.attacker.example"})
    assert r.status_code == 404, r.text
    answer = await raw(url, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def test_host_policy_rejects_bad_patterns() -> None:
    for bad in ("bad host", "*.", "http://x", "a..b"):
        with pytest.raises(ValueError):
            HostPolicy([bad])
    assert normalize_host("[::1]") == "::1"
    assert normalize_host("Example.COM.") == "example.com"
    assert normalize_host("0:0:0:0:0:0:0:1") == "::1"


# ------------------------------------------------------------------------------ same origin


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 404),
        ({"Sec-Fetch-Site": "same-origin"}, 404),
        ({"Sec-Fetch-Site": "none"}, 404),
        ({"Sec-Fetch-Site": "same-site"}, 403),
        ({"Sec-Fetch-Site": "cross-site"}, 403),
        ({"Sec-Fetch-Site": "bogus"}, 403),
        ({"Origin": "{own}"}, 404),
        ({"Origin": "{own}", "Sec-Fetch-Site": "same-origin"}, 404),
        ({"Origin": "{own}", "Sec-Fetch-Site": "cross-site"}, 403),
        ({"Origin": "null"}, 403),
        ({"Origin": "http://evil.test"}, 403),
        ({"Origin": "http://127.0.0.1:1"}, 403),
        ({"Origin": "https://{hostport}"}, 403),
        ({"Origin": "http://localhost:{port}"}, 403),  # not the Host this request names
        ({"Origin": "not a url"}, 403),
    ],
)
async def test_origin_and_fetch_metadata_matrix(
    stack: Stack, headers: dict[str, str], status: int
) -> None:
    hostport = stack.url.removeprefix("http://")
    port = hostport.rsplit(":", 1)[1]
    sent = {k: v.format(own=stack.url, hostport=hostport, port=port) for k, v in headers.items()}
    r = await stack.client.post(PROBE, headers=sent)
    assert r.status_code == status, (sent, r.text)
    if status == 403:
        assert kind(r) == "cross_origin"
        assert "cross-origin" in r.json()["error"]
    # reads are never refused for their origin
    r = await stack.client.get("/api/fleet", headers=sent)
    assert r.status_code == 200, (sent, r.text)


async def test_own_origin_follows_the_host_header(stack: Stack) -> None:
    port = stack.url.rsplit(":", 1)[1]
    headers = {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
    assert (await stack.client.post(PROBE, headers=headers)).status_code == 404


async def test_body_less_post_needs_a_non_simple_property(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as bare:
        for headers in (
            {},
            {"Content-Type": "text/plain"},
            {"Content-Type": "application/x-www-form-urlencoded"},
            {"Content-Type": "multipart/form-data; boundary=x"},
            {"X-Prospero-Client": ""},
            {"Authorization": "Basic dXNlcjpwYXNz"},
        ):
            r = await bare.post(PROBE, headers=headers)
            assert r.status_code == 403, (headers, r.text)
            assert kind(r) == "cross_origin"
            msg = r.json()["error"]
            assert "Content-Type: application/json" in msg and "X-Prospero-Client" in msg
        for method in ("DELETE", "PUT", "PATCH"):
            r = await bare.request(method, "/api/agents/nope")
            assert r.status_code == 403, (method, r.text)
        for headers in (
            {"X-Prospero-Client": "cli"},
            {"Content-Type": "application/json"},
            {"Content-Type": "Application/JSON; charset=utf-8"},
            {"Content-Type": "application/merge-patch+json"},
            {"Authorization": "Bearer whatever"},
        ):
            r = await bare.post(PROBE, headers=headers)
            assert r.status_code == 404, (headers, r.text)
        # a JSON mutation needs nothing else (what every existing JSON client sends)
        r = await bare.post(
            "/api/workspaces/ws/agents", json={"prompt": "x", "isolation": "shared"}
        )
        assert r.status_code == 201, r.text
        # GET, HEAD and OPTIONS are not state-changing
        assert (await bare.get("/api/fleet")).status_code == 200
        assert (await bare.request("OPTIONS", PROBE)).status_code != 403


async def test_a_cross_site_form_post_is_refused_before_anything_runs(stack: Stack) -> None:
    agent = await stack.spawn("slow")
    await stack.wait_status(agent, "running")
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as bare:
        form = {
            "Content-Type": "application/x-www-form-urlencoded",
            "Origin": "http://evil.test",
            "Sec-Fetch-Site": "cross-site",
        }
        for path in (f"/api/agents/{agent}/kill", f"/api/agents/{agent}/respawn"):
            r = await bare.post(path, headers=form, content=b"a=1")
            assert r.status_code == 403 and kind(r) == "cross_origin", r.text
    assert (await stack.client.get(f"/api/agents/{agent}")).json()["status"] == "running"
    names = {type(q).__name__ for q in stack.fake.requests}
    assert not names & {"KillReq", "RespawnReq"}, names


def _scope(headers: dict[str, str], scheme: str = "http") -> dict[str, Any]:
    return {
        "type": "http",
        "scheme": scheme,
        "method": "POST",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }


def test_same_origin_evidence() -> None:
    host = {"Host": "127.0.0.1:7878"}
    assert same_origin_evidence(_scope({**host, "Sec-Fetch-Site": "same-origin"}))
    assert same_origin_evidence(_scope({**host, "Origin": "http://127.0.0.1:7878"}))
    assert not same_origin_evidence(_scope(host))  # no evidence either way: not positive
    assert not same_origin_evidence(_scope({**host, "Sec-Fetch-Site": "none"}))
    assert not same_origin_evidence(_scope({**host, "Origin": "http://evil.test"}))
    assert not same_origin_evidence(_scope({**host, "Origin": "null"}))
    assert not same_origin_evidence(
        _scope({**host, "Origin": "http://127.0.0.1:7878", "Sec-Fetch-Site": "cross-site"})
    )
    proxied = _scope({"Host": "p.example.com", "Origin": "https://p.example.com"})
    assert not same_origin_evidence(proxied)
    assert same_origin_evidence(proxied, ["https://p.example.com"])
    # the verdict OriginGuard recorded wins
    assert same_origin_evidence({**proxied, "state": {"same_origin": True}})
    assert has_non_simple_property(_scope({"X-Prospero-Client": "dashboard"}))
    assert not has_non_simple_property(_scope({"Content-Type": "text/plain"}))


# ------------------------------------------------------------------------------ configuration


def test_config_allowed_hosts_and_public_url(tmp_path: Path) -> None:
    cfg = load_config(
        ["--allowed-host", "prospero.lan", "--allowed-host", "*.corp.example"], environ={}
    )
    assert cfg.allowed_hosts == ["prospero.lan", "*.corp.example"]
    assert cfg.public_url is None
    cfg = load_config([], environ={"PROSPERO_ALLOWED_HOSTS": "a.lan, b.lan,"})
    assert cfg.allowed_hosts == ["a.lan", "b.lan"]
    toml = tmp_path / "p.toml"
    toml.write_text('allowed_host = ["t.lan"]\npublic_url = "https://P.example.com:8443/x/"\n')
    cfg = load_config(["--config", str(toml)], environ={})
    assert cfg.allowed_hosts == ["t.lan"]
    assert cfg.public_url == "https://p.example.com:8443"
    for argv in (
        ["--allowed-host", "bad host"],
        ["--allowed-host", "http://x.lan"],
        ["--public-url", "ftp://x.lan"],
        ["--public-url", "x.lan"],
    ):
        with pytest.raises(ConfigError):
            load_config(argv, environ={})


async def test_prosperod_serves_the_configured_names(tmp_path: Path) -> None:
    config = DaemonConfig(
        bind_host="127.0.0.1",
        port=0,
        data_dir=tmp_path / "data",
        autostart=False,
        allowed_hosts=["prospero.lan"],
        public_url="https://p.example.com",
    )
    stop = asyncio.Event()
    urls: list[str] = []
    task = asyncio.create_task(
        serve(
            config,
            stop_event=stop,
            install_signal_handlers=False,
            on_ready=lambda s: urls.append(s.url),
        )
    )
    try:
        await wait_until(lambda: bool(urls) or task.done(), 20, what="prosperod ready")
        assert urls, task.result()
        async with httpx.AsyncClient(base_url=urls[0], timeout=10) as c:
            for host, status in (
                ("prospero.lan:7878", 200),
                ("p.example.com", 200),
                ("localhost", 200),
                ("evil.test", 421),
            ):
                r = await c.get("/api/fleet", headers={"Host": host})
                assert r.status_code == status, (host, r.text)
            r = await c.post(
                PROBE,
                headers={**CLIENT, "Host": "p.example.com", "Origin": "https://p.example.com"},
            )
            assert r.status_code == 404, r.text
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 20) == 0
