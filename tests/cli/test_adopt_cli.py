"""`prospero adopt ID`: an ACP agent this control plane did not spawn is listed, never driven,
until a user adopts it (issue 9, deliverable 6)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from prospero.core.wire.control import SpawnSpec
from tests.cli.conftest import Cli, LiveStack


@pytest.fixture(scope="module")
def acp_live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    stack = LiveStack(Path(tmp_path_factory.mktemp("cli-adopt")), allow_acp=True)
    with stack.serving("gamma"):
        yield stack


def test_adopt_starts_driving_an_acp_agent_spawned_elsewhere(acp_live: LiveStack) -> None:
    cli = Cli(acp_live.url)
    fake = acp_live.fakes["gamma"]
    rec = acp_live.call(
        fake.add_agent(
            spec=SpawnSpec(initial_prompt="someone else's", drive_protocol="acp"),
            interactive=True,
        )
    )
    listener = fake.acp_listeners[rec.id]
    agent = acp_live.wait_for(lambda: acp_live.agent(rec.id), what="listed")
    assert (agent["drive_protocol"], agent["spawned_here"], agent["adopted"]) == (
        "acp",
        False,
        False,
    )
    polls = fake.list_count
    acp_live.wait_for(lambda: fake.list_count >= polls + 5, what="polls")
    assert listener.connections_total == 0  # listed, never driven

    res = cli("send", rec.id, "hello?")
    assert res.exit_code == 5 and "adopt it" in res.stderr  # conflict

    res = cli("adopt", rec.id)
    assert res.exit_code == 0, res.output
    assert res.stdout.strip().startswith(f"adopted {rec.id} (acp, ")
    acp_live.wait_for(lambda: listener.connections_total >= 1, what="driven after adopt")
    res = cli("adopt", rec.id, "--drive-protocol", "acp", "-o", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["adopted"] is True

    res = cli("adopt", "does-not-exist")
    assert res.exit_code == 3
    assert res.stderr.strip() == "error: server returned 404: agent 'does-not-exist' not found"
