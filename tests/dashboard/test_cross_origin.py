"""A hostile page in a real Chromium cannot drive prosperod (issue 10; api/guard.py).

Pages served from ANOTHER origin — a tiny HTTP server on another port, reached as
`http://evil.test:PORT` (mapped to 127.0.0.1 with `--host-resolver-rules`, so it is cross-site)
and as `http://127.0.0.1:PORT` (same-site, another port) — try every request a page can send
without a CORS preflight (form POSTs, a JSON-looking text/plain form, no-cors fetch, sendBeacon,
fetch with credentials) and the preflighted ones (JSON fetch, DELETE). A rebound name
(`rebind.attacker.example` mapped to 127.0.0.1 on prosperod's own port) is refused with 421,
both as a navigation and from a page the attacker served first. Every verdict is asserted on
the server side: a recorder outside every middleware sees each request arrive and its status,
the agents keep running, no Kill/Respawn/Spawn reaches the fake caliband. The real dashboard,
same-origin, still kills an agent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from playwright.async_api import Browser, async_playwright, expect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prospero.api.app import create_app
from prospero.api.server import ApiServer
from prospero.api.settings import ApiSettings
from tests.dashboard.conftest import CHROMIUM, CHROMIUM_ARGS, HAVE_CHROMIUM, WAIT, StackFactory
from tests.support import wait_until

EVIL = "evil.test"
REBIND = "rebind.attacker.example"
RESOLVER = f"--host-resolver-rules=MAP {EVIL} 127.0.0.1, MAP {REBIND} 127.0.0.1"
# Chromium's Local Network Access checks would stop a page it believes public (the rebinding
# page, fulfilled by the test) from reaching 127.0.0.1 at all. Other browsers have no such
# check, and prosperod must not depend on it: off, so every request does reach the server.
NO_LNA = "--disable-features=LocalNetworkAccessChecks"
# Bound (s) for the server to see requests a page fired without waiting for an answer.
ARRIVAL = 15.0
ATTACK_PAGE = (
    b"<!doctype html><html><head><title>totally harmless</title></head><body></body></html>"
)


@dataclass
class Seen:
    method: str
    path: str
    query: str
    status: int
    origin: str | None
    site: str | None


class Recorder:
    """Outermost ASGI middleware: what reached prosperod and what it answered."""

    def __init__(self, app: ASGIApp, seen: list[Seen]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode(): v.decode("latin-1") for k, v in scope["headers"]}

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.seen.append(
                    Seen(
                        scope["method"],
                        scope["path"],
                        scope["query_string"].decode(),
                        int(message["status"]),
                        headers.get("origin"),
                        headers.get("sec-fetch-site"),
                    )
                )
            await send(message)

        await self.app(scope, receive, wrapped)


async def _attacker_server() -> asyncio.Server:
    """Answers every request with the (empty) attack page; the tests run their script in it."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ARRIVAL)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n"
                + f"Content-Length: {len(ATTACK_PAGE)}\r\n\r\n".encode()
                + ATTACK_PAGE
            )
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.fixture
async def rebinding_browser() -> AsyncIterator[Browser]:
    assert HAVE_CHROMIUM, f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)"
    async with async_playwright() as p:
        b = await p.chromium.launch(
            executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, RESOLVER, NO_LNA]
        )
        try:
            yield b
        finally:
            await b.close()


@dataclass
class Target:
    url: str
    port: int
    seen: list[Seen] = field(default_factory=list)

    def via(self, tag: str) -> list[Seen]:
        return [s for s in self.seen if s.query == f"via={tag}"]


@pytest.fixture
async def target(make_stack: StackFactory) -> AsyncIterator[tuple[Any, Target]]:
    """A dashboard stack plus a second prosperod app over the same runtime, wrapped in the
    recorder: that one is the target of every attack (and serves the real dashboard)."""
    stack = await make_stack()
    app = create_app(stack.runtime, ApiSettings(access_log=False))
    seen: list[Seen] = []
    app.add_middleware(Recorder, seen=seen)  # the last one added is the outermost
    server = ApiServer(app, "127.0.0.1", 0, graceful_timeout=2)
    await server.start()
    try:
        yield stack, Target(server.url, server.port, seen)
    finally:
        await server.stop()


ATTACKS = """async ({target, kill, respawn, endInput}) => {
  const frame = (name) => {
    const f = document.createElement('iframe');
    f.name = name;
    document.body.appendChild(f);
  };
  const form = (name, action, fields, enctype) => {
    frame(name);
    const f = document.createElement('form');
    f.method = 'POST';
    f.action = action;
    f.target = name;
    if (enctype) f.enctype = enctype;
    for (const [k, v] of Object.entries(fields)) {
      const i = document.createElement('input');
      i.name = k;
      i.value = v;
      f.appendChild(i);
    }
    document.body.appendChild(f);
    f.submit();
  };
  const result = {};
  const attempt = async (tag, url, init) => {
    try {
      const r = await fetch(url, init);
      result[tag] = r.type === 'opaque' ? 'opaque' : r.status;
    } catch (e) {
      result[tag] = 'blocked';
    }
  };
  form('f1', `${kill}?via=form-kill`, {a: '1'});
  form('f2', `${respawn}?via=form-respawn`, {});
  // The classic JSON CSRF: a text/plain form whose body parses as JSON.
  form('f3', `${target}/api/workspaces/ws/agents?via=form-spawn`,
       {'{"prompt":"pwned","isolation":"shared","x":"': '"}'}, 'text/plain');
  result.beacon = navigator.sendBeacon(`${endInput}?via=beacon`, 'x');
  try {
    result.beaconJson = navigator.sendBeacon(`${endInput}?via=beacon-json`,
      new Blob(['{}'], {type: 'application/json'}));
  } catch (e) {
    result.beaconJson = 'threw';
  }
  await attempt('nocors', `${kill}?via=nocors`, {method: 'POST', mode: 'no-cors'});
  await attempt('credentials', `${respawn}?via=credentials`,
                {method: 'POST', mode: 'no-cors', credentials: 'include'});
  await attempt('corsText', `${target}/api/workspaces/ws/agents?via=cors-text`,
                {method: 'POST', credentials: 'include', headers: {'Content-Type': 'text/plain'},
                 body: '{"prompt":"pwned","isolation":"shared"}'});
  await attempt('corsJson', `${target}/api/workspaces/ws/agents?via=cors-json`,
                {method: 'POST', credentials: 'include',
                 headers: {'Content-Type': 'application/json'},
                 body: '{"prompt":"pwned","isolation":"shared"}'});
  await attempt('corsHeader', `${kill}?via=cors-header`,
                {method: 'POST', headers: {'X-Prospero-Client': 'dashboard'}});
  await attempt('corsDelete', `${kill.replace('/kill', '')}?via=cors-delete`,
                {method: 'DELETE'});
  return result;
}"""

# Sent without a preflight, so they reach prosperod: each must be answered 403.
SIMPLE = ("form-kill", "form-respawn", "form-spawn", "beacon", "nocors", "credentials", "cors-text")
# Need a CORS preflight that prosperod never grants: the request itself must never arrive.
PREFLIGHTED = ("cors-json", "cors-header", "cors-delete", "beacon-json")


async def _agents(stack: Any) -> list[str]:
    fleet = (await stack.client.get("/api/fleet")).json()
    return sorted(a["id"] for w in fleet["workspaces"] for a in w["agents"])


def _control_requests(stack: Any) -> list[str]:
    names = ("KillReq", "RespawnReq", "SpawnReq", "RmReq")
    return [type(q).__name__ for q in stack.fakes["ws"].requests if type(q).__name__ in names]


@pytest.mark.parametrize("attacker", [EVIL, "127.0.0.1"], ids=["cross-site", "same-site"])
async def test_another_origin_cannot_mutate(
    target: tuple[Any, Target], rebinding_browser: Browser, attacker: str
) -> None:
    stack, t = target
    slow = await stack.spawn("slow: run until killed", label="victim")
    chat = await stack.spawn("hello", label="chat", interactive=True)
    await stack.wait_status(slow, "running")
    await stack.wait_status(chat, "idle")
    chat_status = await stack.status(chat)
    agents_before = await _agents(stack)
    control_before = _control_requests(stack)

    evil = await _attacker_server()
    try:
        evil_port = evil.sockets[0].getsockname()[1]
        ctx = await rebinding_browser.new_context()
        ctx.set_default_timeout(WAIT)
        page = await ctx.new_page()
        resp = await page.goto(f"http://{attacker}:{evil_port}/")
        assert resp is not None and resp.ok
        result = await page.evaluate(
            ATTACKS,
            {
                "target": t.url,
                "kill": f"{t.url}/api/agents/{slow}/kill",
                "respawn": f"{t.url}/api/agents/{slow}/respawn",
                "endInput": f"{t.url}/api/agents/{chat}/end-input",
            },
        )

        await wait_until(
            lambda: all(t.via(tag) for tag in SIMPLE),
            ARRIVAL,
            interval=0.05,
            what=f"simple requests arrived: {[s.query for s in t.seen]}",
        )
        await ctx.close()
    finally:
        evil.close()
        await evil.wait_closed()

    expected_site = "cross-site" if attacker == EVIL else "same-site"
    for tag in SIMPLE:
        arrived = t.via(tag)
        assert [s.method for s in arrived] == ["POST"], (tag, arrived)
        assert arrived[0].status == 403, (tag, arrived)
        assert arrived[0].site == expected_site, (tag, arrived)
        assert arrived[0].origin == f"http://{attacker}:{evil_port}", (tag, arrived)
    for tag in PREFLIGHTED:
        assert [s for s in t.via(tag) if s.method != "OPTIONS"] == [], tag
    # What the page saw: nothing readable, the preflighted requests failed.
    assert result["nocors"] == result["credentials"] == "opaque", result
    for tag in ("corsText", "corsJson", "corsHeader", "corsDelete"):
        assert result[tag] == "blocked", result
    assert result["beacon"] is True, result  # queued: it was sent, and refused (above)

    # Server side: nothing happened.
    assert await stack.status(slow) == "running"
    assert await stack.status(chat) == chat_status
    assert await _agents(stack) == agents_before
    assert _control_requests(stack) == control_before


async def test_a_rebound_name_is_refused(
    target: tuple[Any, Target], rebinding_browser: Browser
) -> None:
    stack, t = target
    agents_before = await _agents(stack)
    rebound = f"http://{REBIND}:{t.port}"
    ctx = await rebinding_browser.new_context()
    ctx.set_default_timeout(WAIT)
    page = await ctx.new_page()

    # Once the name points at 127.0.0.1, loading it reaches prosperod, which refuses it.
    resp = await page.goto(f"{rebound}/")
    assert resp is not None and resp.status == 421
    assert "host_not_allowed" in await page.content()

    # The attack proper: the page was served while the name still pointed at the attacker
    # (simulated by fulfilling the document), then its same-origin requests go to prosperod.
    # To the browser they are same-origin (and, on plain http, carry no Sec-Fetch-* headers):
    # only the Host header gives them away.
    async def first_answer(route: Any) -> None:
        await route.fulfill(status=200, content_type="text/html", body=ATTACK_PAGE)

    await page.route(f"{rebound}/attack", first_answer)
    await page.goto(f"{rebound}/attack")
    seen = await page.evaluate(
        """async () => {
          const out = {};
          out.fleet = (await fetch('/api/fleet?via=rebind-read')).status;
          out.spawn = (await fetch('/api/workspaces/ws/agents?via=rebind-spawn', {
            method: 'POST', headers: {'Content-Type': 'application/json'},
            body: JSON.stringify({prompt: 'pwned', isolation: 'shared'})})).status;
          return out;
        }"""
    )
    await ctx.close()
    assert seen == {"fleet": 421, "spawn": 421}
    for tag in ("rebind-read", "rebind-spawn"):
        arrived = t.via(tag)
        # (Chromium retries a request once on a new connection after a 421.)
        assert arrived and {s.status for s in arrived} == {421}, (tag, arrived)
    assert await _agents(stack) == agents_before
    assert "SpawnReq" not in _control_requests(stack)


async def test_the_dashboard_still_kills_same_origin(
    target: tuple[Any, Target], rebinding_browser: Browser
) -> None:
    stack, t = target
    agent = await stack.spawn("slow: run until killed", label="to-kill")
    await stack.wait_status(agent, "running")
    ctx = await rebinding_browser.new_context()
    ctx.set_default_timeout(WAIT)
    page = await ctx.new_page()
    await page.goto(f"{t.url}/#/agents/{agent}")
    await expect(page.locator(".agent-status .pill")).to_have_text("running")
    await page.locator('[data-action="kill"]').click()
    await page.locator('dialog.modal [data-action="confirm"]').click()
    await expect(page.locator(".agent-status .pill")).to_have_text("killed")
    await ctx.close()
    assert await stack.status(agent) == "killed"
    kills = [s for s in t.seen if s.method == "POST" and s.path.endswith("/kill")]
    assert [(s.status, s.site) for s in kills] == [(202, "same-origin")], kills
    assert kills[0].origin == t.url
