"""prosperod as a real subprocess: starts, answers, shuts down cleanly on SIGTERM/SIGINT (exit 0)
with open SSE streams, refuses bad configs (exit 2), JSON logs."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.faults.warm import STANDBY
from tests.support import short_tmpdir

PYTHON = sys.executable
URL_RE = re.compile(r"listening on (http://[^\s\"]+)")


class Daemon:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.url = ""

    async def wait_url(self, within: float = 20.0) -> str:
        assert self.proc.stderr is not None

        async def scan() -> str:
            assert self.proc.stderr is not None
            while True:
                raw = await self.proc.stderr.readline()
                if not raw:
                    raise AssertionError("prosperod exited early:\n" + "".join(self.lines))
                line = raw.decode()
                self.lines.append(line)
                m = URL_RE.search(line)
                if m:
                    return m.group(1)

        self.url = await asyncio.wait_for(scan(), within)
        return self.url

    async def finish(self, within: float = 20.0) -> int:
        assert self.proc.stderr is not None
        rest = await asyncio.wait_for(self.proc.stderr.read(), within)
        self.lines.extend(rest.decode().splitlines(keepends=True))
        return await asyncio.wait_for(self.proc.wait(), within)

    @property
    def log(self) -> str:
        return "".join(self.lines)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROSPERO_")}
    env["CALIBAN_DAEMON_RUNTIME_DIR"] = short_tmpdir()
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    env.update(extra)
    return env


async def spawn_daemon(tmp_path: Path, *args: str, **env: str) -> Daemon:
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "prospero.daemon",
        "--data-dir",
        str(tmp_path / "data"),
        "--no-autostart",
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=_env(tmp_path, **env),
    )
    return Daemon(proc)


async def spawn_standby(tmp_path: Path, *args: str, **env: str) -> Daemon:
    """Like `spawn_daemon`, but the process only imports prosperod's modules and waits for
    `release()` before it runs `prospero.daemon.main.main(args)` (tests/faults/warm.py)."""
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-c",
        STANDBY,
        "--data-dir",
        str(tmp_path / "data"),
        "--no-autostart",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=_env(tmp_path, **env),
    )
    return Daemon(proc)


async def release(d: Daemon) -> None:
    assert d.proc.stdin is not None
    d.proc.stdin.write(b"go\n")
    await d.proc.stdin.drain()
    d.proc.stdin.close()


@pytest.fixture
async def cleanup() -> AsyncIterator[list[Daemon]]:
    daemons: list[Daemon] = []
    yield daemons
    for d in daemons:
        if d.proc.returncode is None:
            d.proc.kill()
            await d.proc.wait()


async def test_starts_serves_and_stops_cleanly_on_sigterm(
    tmp_path: Path, cleanup: list[Daemon]
) -> None:
    d = await spawn_daemon(tmp_path, "--addr", "127.0.0.1:0", "--log-format", "json")
    cleanup.append(d)
    # The restart below imports its modules meanwhile (~2.5 s): it touches nothing until
    # released, after the first one stopped.
    d2 = await spawn_standby(tmp_path, "--addr", "127.0.0.1:0")
    cleanup.append(d2)
    url = await d.wait_url()
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        r = await c.get("/healthz")
        assert r.status_code == 200 and r.text == "ok"
        root = tmp_path / "ws"
        root.mkdir()
        r = await c.post("/api/workspaces", json={"name": "ws", "root": str(root)})
        assert r.status_code == 201
        assert (await c.get("/openapi.json")).status_code == 200
        # an open SSE stream must not hold up shutdown
        async with c.stream("GET", "/api/stream") as resp:
            assert resp.status_code == 200
            lines = resp.aiter_lines()
            first = await asyncio.wait_for(lines.__anext__(), 10)  # history: repo_health etc.
            assert first
            d.proc.send_signal(signal.SIGTERM)

            async def drained() -> None:
                async for _ in lines:
                    pass

            await asyncio.wait_for(drained(), 15)  # the server ended the stream
    assert await d.finish() == 0
    # structured logs: every stderr line is a JSON object
    records = [json.loads(line) for line in d.lines if line.strip()]
    assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records)
    msgs = [r["msg"] for r in records]
    assert any("SIGTERM" in m for m in msgs)
    assert any("stopped cleanly" in m for m in msgs)
    assert (tmp_path / "data" / "events.db").exists()
    # history survives a restart
    await release(d2)
    url = await d2.wait_url()
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        assert [w["name"] for w in (await c.get("/api/workspaces")).json()] == ["ws"]
    d2.proc.send_signal(signal.SIGINT)
    assert await d2.finish() == 0


async def test_refuses_non_loopback_without_token(tmp_path: Path, cleanup: list[Daemon]) -> None:
    d = await spawn_daemon(tmp_path, "--addr", "0.0.0.0:0")
    cleanup.append(d)
    assert await d.finish() == 2
    assert "refusing to bind non-loopback address 0.0.0.0" in d.log
    assert not (tmp_path / "data").exists()  # refused before any side effect


async def test_non_loopback_with_token_requires_auth(tmp_path: Path, cleanup: list[Daemon]) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text("ops:very-secret-token\n")
    d = await spawn_daemon(
        tmp_path, "--addr", "0.0.0.0:0", "--api-token-file", str(token_file), "--log-level", "debug"
    )
    cleanup.append(d)
    url = await d.wait_url()
    port = url.rsplit(":", 1)[1]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
        assert (await c.get("/healthz")).status_code == 200
        r = await c.get("/api/fleet")
        assert r.status_code == 401 and r.json()["kind"] == "unauthorized"
        r = await c.get("/api/fleet", headers={"Authorization": "Bearer very-secret-token"})
        assert r.status_code == 200
    d.proc.send_signal(signal.SIGTERM)
    assert await d.finish() == 0
    assert "very-secret-token" not in d.log
    assert "API auth on (1 token(s))" in d.log


async def test_config_errors_exit_2(tmp_path: Path, cleanup: list[Daemon]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('colour = "blue"\n')
    cases = [
        (("--config", str(bad)), "unknown setting 'colour'"),
        (("--poll-interval-ms", "soon"), "poll_interval_ms"),
        (("--caliband-addr", "h:1", "--caliband-token-file", str(bad)), "in clear"),
        (("--bogus-flag",), "unrecognized arguments"),
    ]
    # The four daemons start at once (each pays ~2 s of imports before it reads its config)
    # and each is judged on its own exit code and log.
    daemons = [await spawn_daemon(tmp_path, "--addr", "127.0.0.1:0", *a) for a, _ in cases]
    cleanup.extend(daemons)
    codes = await asyncio.gather(*(d.finish() for d in daemons))
    for (args, needle), d, code in zip(cases, daemons, codes, strict=True):
        assert code == 2, args
        assert needle in d.log, (args, d.log)


async def test_busy_port_fails_fast(tmp_path: Path, cleanup: list[Daemon]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        d = await spawn_daemon(tmp_path, "--addr", f"127.0.0.1:{port}")
        cleanup.append(d)
        assert await d.finish() == 1
    assert "cannot listen on 127.0.0.1" in d.log


async def test_console_script_help(tmp_path: Path) -> None:
    script = Path(PYTHON).parent / "prosperod"
    assert script.exists()
    proc = await asyncio.create_subprocess_exec(
        str(script), "--help", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0
    text = out.decode()
    for flag in (
        "--addr",
        "--data-dir",
        "--poll-interval-ms",
        "--no-autostart",
        "--caliband-bin",
        "--default-env",
        "--retention-days",
        "--host",
        "--allow-acp",
        "--include-thinking",
        "--caliband-addr",
        "--caliband-ca-file",
        "--caliband-token-file",
        "--caliband-server-name",
        "--log-format",
        "--log-level",
        "--rate-card",
        "--api-token-file",
        "--config",
    ):
        assert flag in text, flag
