"""The CLI against a daemon with API auth on: `--token` / PROSPERO_API_TOKEN as a bearer."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.cli.conftest import Cli, LiveStack

TOKEN = "pspo_cli_test_token_0123456789abcdef"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    stack = LiveStack(tmp_path_factory.mktemp("cli-auth"), tokens={"ops": TOKEN})
    with stack.serving("alpha"):
        yield stack


def test_token_required_and_accepted(secured: LiveStack) -> None:
    cli = Cli(secured.url)
    res = cli("ls")
    assert res.exit_code == 4  # exits.AUTH
    assert res.stderr.startswith("error: server returned 401: ")
    assert len(res.stderr.strip().splitlines()) == 1
    assert TOKEN not in res.output

    res = cli("--token", "wrong", "ls")
    assert res.exit_code == 4 and "server returned 401: " in res.stderr

    res = cli("ls", "-o", "json", token=TOKEN)  # PROSPERO_API_TOKEN
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["host"] == "cli-test"

    res = cli("--token", TOKEN, "spawn", "alpha", "find main", "-o", "json")
    assert res.exit_code == 0, res.output
    agent_id = json.loads(res.stdout)["agent_id"]
    res = cli("follow", agent_id, "--token", TOKEN)  # SSE with the bearer header
    assert res.exit_code == 0, res.output
    assert "[finished] EndOfTurn" in res.stdout
    res = cli("follow", agent_id)
    assert res.exit_code == 4 and "server returned 401: " in res.stderr
