"""Shell completion of agent ids and workspace names, as the shell asks for it (the real
`prospero` executable with the completion variables bash and zsh set): it queries prosperod,
and completes nothing — quickly, without a traceback — when prosperod is down or stuck."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prospero.core.wire.control import SpawnSpec
from tests.cli.conftest import LiveStack, free_port

CONSOLE_SCRIPT = Path(sys.executable).parent / "prospero"


def complete(
    words: str, addr: str, shell: str = "bash", timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROSPERO_")}
    parts = words.split(" ")
    env.update(
        {
            "PROSPERO_ADDR": addr,
            "XDG_CONFIG_HOME": str(Path(__file__).parent / "no-such-config-dir"),
            "_PROSPERO_COMPLETE": f"complete_{shell}",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(parts) - 1),
            "_TYPER_COMPLETE_ARGS": words,
        }
    )
    return subprocess.run(
        [str(CONSOLE_SCRIPT)], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_agent_ids_and_workspaces_complete(live: LiveStack) -> None:
    for agent_id in ("abcd00000001", "abcd00000002", "ef0000000003"):
        live.call(
            live.fakes["alpha"].add_agent(
                id=agent_id, spec=SpawnSpec(initial_prompt="x", label=f"l-{agent_id[-1]}")
            )
        )
        live.wait_for(lambda a=agent_id: live.agent(a), what="listed")  # type: ignore[misc]
    res = complete("prospero follow abcd", live.url)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["abcd00000001", "abcd00000002"]
    assert complete("prospero kill ef", live.url).stdout.split() == ["ef0000000003"]
    # zsh also gets a description: workspace, status, label
    zsh = complete("prospero logs abcd00000001", live.url, shell="zsh").stdout
    assert "abcd00000001" in zsh and "alpha" in zsh and "l-1" in zsh
    # workspace names, as an argument and as the --workspace option
    assert complete("prospero spawn al", live.url).stdout.split() == ["alpha"]
    assert complete("prospero ls --workspace b", live.url).stdout.split() == ["beta"]
    assert complete("prospero policy show ", live.url).stdout.split() == ["alpha", "beta"]
    # the resource names of get/describe
    assert complete("prospero get w", live.url).stdout.split() == ["workspaces"]


@pytest.fixture
def stuck_server() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) but never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_completion_never_hangs_or_tracebacks(stuck_server: str) -> None:
    for addr in (f"http://127.0.0.1:{free_port()}", stuck_server, "ftp://not-a-server"):
        started = time.monotonic()
        res = complete("prospero follow ab", addr)
        took = time.monotonic() - started
        assert res.returncode == 0, (addr, res.stderr)
        assert res.stdout.strip() == "", addr
        assert "Traceback" not in res.stderr, (addr, res.stderr)
        assert took < 10, (addr, took)  # the request gives up after ~2 s
