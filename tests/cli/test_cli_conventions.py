"""The kubectl/gh conventions of `prospero` (issue 14, item 3) against a real server and fake
calibands: id prefixes, `-o text|wide|json|yaml` on every command, `get`/`describe`/`logs`,
`ls` with headers, totals, filters and `--watch`, `spawn --follow`, `follow --exit-status`,
distinct exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from typer.main import get_command

from prospero.cli.main import app as cli_app
from prospero.core.wire.control import SpawnSpec
from tests.cli.conftest import Cli, LiveStack

SPAWNED = re.compile(r"spawned agent (\S+) in workspace '(\S+)' \((worktree|shared tree)\)")
CONSOLE_SCRIPT = Path(sys.executable).parent / "prospero"


def spawn(cli: Cli, *args: str) -> str:
    res = cli("spawn", *args)
    assert res.exit_code == 0, res.output
    m = SPAWNED.search(res.stdout)
    assert m, res.stdout
    return m.group(1)


def add_agent(live: LiveStack, agent_id: str, label: str | None = None) -> None:
    spec = SpawnSpec(initial_prompt="pre-existing agent", label=label)
    live.call(live.fakes["alpha"].add_agent(id=agent_id, spec=spec))
    live.wait_for(lambda: live.agent(agent_id), what=f"{agent_id} listed")


def table(text: str) -> tuple[list[str], list[list[str]]]:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[0].split(), [ln.split() for ln in lines[1:]]


# ---------------------------------------------------------------------------- id prefixes


def test_follow_an_id_prefix(cli: Cli, live: LiveStack) -> None:
    """The issue's done-when: `prospero follow 65b7` works; an ambiguous prefix names the
    candidates (exit 5), one that matches nothing is not found (exit 3)."""
    add_agent(live, "65b7c0ffee01", label="prefixed")
    res = cli("follow", "65b7")
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("— following 65b7c0ffee01 (Ctrl-C to stop) —")
    assert "[finished] EndOfTurn" in res.stdout

    add_agent(live, "65b7d00d0002")
    res = cli("follow", "65b7")
    assert res.exit_code == 5, res.output
    # (each candidate's status as it was then: the new agent's run may end meanwhile)
    assert re.fullmatch(
        r"error: agent id prefix '65b7' is ambiguous; it matches: "
        r"65b7c0ffee01 \(alpha, [a-z]+, prefixed\), "
        r"65b7d00d0002 \(alpha, [a-z]+\) \(give more of the id\)",
        res.stderr.strip(),
    ), res.stderr
    assert cli("follow", "65b7c", "-o", "json").exit_code == 0
    res = cli("kill", "65b7zzz")
    assert res.exit_code == 3 and "agent '65b7zzz' not found" in res.stderr

    # every command taking an agent id resolves it: logs, get, describe, send, rm, ...
    assert cli("logs", "65b7d").stdout.startswith("[discovered]")
    got = json.loads(cli("get", "agent", "65b7d", "-o", "json").stdout)
    assert got["id"] == "65b7d00d0002"
    assert re.search(r"^ID: +65b7d00d0002$", cli("describe", "agent", "65b7d").stdout, re.M)
    res = cli("send", "65b7d", "hi")  # not interactive: refused, for the whole id
    assert res.exit_code == 5 and "server returned 409" in res.stderr


# ---------------------------------------------------------------------------- ls and get


def test_ls_headers_totals_filters_and_wide(cli: Cli, live: LiveStack) -> None:
    agent_id = spawn(cli, "beta", "count things", "--label", "counter")
    live.wait_finished(agent_id)
    live.wait_status(agent_id, "done")

    def row() -> list[str] | None:
        header, rows = table(cli("ls", "--workspace", "beta").stdout)
        assert header == ["ID", "WORKSPACE", "STATUS", "AGE", "TURNS", "TOKENS", "COST", "LABEL"]
        assert {r[1] for r in rows} == {"beta"}
        found = next((r for r in rows if r[0] == agent_id), None)
        return found if found and found[4] == "3" else None  # totals folded

    r = live.wait_for(row, what="the agent's totals")
    totals = live.get("/api/dashboard/summary").json()["agents"][agent_id]  # what ls shows
    tin, tout = totals["input_tokens"], totals["output_tokens"]
    assert r[2] == "done" and re.fullmatch(r"\d+[smhd]", r[3])
    assert r[5] == f"{tin + tout:,}" and r[6] == f"${totals['cost_usd']:.4f}" and r[7] == "counter"

    header, rows = table(cli("ls", "-o", "wide", "--status", "done").stdout)
    assert header[:8] == ["ID", "WORKSPACE", "STATUS", "AGE", "TURNS", "TOKENS", "COST", "IN"]
    assert header[8:] == ["OUT", "MODEL", "PROTOCOL", "POSTURE", "TREE", "OWNER", "LABEL"]
    assert {r[2] for r in rows} == {"done"}
    wide = next(r for r in rows if r[0] == agent_id)
    assert wide[7:13] == [f"{tin:,}", f"{tout:,}", "claude-sonnet-4-6", "ndjson", "-", "worktree"]

    fleet = yaml.safe_load(cli("ls", "-o", "yaml", "--workspace", "beta").stdout)
    assert [w["name"] for w in fleet["workspaces"]] == ["beta"]
    assert agent_id in {a["id"] for a in fleet["workspaces"][0]["agents"]}
    none = json.loads(cli("ls", "-o", "json", "--status", "crashed").stdout)
    assert all(not w["agents"] for w in none["workspaces"])

    res = cli("ls", "--workspace", "nope")
    assert res.exit_code == 3 and "workspace 'nope' not found" in res.stderr
    res = cli("ls", "--status", "sleepy")
    assert res.exit_code == 2 and "Usage:" in res.output


def test_get_and_describe(cli: Cli, live: LiveStack) -> None:
    agent_id = spawn(cli, "alpha", "describe me", "--label", "described")
    live.wait_finished(agent_id)
    agents = json.loads(cli("get", "agents", "-o", "json").stdout)
    assert agent_id in {a["id"] for a in agents}
    header, rows = table(cli("get", "agents", agent_id[:7]).stdout)
    assert header[0] == "ID" and [r[0] for r in rows] == [agent_id]
    two = json.loads(cli("get", "ag", agent_id, agent_id[:5], "-o", "json").stdout)
    assert [a["id"] for a in two] == [agent_id, agent_id]

    out = cli("describe", "agent", agent_id[:6]).stdout
    fields = dict(re.findall(r"^([A-Z][A-Za-z ]*): +(.*)$", out, re.M))
    assert (fields["ID"], fields["Label"], fields["Workspace"]) == (agent_id, "described", "alpha")
    assert fields["Status"] in ("running", "done") and fields["Turns"] == "3"
    assert fields["Pending decisions"] == "(none)"
    doc = yaml.safe_load(cli("describe", "agent", agent_id, "-o", "yaml").stdout)
    assert doc["agent"]["id"] == agent_id and doc["decisions"] == []

    header, rows = table(cli("get", "ws").stdout)
    assert header == ["NAME", "HEALTH", "AGENTS", "PROVIDER", "ROOT"]
    assert {"alpha", "beta"} <= {r[0] for r in rows}
    one = json.loads(cli("get", "workspace", "alpha", "-o", "json").stdout)
    assert one["name"] == "alpha"
    res = cli("get", "workspaces", "nope")
    assert res.exit_code == 3 and "workspace 'nope' not found" in res.stderr
    out = cli("describe", "workspace", "alpha").stdout
    assert re.search(r"^Name: +alpha$", out, re.M) and "posture: default (autonomous)" in out
    assert agent_id in out
    assert cli("get", "decisions").stdout.strip() == "(no pending decisions)"

    res = cli("get", "pods")
    assert res.exit_code == 2 and "expected agents, workspaces or decisions" in res.output


def test_a_workspaces_own_caliband_is_shown(cli: Cli, live: LiveStack) -> None:
    root = live.add_workspace("remote", register=False)
    body = {"name": "remote", "root": root, "config": {"caliband": {"addr": "127.0.0.1:9"}}}
    r = httpx.post(f"{live.url}/api/workspaces", json=body, timeout=30)
    assert r.status_code in (201, 204), r.text
    try:
        header, rows = table(cli("workspace", "list", "-o", "wide").stdout)
        row = next(r for r in rows if r[0] == "remote")
        assert row[header.index("CALIBAND")] == "127.0.0.1:9"
        out = cli("describe", "workspace", "remote").stdout
        assert re.search(r"^Caliband: +127\.0\.0\.1:9$", out, re.M), out
        out = cli("describe", "workspace", "alpha").stdout
        assert re.search(r"^Caliband: +prosperod's default", out, re.M), out
    finally:
        assert cli("workspace", "rm", "remote").exit_code == 0


def test_logs_prints_history_without_following(cli: Cli, live: LiveStack) -> None:
    agent_id = spawn(cli, "beta", "slow job", "--label", "logged")
    live.wait_for(lambda: len(live.events(agent_id)) >= 4, what="some history")
    started = time.monotonic()
    res = cli("logs", agent_id)  # running: prints what is stored and returns
    assert res.exit_code == 0, res.output
    assert time.monotonic() - started < 15
    assert "[spawned]" in res.stdout and "[finished]" not in res.stdout
    assert "following" not in res.stdout
    seqs = [json.loads(ln)["seq"] for ln in cli("logs", agent_id, "-o", "json").stdout.splitlines()]
    assert seqs[:4] == [1, 2, 3, 4]
    part = cli("logs", agent_id, "--from", "2", "--limit", "2", "-o", "json").stdout
    assert [json.loads(ln)["seq"] for ln in part.splitlines()] == [2, 3]
    docs = list(yaml.safe_load_all(cli("logs", agent_id, "--limit", "3", "-o", "yaml").stdout))
    assert [d["seq"] for d in docs] == [1, 2, 3]
    assert cli("kill", agent_id).exit_code == 0
    res = cli("logs", agent_id, "-f")  # then follows to the end
    assert res.exit_code == 0 and "[finished] killed" in res.stdout


# ---------------------------------------------------------------------------- follow


def test_follow_exit_status_and_spawn_follow(cli: Cli, live: LiveStack) -> None:
    good = spawn(cli, "alpha", "all fine")
    assert cli("follow", good, "--exit-status").exit_code == 0
    bad = spawn(cli, "alpha", "this will fail")
    res = cli("follow", bad)
    assert res.exit_code == 0 and "[finished] ProviderError" in res.stdout
    res = cli("follow", bad, "--exit-status")
    assert res.exit_code == 7 and "[finished] ProviderError" in res.stdout

    res = cli("spawn", "beta", "this will fail too", "--follow", "--exit-status")
    assert res.exit_code == 7, res.output
    m = SPAWNED.search(res.stdout)
    assert m and res.stdout.index("spawned agent") < res.stdout.index("— following ")
    assert "(ANTHROPIC_API_KEY is not set)" in res.stdout
    res = cli("spawn", "beta", "fine again", "-f", "--exit-status", "-o", "json")
    assert res.exit_code == 0, res.output
    lines = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert lines[0]["workspace"] == "beta" and lines[-1]["kind"]["kind"] == "agent_finished"
    assert all(ln["agent_id"] == lines[0]["agent_id"] for ln in lines[1:])

    res = cli("spawn", "beta", "x", "--exit-status")
    assert res.exit_code == 2 and "needs --follow" in res.output

    killed = spawn(cli, "beta", "slow job")
    live.wait_status(killed, "running")
    assert cli("kill", killed).exit_code == 0
    assert cli("follow", killed, "--exit-status").exit_code == 7


# ---------------------------------------------------------------------------- -o everywhere


def leaf_commands(cmd: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    subs = getattr(cmd, "commands", None)
    if not subs:
        return [(path, cmd)]
    return [x for name, sub in subs.items() for x in leaf_commands(sub, (*path, name))]


def test_every_command_takes_output() -> None:
    leaves = leaf_commands(get_command(cli_app))
    assert len(leaves) > 30
    for path, cmd in leaves:
        opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
        if path == ("demo",):  # replaces itself with the daemon: nothing to format
            assert "--output" not in opts
            continue
        assert {"--output", "-o"} <= opts, path


def test_json_and_yaml_of_operations_with_empty_replies(cli: Cli, live: LiveStack) -> None:
    agent_id = spawn(cli, "alpha", "pair with me", "--interactive")
    live.wait_status(agent_id, "idle")
    sent = json.loads(cli("send", agent_id[:8], "hello", "-o", "json").stdout)
    assert sent == {"agent_id": agent_id, "action": "send", "accepted": True, "chars": 5}
    ended = yaml.safe_load(cli("end-input", agent_id, "-o", "yaml").stdout)
    assert ended == {"agent_id": agent_id, "action": "end-input", "accepted": True}
    live.wait_status(agent_id, "done")
    res = cli("cancel", agent_id, "-o", "json")  # NDJSON: refused, one line, exit 5
    assert res.exit_code == 5 and res.stdout == ""

    slow = spawn(cli, "alpha", "slow job")
    live.wait_status(slow, "running")
    killed = json.loads(cli("kill", slow, "-o", "json").stdout)
    assert killed == {"agent_id": slow, "action": "kill", "accepted": True}
    removed = json.loads(cli("rm", slow, "--force", "-o", "json").stdout)
    assert removed == {"agent_id": slow, "action": "rm", "accepted": True, "force": True}

    root = live.add_workspace("delta", register=False)
    assert cli("workspace", "add", "delta", root).exit_code == 0
    res = cli("workspace", "config", "delta", "--provider", "anthropic", "-o", "json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["name"] == "delta" and out["workspace"]["config"]["provider"] == "anthropic"
    res = cli("workspace", "config", "delta", "--posture", "supervised", "-o", "yaml")
    assert yaml.safe_load(res.stdout)["policy"]["posture"] == "supervised"
    assert json.loads(cli("workspace", "rm", "delta", "-o", "json").stdout) == {
        "name": "delta",
        "removed": True,
    }


# ---------------------------------------------------------------------------- binaries


def run(*argv: str, env: dict[str, str] | None = None, timeout: float = 30) -> Any:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PROSPERO_")}
    return subprocess.run(
        argv, env={**base, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )


def test_version_and_python_m_prospero(live: LiveStack) -> None:
    import prospero

    res = run(str(CONSOLE_SCRIPT), "--version")
    assert (res.returncode, res.stdout) == (0, f"prospero {prospero.__version__}\n")
    res = run(str(Path(sys.executable).parent / "prosperod"), "--version")
    assert (res.returncode, res.stdout) == (0, f"prosperod {prospero.__version__}\n")
    res = run(sys.executable, "-m", "prospero", "--version")
    assert (res.returncode, res.stdout) == (0, f"prospero {prospero.__version__}\n")
    res = run(sys.executable, "-m", "prospero", "--addr", live.url, "ls", "-o", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["host"] == "cli-test"
    res = run(sys.executable, "-m", "prospero", "--help")
    assert "Exit codes: 0 success" in " ".join(res.stdout.replace("│", " ").split())


def test_ls_watch_prints_changes(cli: Cli, live: LiveStack, tmp_path: Path) -> None:
    """`ls --watch` in a real process: the listing, then a line per changed agent."""
    env = {"PROSPERO_ADDR": live.url, "XDG_CONFIG_HOME": str(tmp_path), "NO_COLOR": "1"}
    base = {k: v for k, v in os.environ.items() if not k.startswith("PROSPERO_")}
    cmd = [str(CONSOLE_SCRIPT), "ls", "--watch", "--workspace", "beta", "--count", "1"]
    proc = subprocess.Popen(
        [*cmd, "--timeout", "60", "-o", "json"],
        env={**base, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())  # the listing, before any change
        assert [w["name"] for w in first["workspaces"]] == ["beta"]
        r = httpx.post(
            f"{live.url}/api/workspaces/beta/agents",
            json={"prompt": "slow job", "label": "watched"},
            timeout=30,
        )
        assert r.status_code == 201, r.text
        new_id = r.json()["agent_id"]
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    changed = [json.loads(ln) for ln in out.splitlines()]
    assert [(c["id"], c["label"]) for c in changed] == [(new_id, "watched")]
    assert cli("kill", new_id).exit_code == 0


def test_spawn_with_a_budget_is_stopped_and_says_so(cli: Cli, live: LiveStack) -> None:
    """`spawn --budget-usd 0.01 --follow --exit-status`: the warning and the stop in the
    follow output, exit 7 (not done); `describe` shows the cap and the outcome."""
    res = cli(
        "spawn",
        "alpha",
        "budget: a capped run",
        "--budget-usd",
        "0.01",
        "--follow",
        "--exit-status",
    )
    assert res.exit_code == 7, res.output
    assert "[budget] $0.0084 of $0.0100 spent" in res.stdout
    assert "[budget exceeded] $0.0126 of a $0.0100 cap: stopped" in res.stdout
    assert "budget_exceeded" in res.stdout
    agent = SPAWNED.search(res.stdout)
    assert agent
    shown = cli("describe", "agent", agent.group(1))
    assert shown.exit_code == 0, shown.output
    assert re.search(r"Budget:\s+\$0\.01", shown.stdout), shown.stdout
    assert re.search(r"Outcome:\s+budget_exceeded", shown.stdout), shown.stdout
    refused = cli("spawn", "alpha", "budget", "--budget-tokens", "0")
    assert refused.exit_code == 2, refused.output
