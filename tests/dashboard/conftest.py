"""Browser tests of the dashboard: a real prosperod stack (Runtime + uvicorn on an ephemeral
port + fake calibands on the Unix sockets discovery expects) driven by Debian's Chromium
through Playwright (its pip package bundles the driver; browsers are never downloaded).

Agents play scripts chosen by their prompt's first word (`paced:`, `xss:`, `slow:`, `tools:`,
`review:`, `mdxss:`), so a label stays free for the tests (the XSS test puts markup in it). ACP
agents (stacks made with `allow_acp=True`, spawned with `drive_protocol="acp"`) play the
scripted ACP peer's sessions chosen the same way (`ask:`, `twice:`, `review:`; see
`acp_script_for`).

Screenshots go to build/screenshots/; with PROSPERO_DOC_SHOTS=1, `Session.doc_shot` also
writes the ones the docs show to docs/screenshots/ (committed; regenerated on demand, so a
test run does not rewrite them).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, ConsoleMessage, Locator, Page, async_playwright, expect

from prospero.api.app import create_app
from prospero.api.server import ApiServer
from prospero.api.settings import ApiSettings
from prospero.core.discovery import socket_path_for
from prospero.core.sources import canonical_root
from prospero.core.tokens import TokenTable
from prospero.core.wire.control import SpawnSpec
from prospero.daemon.runtime import DaemonConfig, Runtime
from prospero.testkit import acp_scripts as acp
from prospero.testkit import scripts
from prospero.testkit.fake_caliband import FakeCaliband
from tests.dashboard import review_scripts as review
from tests.support import REPO, short_tmpdir, wait_until

CHROMIUM = "/usr/bin/chromium"
HAVE_CHROMIUM = Path(CHROMIUM).exists()
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = REPO / "build" / "screenshots"
DOC_SHOTS = REPO / "docs" / "screenshots" if os.environ.get("PROSPERO_DOC_SHOTS") == "1" else None
# Playwright waits (ms): generous for a loaded CI box, still bounded.
WAIT = 15_000
expect.set_options(timeout=WAIT)

MODEL = "claude-sonnet-4-6"

# Markup that would run script if it were ever parsed as HTML. Every payload sets
# window.__xss (or calls alert) when it executes.
XSS = [
    "<script>window.__xss=1;alert('xss1')</script>",
    '<img src=x onerror="window.__xss=2;alert(2)">',
    '<a href="javascript:window.__xss=3">click me</a>',
    '<svg onload="window.__xss=4"><circle r=5></circle></svg>',
    '<iframe src="javascript:window.__xss=5"></iframe>',
    '"><script>window.__xss=6</script><"',
    "</pre></div><script>window.__xss=7</script>",
    "<style>body{display:none}</style>",
    '<details open ontoggle="window.__xss=8">x</details>',
    '<math><mtext><table><mglyph><style><img src=x onerror="window.__xss=10">',
    "javascript:window.__xss=11",
    '<object data="javascript:window.__xss=12"></object>',
    '<input autofocus onfocus="window.__xss=13">',
]


# ----------------------------------------------------------------------------- scripts


def paced_script(n: int, pace: float = 0.03, *, gate: bool = False) -> scripts.Script:
    """Thinking, then `n` text lines with a pause after each and a tool call halfway: a run
    that takes about n * pace seconds, for watching it fill live. `gate` (interactive spawns):
    the run then waits for input and ends on EndInput, so a test decides when it finishes."""
    out: scripts.Script = [
        scripts.turn_start(0, model=MODEL),
        scripts.thinking_delta("Plan: write the lines, run the tests halfway.", 0, 0),
    ]
    half = n // 2
    for i in range(half):
        out += [scripts.text_delta(f"line {i + 1:04d}\n", 0, 1), scripts.sleep(pace)]
    tool_input = {"command": "pytest -q tests/unit", "timeout": 120}
    args = json.dumps(tool_input)
    out += [
        scripts.tool_call_start("toolu_paced", "Bash", 0),
        scripts.tool_call_input_delta("toolu_paced", args[:10], 0),
        scripts.tool_call_input_delta("toolu_paced", args[10:], 0),
        scripts.sleep(pace),
        scripts.tool_call_end("toolu_paced", "....\n4 passed in 0.02s", turn_index=0),
        scripts.turn_end(0, stop_reason="tool_use", input_tokens=1200, output_tokens=80),
        scripts.turn_start(1, model=MODEL),
    ]
    for i in range(half, n):
        out += [scripts.text_delta(f"line {i + 1:04d}\n", 1, 0), scripts.sleep(pace)]
    out.append(scripts.turn_end(1, input_tokens=300, output_tokens=40))
    if gate:
        out.append(scripts.wait_input())
    out.append(scripts.run_end("EndOfTurn", turn_count=2, input_tokens=1500, output_tokens=120))
    return out


def xss_script() -> scripts.Script:
    """The XSS corpus in text deltas, thinking, a tool's name, input and result."""
    out: scripts.Script = [scripts.turn_start(0, model=MODEL)]
    out.append(scripts.thinking_delta("thinking " + " ".join(XSS), 0, 0))
    for i, p in enumerate(XSS):
        out.append(scripts.text_delta(f"{p}\n", 0, 1 + i % 2))
        if i == 3:  # a thinking block between text blocks
            out.append(scripts.thinking_delta(p, 0, 0))
    payload_input = {"command": XSS[0], "path": XSS[1], XSS[6]: XSS[2], "list": XSS}
    args = json.dumps(payload_input)
    out += [
        scripts.tool_call_start("toolu_xss", "Bash" + XSS[1], 0),
        scripts.tool_call_input_delta("toolu_xss", args, 0),
        scripts.tool_call_end("toolu_xss", "\n".join(XSS), is_error=True, turn_index=0),
        scripts.turn_end(0, stop_reason="tool_use"),
        scripts.turn_start(1, model=MODEL),
        scripts.text_delta("done " + XSS[0], 1, 0),
        scripts.turn_end(1),
        scripts.run_end("EndOfTurn", turn_count=2),
    ]
    return out


def script_for(spec: SpawnSpec) -> scripts.Script:
    word = (spec.initial_prompt or "").split(":", 1)[0].strip()
    if word == "paced":
        return paced_script(80, gate=spec.interactive)
    if word == "long":
        return paced_script(150, gate=spec.interactive)
    if spec.interactive:
        return scripts.interactive_script("Ready. What next?")
    if word == "xss":
        return xss_script()
    if word == "slow":
        return [
            *scripts.text_script(1, final=False),
            scripts.sleep(60),
            scripts.run_end("EndOfTurn"),
        ]
    if word == "tools":
        return scripts.tool_run_script(model=MODEL)
    if word == "review":
        return review.review_script()
    if word == "mdxss":
        return review.md_xss_script()
    return scripts.text_script(3)


# ACP: a tool call that asks permission (session/request_permission with the four default
# options: Allow once, Allow always, Reject once, Reject always).
ASK_TITLE = "Run the test suite"
ASK_INPUT = {"command": "make test", "timeout": 120}


def ask_steps(tid: str, title: str = ASK_TITLE, raw_input: Any = None) -> list[acp.Step]:
    raw = raw_input if raw_input is not None else ASK_INPUT
    return [
        acp.tool_call(tid, title, "execute", raw_input=raw, status="pending"),
        acp.permission(
            tid,
            title=title,
            kind="execute",
            raw_input=raw,
            on_allow=[
                acp.tool_update(tid, status="completed", raw_output="4 passed"),
                acp.text(f" {tid} ran."),
            ],
            on_reject=[
                acp.tool_update(tid, status="failed", raw_output="Permission denied"),
                acp.text(f" {tid} skipped."),
            ],
        ),
    ]


def acp_script_for(spec: SpawnSpec, root: str = "") -> acp.AcpScript:
    """`ask:` one permission request; `twice:` the same request twice in one session (the
    second comes after the first is answered); `review:` a write and an edit with ACP diff
    content (the edit asks); anything else: echo the prompt."""
    word = (spec.initial_prompt or "").split(":", 1)[0].strip()
    if word == "review":
        return review.acp_review_script(root)
    if word == "ask":
        return acp.AcpScript(
            turns=[[acp.text("Checking."), *ask_steps("call_run"), acp.stop("end_turn")]]
        )
    if word == "twice":
        return acp.AcpScript(
            turns=[
                [
                    acp.text("Checking."),
                    *ask_steps("call_1"),
                    *ask_steps("call_2"),
                    acp.stop("end_turn"),
                ]
            ]
        )
    return acp.AcpScript()


# ------------------------------------------------------------------------------- stack


@dataclass
class DashStack:
    tmp: Path
    runtime: Runtime
    server: ApiServer
    client: httpx.AsyncClient
    fakes: dict[str, FakeCaliband] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    async def add_workspace(self, name: str, *, fake: bool = True) -> None:
        root = self.tmp / name
        root.mkdir(exist_ok=True)
        canon = canonical_root(str(root))
        if fake:
            self.fakes[name] = await FakeCaliband.start_unix(
                socket_path_for(canon),
                root=canon,
                script_for=script_for,
                acp_script_for=functools.partial(acp_script_for, root=canon),
            )
        assert self.runtime.manager is not None
        await self.runtime.manager.add_workspace(name, str(root))

    async def spawn(self, prompt: str, ws: str = "ws", **body: Any) -> str:
        payload: dict[str, Any] = {"prompt": prompt, "isolation": "shared", **body}
        r = await self.client.post(f"/api/workspaces/{ws}/agents", json=payload)
        assert r.status_code == 201, r.text
        return str(r.json()["agent_id"])

    async def history(self, agent_id: str) -> list[dict[str, Any]]:
        r = await self.client.get(f"/api/agents/{agent_id}/events")
        assert r.status_code == 200, r.text
        return list(r.json())

    async def status(self, agent_id: str) -> str | None:
        r = await self.client.get(f"/api/agents/{agent_id}")
        return str(r.json()["status"]) if r.status_code == 200 else None

    async def wait_status(self, agent_id: str, *statuses: str, within: float = 15.0) -> None:
        async def ok() -> bool:
            return await self.status(agent_id) in statuses

        await wait_until(ok, within, interval=0.05, what=f"{agent_id} in {statuses}")

    async def wait_history(
        self, agent_id: str, cond: Callable[[list[dict[str, Any]]], bool], within: float = 15.0
    ) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []

        async def ok() -> bool:
            nonlocal events
            events = await self.history(agent_id)
            return cond(events)

        await wait_until(ok, within, interval=0.05, what=f"history of {agent_id}")
        return events


StackFactory = Callable[..., Awaitable[DashStack]]


@pytest.fixture
async def make_stack(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> AsyncIterator[StackFactory]:
    rundir = short_tmpdir()
    monkeypatch.setenv("CALIBAN_DAEMON_RUNTIME_DIR", rundir)
    stacks: list[DashStack] = []

    async def factory(
        *,
        tokens: dict[str, str] | TokenTable | None = None,
        workspaces: tuple[str, ...] = ("ws",),
        allow_acp: bool = False,
        client_token: str | None = None,
        **config: Any,  # more DaemonConfig fields (database_url, replica_id, lease_ttl, ...)
    ) -> DashStack:
        # tokens: plaintext `name -> token` (admin) or a scoped TokenTable (then the test
        # client uses `client_token`)
        table = (
            tokens if isinstance(tokens, TokenTable) else TokenTable.from_plaintext(tokens or {})
        )
        if client_token is None and isinstance(tokens, dict) and tokens:
            client_token = next(iter(tokens.values()))
        tmp = tmp_path / f"stack{len(stacks)}"
        tmp.mkdir()
        cfg = DaemonConfig(
            bind_host="127.0.0.1",
            port=0,
            data_dir=tmp / "data",
            autostart=False,
            poll_interval=0.05,
            api_tokens=dict(tokens) if isinstance(tokens, dict) else {},
            host_label="dash-test",
            allow_acp=allow_acp,
            **config,
        )
        runtime = Runtime(cfg)
        await runtime.start()
        settings = ApiSettings(tokens=table, access_log=False)
        server = ApiServer(create_app(runtime, settings), "127.0.0.1", 0, graceful_timeout=2)
        await server.start()
        headers = {"Authorization": f"Bearer {client_token}"} if client_token else {}
        headers["X-Prospero-Client"] = "test"  # body-less POSTs pass the OriginGuard
        client = httpx.AsyncClient(base_url=server.url, timeout=20.0, headers=headers)
        stack = DashStack(tmp=tmp, runtime=runtime, server=server, client=client)
        stacks.append(stack)
        for name in workspaces:
            await stack.add_workspace(name)
        return stack

    yield factory

    for s in reversed(stacks):
        with contextlib.suppress(Exception):
            await s.client.aclose()
        await s.server.stop()
        await s.runtime.stop()
        for f in s.fakes.values():
            await f.stop()
    shutil.rmtree(rundir, ignore_errors=True)


@pytest.fixture
async def stack(make_stack: StackFactory) -> DashStack:
    return await make_stack()


# ------------------------------------------------------------------------------ browser

# Records what must never happen: a script injected by data running, CSP violations.
INIT_SCRIPT = """
window.__xss = 0;
window.__alerts = [];
window.__csp = [];
window.alert = (m) => { window.__alerts.push(String(m)); };
window.confirm = (m) => { window.__alerts.push('confirm:' + String(m)); return false; };
window.prompt = (m) => { window.__alerts.push('prompt:' + String(m)); return null; };
document.addEventListener('securitypolicyviolation', (e) => {
  window.__csp.push(e.violatedDirective + ' ' + e.blockedURI);
});
"""


@dataclass
class PageLog:
    errors: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)

    def unexpected(self) -> list[str]:
        """Console errors other than the expected 404 of a daemon without /api/decisions."""
        return [c for c in self.console if "404" not in c] + self.errors


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    assert HAVE_CHROMIUM, f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)"
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


@dataclass
class Session:
    page: Page
    log: PageLog
    base: str

    async def open(self, route: str = "") -> None:
        await self.page.goto(f"{self.base}/{route}")

    async def shot(self, name: str, *, full_page: bool = True) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        await self.page.screenshot(path=str(path), full_page=full_page)
        return path

    async def doc_shot(self, name: str, target: Locator | None = None) -> Path:
        """A screenshot the docs show: of `target` (an element: small) or of the viewport,
        in build/screenshots/ and, with PROSPERO_DOC_SHOTS=1, docs/screenshots/."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        if target is not None:
            await target.scroll_into_view_if_needed()
            await target.screenshot(path=str(path), animations="disabled", caret="hide")
        else:
            await self.page.screenshot(path=str(path), animations="disabled", caret="hide")
        if DOC_SHOTS is not None:
            DOC_SHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, DOC_SHOTS / path.name)
        return path

    async def timeline_seqs(self) -> list[int]:
        return [
            int(x)
            for x in await self.page.eval_on_selector_all(
                ".timeline .tl-entry[data-seqs]",
                "els => els.flatMap(e => e.dataset.seqs.split(' '))",
            )
        ]

    async def assert_clean(self) -> None:
        assert await self.page.evaluate("window.__xss") == 0
        assert await self.page.evaluate("window.__alerts") == []
        assert await self.page.evaluate("window.__csp") == []
        assert self.log.unexpected() == [], self.log.unexpected()


SessionFactory = Callable[..., Awaitable[Session]]


@pytest.fixture
async def open_session(browser: Browser) -> AsyncIterator[SessionFactory]:
    contexts = []

    async def factory(stack: DashStack, *, width: int = 1360, height: int = 900) -> Session:
        ctx = await browser.new_context(viewport={"width": width, "height": height})
        ctx.set_default_timeout(WAIT)
        contexts.append(ctx)
        await ctx.add_init_script(INIT_SCRIPT)
        page = await ctx.new_page()
        log = PageLog()

        def on_console(msg: ConsoleMessage) -> None:
            if msg.type == "error":
                log.console.append(msg.text)

        page.on("console", on_console)
        page.on("pageerror", lambda exc: log.errors.append(str(exc)))
        return Session(page=page, log=log, base=stack.url)

    yield factory
    for ctx in contexts:
        with contextlib.suppress(Exception):
            await ctx.close()
