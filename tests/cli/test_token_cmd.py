"""`prospero token new/list`, and a real prosperod process accepting the tokens it writes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import httpx
from typer.testing import CliRunner

from prospero.cli.main import app as cli_app
from prospero.core.tokens import Scope, add_token, hash_token, read_tokens_file
from tests.daemon.test_prosperod import Daemon, release, spawn_daemon, spawn_standby
from tests.support import poll_until_sync

CONSOLE_SCRIPT = Path(sys.executable).parent / "prospero"


def invoke(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in-process (typer's runner), results shaped like a subprocess's."""
    res = CliRunner().invoke(cli_app, list(args), env={"NO_COLOR": "1", "PROSPERO_API_TOKEN": ""})
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, res.stderr)


def run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROSPERO_")}
    env["NO_COLOR"] = "1"
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def test_token_new_prints_once_and_stores_the_hash(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    res = invoke("token", "new", "ci", "--scope", "operate", "--api-tokens-file", str(f))
    assert res.returncode == 0, res.stderr
    token = res.stdout.strip()
    assert token.startswith("pspo_") and "\n" not in token
    assert "shown only this once" in res.stderr
    text = f.read_text()
    assert token not in text and f"ci operate sha256:{hash_token(token).hex()}" in text
    assert stat.S_IMODE(f.stat().st_mode) == 0o600

    assert invoke("token", "new", "viewer", "--api-tokens-file", str(f)).returncode == 0  # read
    dup = invoke("token", "new", "ci", "--scope", "admin", "--api-tokens-file", str(f))
    assert dup.returncode == 1 and "already exists" in dup.stderr
    bad = invoke("token", "new", "x", "--scope", "root", "--api-tokens-file", str(f))
    assert bad.returncode == 2
    bad_name = invoke("token", "new", "a b", "--api-tokens-file", str(f))
    assert bad_name.returncode == 1 and "invalid token name" in bad_name.stderr
    assert [(e.name, e.scope) for e in read_tokens_file(f)] == [
        ("ci", Scope.operate),
        ("viewer", Scope.read),
    ]

    listed = invoke("token", "list", "--api-tokens-file", str(f))
    assert listed.returncode == 0, listed.stderr
    rows = [ln.split() for ln in listed.stdout.strip().splitlines()]
    assert rows == [["NAME", "SCOPE"], ["ci", "operate"], ["viewer", "read"]]
    assert "pspo_" not in listed.stdout and "sha256" not in listed.stdout
    as_json = invoke("token", "list", "--api-tokens-file", str(f), "-o", "json")
    assert json.loads(as_json.stdout) == [
        {"name": "ci", "scope": "operate"},
        {"name": "viewer", "scope": "read"},
    ]
    missing = invoke("token", "list", "--api-tokens-file", str(tmp_path / "nope"))
    assert missing.returncode == 1 and "cannot read" in missing.stderr
    f.write_text("ci operate notahash\n")
    broken = invoke("token", "list", "--api-tokens-file", str(f))
    assert broken.returncode == 1 and "line 1" in broken.stderr


async def test_real_prosperod_accepts_cli_tokens(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    # prosperod imports its modules while the CLI writes the tokens file; it reads its config
    # (and the file) only once released (a standby: tests/daemon/test_prosperod.py).
    d: Daemon = await spawn_standby(tmp_path, "--addr", "127.0.0.1:0", "--api-tokens-file", str(f))
    try:
        res = await asyncio.to_thread(
            run,
            str(CONSOLE_SCRIPT),
            "token",
            "new",
            "ops",
            "--scope",
            "operate",
            "--api-tokens-file",
            str(f),
        )
        assert res.returncode == 0, res.stderr
        ops = res.stdout.strip()
        await release(d)
        url = await d.wait_url()
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            assert (await c.get("/api/fleet")).status_code == 401
            r = await c.get("/api/fleet", headers={"Authorization": f"Bearer {ops}"})
            assert r.status_code == 200
            root = tmp_path / "ws"
            root.mkdir()
            body = {"name": "ws", "root": str(root)}
            r = await c.post(
                "/api/workspaces", json=body, headers={"Authorization": f"Bearer {ops}"}
            )
            assert r.status_code == 403 and r.json()["kind"] == "forbidden"

            # a token added while prosperod runs works at once
            res = await asyncio.to_thread(
                run,
                str(CONSOLE_SCRIPT),
                "token",
                "new",
                "root",
                "--scope",
                "admin",
                "--api-tokens-file",
                str(f),
            )
            assert res.returncode == 0, res.stderr
            admin = res.stdout.strip()
            r = await c.post(
                "/api/workspaces", json=body, headers={"Authorization": f"Bearer {admin}"}
            )
            assert r.status_code == 201, r.text

        # the CLI itself with and without the token (two independent processes, run at once)
        ok, denied = await asyncio.gather(
            asyncio.to_thread(
                run,
                str(CONSOLE_SCRIPT),
                "--addr",
                url,
                "--token",
                ops,
                "workspace",
                "list",
                "-o",
                "json",
            ),
            asyncio.to_thread(run, str(CONSOLE_SCRIPT), "--addr", url, "ls"),
        )
        assert ok.returncode == 0, ok.stderr
        assert [w["name"] for w in json.loads(ok.stdout)] == ["ws"]
        assert denied.returncode != 0 and "401" in denied.stderr
        for tok in (ops, admin):
            assert tok not in d.log
    finally:
        if d.proc.returncode is None:
            d.proc.send_signal(signal.SIGTERM)
        assert await d.finish() == 0
    assert stat.S_IMODE((tmp_path / "data" / "session.key").stat().st_mode) == 0o600


async def test_bad_tokens_file_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text("ops operate sha256:nothex\n")
    d = await spawn_daemon(tmp_path, "--addr", "127.0.0.1:0", "--api-tokens-file", str(f))
    assert await d.finish() == 2
    assert f"tokens file {f}, line 1" in d.log


async def test_non_loopback_needs_a_token_or_insecure_no_auth(tmp_path: Path) -> None:
    # Both prosperods start at once (independent: the refused one exits before any side effect).
    refused = await spawn_daemon(tmp_path, "--addr", "0.0.0.0:0")
    d = await spawn_daemon(tmp_path, "--addr", "0.0.0.0:0", "--insecure-no-auth")
    assert await refused.finish() == 2
    assert "--insecure-no-auth" in refused.log
    try:
        url = await d.wait_url()
        assert url
    finally:
        if d.proc.returncode is None:
            d.proc.send_signal(signal.SIGTERM)
        assert await d.finish() == 0


def test_demo_takes_a_tokens_file(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    ops = add_token(f, "ops", Scope.operate)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROSPERO_", "CALIBAN_"))}
    proc = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "demo", "--port", "0", "--api-tokens-file", str(f)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(proc.stdout or []), daemon=True).start()
    try:

        def banner() -> str | None:
            assert proc.poll() is None, "demo exited early"
            m = re.search(r"running at (http://127\.0\.0\.1:\d+)", "".join(out))
            return m.group(1) if m and "agents:" in "".join(out) else None

        url = poll_until_sync(banner, 90, "demo banner")
        assert f"API tokens {f}" in "".join(out)
        with httpx.Client(base_url=url, timeout=10) as c:
            assert c.get("/api/fleet").status_code == 401
            r = c.get("/api/fleet", headers={"Authorization": f"Bearer {ops}"})
            assert r.status_code == 200 and r.json()["workspaces"]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
