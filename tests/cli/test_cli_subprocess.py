"""The real `prospero` executable (console script and `python -m prospero.cli`) in a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.cli.conftest import LiveStack, free_port

CONSOLE_SCRIPT = Path(sys.executable).parent / "prospero"
CONFIG_HOME = tempfile.mkdtemp(prefix="prospero-xdg-")


def run(
    *argv: str, addr: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROSPERO_")}
    env["NO_COLOR"] = "1"
    env["XDG_CONFIG_HOME"] = CONFIG_HOME  # no context of the machine's user applies
    if addr is not None:
        env["PROSPERO_ADDR"] = addr
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def test_console_script_is_installed() -> None:
    assert CONSOLE_SCRIPT.exists(), CONSOLE_SCRIPT


def test_module_ls_spawn_follow(live: LiveStack) -> None:
    py = [sys.executable, "-m", "prospero.cli"]
    res = run(*py, "--addr", live.url, "ls", "-o", "json")
    assert res.returncode == 0, res.stderr
    assert {"alpha", "beta"} <= {w["name"] for w in json.loads(res.stdout)["workspaces"]}

    res = run(
        str(CONSOLE_SCRIPT), "spawn", "alpha", "grep for main", "--label", "sub", addr=live.url
    )
    assert res.returncode == 0, res.stderr
    m = re.fullmatch(r"spawned agent (\S+) in workspace 'alpha' \(worktree\)", res.stdout.strip())
    assert m, res.stdout

    res = run(str(CONSOLE_SCRIPT), "follow", m.group(1), addr=live.url)
    assert res.returncode == 0, res.stderr
    assert "⚙ Grep" in res.stdout and "✓ Grep" in res.stdout and "✗ Bash" in res.stdout
    assert res.stdout.rstrip().splitlines()[-1].startswith("[finished] EndOfTurn — $")
    assert res.stderr == ""


def test_unreachable_and_typo_in_a_real_process() -> None:
    addr = f"http://127.0.0.1:{free_port()}"
    res = run(str(CONSOLE_SCRIPT), "ls", addr=addr)
    assert res.returncode == 6  # exits.UNREACHABLE
    assert res.stdout == ""
    assert res.stderr == f"error: cannot reach prosperod at {addr} (is the daemon running?)\n"

    res = run(sys.executable, "-m", "prospero.cli", "sapwn", "x", "y", addr=addr)
    assert res.returncode == 2
    assert "Usage: " in res.stderr and "No such command" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout
