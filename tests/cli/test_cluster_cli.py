"""`prospero cluster` end to end through HTTP (typer's CliRunner) against a live prosperod: the
standalone view, a clustered view (a lease authority on a fake clock set on the runtime), `-o
json` as the API's JSON, and the one-line errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from prospero.cli import render
from prospero.cli.cluster import fmt_secs
from prospero.core.cluster import ClusterInfo, replica_key
from prospero.core.leases import MemoryLeases
from prospero.types.model import Agent
from tests.cli.conftest import Cli, LiveStack, free_port


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    with LiveStack(tmp_path_factory.mktemp("cluster"), replica_id="cli-r1").serving() as stack:
        yield stack


@pytest.fixture(scope="module")
def cli(live: LiveStack) -> Cli:
    return Cli(live.url)


class FakeClock:
    def __init__(self) -> None:
        self.t = 500.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clustered(live: LiveStack) -> Iterator[None]:
    """The runtime reports a cluster of two replicas, `cli-r1` (this one) and `cli-r0`."""
    assert live.runtime is not None
    before = live.runtime.cluster
    clock = FakeClock()
    auth = MemoryLeases(clock)

    async def setup() -> None:
        assert await auth.acquire(replica_key("cli-r1"), "cli-r1", 30.0)
        assert await auth.acquire(replica_key("cli-r0"), "cli-r0", 30.0)
        assert await auth.acquire("agent-x", "cli-r0", 30.0)
        assert await auth.acquire("repo:alpha", "cli-r1", 30.0)
        clock.t += 4.0
        assert await auth.acquire(replica_key("cli-r1"), "cli-r1", 30.0)  # a heartbeat

    live.call(setup())
    live.runtime.cluster = ClusterInfo("clustered", "cli-r1", "postgres", 30.0, 10.0, auth)
    try:
        yield
    finally:
        live.runtime.cluster = before


def test_standalone_table(cli: Cli) -> None:
    res = cli("cluster")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == "mode: standalone  replica: cli-r1  store: sqlite"
    assert lines[2].split() == ["REPLICA", "HEARTBEAT", "AGE", "LEASES"]
    assert lines[3].split() == ["cli-r1", "(this)", "0.0s", "0"]
    assert lines[-1] == "(no leases: standalone)"


def test_json_is_the_api_answer(cli: Cli, live: LiveStack) -> None:
    api = live.get("/api/cluster").json()
    for args in (("cluster", "-o", "json"), ("-o", "json", "cluster")):
        res = cli(*args)
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout) == api
    assert api["mode"] == "standalone" and api["replica_id"] == "cli-r1"


def test_clustered_table(cli: Cli, clustered: None) -> None:
    res = cli("cluster")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == (
        "mode: clustered  replica: cli-r1  store: postgres  lease ttl: 30.0s  heartbeat: 10.0s"
    )
    assert lines[1] == ""
    assert lines[2].split() == ["REPLICA", "HEARTBEAT", "AGE", "LEASES"]
    assert lines[3].split() == ["cli-r1", "(this)", "0.0s", "1"]
    assert lines[4].split() == ["cli-r0", "4.0s", "1"]
    assert lines[5] == ""
    assert lines[6].split() == ["LEASE", "OWNER", "EPOCH", "EXPIRES", "IN"]
    assert [line.split() for line in lines[7:]] == [
        ["agent-x", "cli-r0", "1", "26.0s"],
        ["replica:cli-r0", "cli-r0", "1", "26.0s"],
        ["replica:cli-r1", "cli-r1", "1", "30.0s"],
        ["repo:alpha", "cli-r1", "1", "26.0s"],
    ]
    # columns line up: every row's second column starts where the header's does
    at = lines[6].index("OWNER")
    assert all(line[at - 2 : at] == "  " and line[at] != " " for line in lines[7:])

    data = json.loads(cli("cluster", "-o", "json").stdout)
    assert data["mode"] == "clustered" and data["lease_ttl_s"] == 30.0
    assert [(r["replica_id"], r["leases"], r["this"]) for r in data["replicas"]] == [
        ("cli-r1", 1, True),
        ("cli-r0", 1, False),
    ]
    assert data["leases"][0] == {
        "key": "agent-x",
        "owner": "cli-r0",
        "epoch": 1,
        "expires_in_s": 26.0,
    }


def test_unreachable_daemon_is_one_line(cli: Cli) -> None:
    res = cli("cluster", addr=f"http://127.0.0.1:{free_port()}")
    assert res.exit_code == 6  # exits.UNREACHABLE
    assert "cannot reach prosperod" in res.output
    assert "Traceback" not in res.output


def test_auth_errors_are_one_line(tmp_path: Path) -> None:
    with LiveStack(tmp_path, tokens={"admin": "s3cret"}).serving() as stack:
        cli = Cli(stack.url)
        res = cli("cluster")
        assert res.exit_code == 4  # exits.AUTH
        assert "server returned 401" in res.output and "Traceback" not in res.output
        res = cli("cluster", "-o", "json", token="s3cret")
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["mode"] == "standalone"


def test_fmt_secs() -> None:
    assert fmt_secs(None) == "-"
    assert fmt_secs(0) == "0.0s"
    assert fmt_secs(0.44) == "0.4s"
    assert fmt_secs(59.9) == "59.9s"
    assert fmt_secs(61) == "1m"
    assert fmt_secs(7200) == "2h"
    assert fmt_secs(3 * 86400) == "3d"
    assert fmt_secs(-1) == "0.0s"
    assert fmt_secs("x") == "?"


def test_ls_wide_names_the_replica_driving_an_agent() -> None:
    """`prospero ls -o wide`: an agent with an `owner` (clustered) says which replica drives
    it in the OWNER column; one without shows `-`."""
    started = "2026-01-01T00:00:00+00:00"
    agents = [
        Agent(id="a1", name="n1", workspace="alpha", status="running", started_at=started,
              label="one", owner="cli-r0"),
        Agent(id="a2", name="n2", workspace="alpha", status="idle", started_at=started,
              label="two"),
    ]  # fmt: skip
    console = Console(record=True, width=200, color_system=None)
    render.render_agents(console, agents, {}, wide=True)
    lines = console.export_text().splitlines()
    header = lines[0].split()
    owner = header.index("OWNER")
    one = next(line for line in lines if line.startswith("a1")).split()
    two = next(line for line in lines if line.startswith("a2")).split()
    assert (one[owner], one[-1]) == ("cli-r0", "one")
    assert (two[owner], two[-1]) == ("-", "two")
