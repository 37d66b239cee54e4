"""`prospero` end to end through HTTP (typer's CliRunner) against a real server + fake caliband."""

from __future__ import annotations

import json
import re

from tests.cli.conftest import Cli, LiveStack, free_port, git_repo

SPAWNED = re.compile(r"spawned agent (\S+) in workspace '(\S+)' \((worktree|shared tree)\)")


def spawn(cli: Cli, *args: str) -> str:
    res = cli("spawn", *args)
    assert res.exit_code == 0, res.output
    m = SPAWNED.search(res.stdout)
    assert m, res.stdout
    return m.group(1)


def no_traceback(res: object) -> None:
    out = getattr(res, "output", "")
    assert "Traceback" not in out, out
    exc = getattr(res, "exception", None)
    assert exc is None or isinstance(exc, SystemExit), repr(exc)


# ---------------------------------------------------------------------------- reading


def test_ls_json_and_text(cli: Cli) -> None:
    res = cli("ls", "-o", "json")
    assert res.exit_code == 0, res.output
    fleet = json.loads(res.stdout)
    assert fleet["host"] == "cli-test"
    assert {"alpha", "beta"} <= {w["name"] for w in fleet["workspaces"]}

    res = cli("--output", "json", "ls")  # the global form works too
    assert json.loads(res.stdout)["host"] == "cli-test"

    res = cli("ls")
    assert res.exit_code == 0, res.output
    if any(w["agents"] for w in fleet["workspaces"]):
        assert res.stdout.split("\n", 1)[0].split() == [
            "ID", "WORKSPACE", "STATUS", "AGE", "TURNS", "TOKENS", "COST", "LABEL",
        ]  # fmt: skip
    else:
        assert res.stdout == "(no agents)\n"


def test_status(cli: Cli, live: LiveStack) -> None:
    res = cli("status")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == f"daemon: up ({live.url})  host: cli-test"
    assert lines[2].split() == ["NAME", "HEALTH", "AGENTS", "PROVIDER", "ROOT"]
    assert any(ln.split()[:2] == ["alpha", "healthy"] for ln in lines)
    data = json.loads(cli("status", "-o", "json").stdout)
    assert data["daemon"] == "up" and data["fleet"]["host"] == "cli-test"


def test_workspace_add_list_config_rm(cli: Cli, live: LiveStack) -> None:
    root = git_repo(live.tmp / "repos" / "gamma")
    res = cli("workspace", "add", "gamma", str(root))
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == f"registered workspace 'gamma' at {root}"

    rows = json.loads(cli("workspace", "list", "-o", "json").stdout)
    gamma = next(r for r in rows if r["name"] == "gamma")
    assert gamma["sources"][0]["name"] == "gamma"
    text = cli("workspace", "list", "-o", "wide").stdout
    header = text.splitlines()[0].split()
    assert header[:3] == ["NAME", "HEALTH", "AGENTS"] and "SOURCES" in header
    row = next(ln.split() for ln in text.splitlines() if ln.startswith("gamma "))
    assert row[header.index("SOURCES")] == "gamma"

    res = cli(
        "workspace", "config", "gamma",
        "--provider", "anthropic", "--api-key-env", "MY_KEY", "--env", "A=b=c", "--env", "X=1",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == "updated provider config for workspace 'gamma'"
    cfg = next(r for r in live.get("/api/workspaces").json() if r["name"] == "gamma")["config"]
    assert cfg["provider"] == "anthropic"
    assert cfg["api_key_from_env"] == "MY_KEY"
    assert cfg["env"] == {"A": "b=c", "X": "1"}

    # Only the fields given change (PATCH): the provider stays.
    assert cli("workspace", "config", "gamma", "--env", "X=2").exit_code == 0
    cfg = next(r for r in live.get("/api/workspaces").json() if r["name"] == "gamma")["config"]
    assert cfg["provider"] == "anthropic" and cfg["env"] == {"A": "b=c", "X": "2"}

    # A bad --env is a usage error, before any request.
    res = cli("workspace", "config", "gamma", "--env", "=nokey")
    assert res.exit_code == 2 and "KEY=VALUE" in res.output
    no_traceback(res)

    # Same name, other root: the server's 409 comes back as one line.
    other = git_repo(live.tmp / "repos" / "gamma2")
    res = cli("workspace", "add", "gamma", str(other))
    assert res.exit_code == 5  # conflict
    assert res.stderr.startswith("error: server returned 409: ")
    assert len(res.stderr.strip().splitlines()) == 1

    res = cli("workspace", "rm", "gamma")
    assert res.exit_code == 0 and res.stdout.strip() == "unregistered workspace 'gamma'"
    assert "gamma" not in {r["name"] for r in live.get("/api/workspaces").json()}
    res = cli("workspace", "rm", "gamma")
    assert res.exit_code == 3 and "server returned 404: " in res.stderr


# ---------------------------------------------------------------------------- spawn + follow


def test_spawn_worktree_allowlist_and_follow(cli: Cli, live: LiveStack) -> None:
    agent_id = spawn(
        cli,
        "alpha",
        "find the main function",
        "--label", "finder",
        "--model", "claude-sonnet-4-6",
        "--tool-allowlist", "Read",
        "--tool-allowlist", "Grep",
        "--posture", "autonomous",
    )  # fmt: skip
    spec = next(s for s in live.fakes["alpha"].received_specs if s.label == "finder")
    assert spec.isolation_worktree is True  # worktree isolation is the default
    assert spec.tool_allowlist == ["Read", "Grep"]
    assert spec.model == "claude-sonnet-4-6"
    # the posture is Prospero's own (AgentMeta): never on caliband's wire
    assert "permission_posture" not in live.fakes["alpha"].received_spec_keys[-1]
    assert (live.agent(agent_id) or {}).get("posture") == "autonomous"
    assert spec.initial_prompt == "find the main function"

    res = cli("follow", agent_id)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert out.startswith(f"— following {agent_id} (Ctrl-C to stop) —")
    assert "Let me read the README." in out  # text chunk, raw
    assert "Check the README first." in out  # thinking (dimmed when colored)
    assert '⚙ Grep {"pattern": "def main", "path": "src"}' in out
    assert "✓ Grep  src/app.py:3:def main():" in out
    assert "⚙ Bash" in out and "✗ Bash  exit status 1" in out
    assert re.search(r"\[turn 1\] 812 in / 64 out tokens, \$0\.\d{4}", out), out
    assert "[spawned]" in out
    fin = [ln for ln in out.splitlines() if ln.startswith("[finished]")]
    assert len(fin) == 1, out
    assert re.fullmatch(
        r"\[finished\] EndOfTurn — \$0\.\d{4}, 3 turns, 1713 in / 76 out tokens", fin[0]
    )
    assert out.rstrip().endswith(fin[0])  # follow exits right after agent_finished


def test_spawn_shared_tree_json_and_follow_json(cli: Cli, live: LiveStack) -> None:
    res = cli(
        "spawn", "beta", "look around", "--shared-tree", "--label", "shared-one", "-o", "json"
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["workspace"] == "beta" and data["isolated"] is False
    spec = next(s for s in live.fakes["beta"].received_specs if s.label == "shared-one")
    assert spec.isolation_worktree is False

    res = cli("follow", data["agent_id"], "-o", "json")
    assert res.exit_code == 0, res.output
    events = [json.loads(ln) for ln in res.stdout.splitlines()]
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))  # from the start, no gap, no duplicate
    assert events[-1]["kind"]["kind"] == "agent_finished"
    kinds = [e["kind"]["kind"] for e in events]
    assert "tool_started" in kinds and "tool_finished" in kinds and "turn_finished" in kinds

    # --from N starts at seq N.
    res = cli("follow", data["agent_id"], "--from", "3", "-o", "json")
    again = [json.loads(ln)["seq"] for ln in res.stdout.splitlines()]
    assert again == seqs[2:]


def test_failed_run_shows_detail(cli: Cli) -> None:
    agent_id = spawn(cli, "alpha", "this will fail")
    res = cli("follow", agent_id)
    assert res.exit_code == 0, res.output
    assert "[finished] ProviderError — " in res.stdout
    assert "(ANTHROPIC_API_KEY is not set)" in res.stdout


def test_follow_unknown_agent_is_404(cli: Cli) -> None:
    res = cli("follow", "nope-not-an-agent")
    assert res.exit_code == 3  # not found
    assert res.stderr.startswith("error: server returned 404: ")
    assert "nope-not-an-agent" in res.stderr
    no_traceback(res)


# ---------------------------------------------------------------------------- steering


def test_interactive_send_and_end_input(cli: Cli, live: LiveStack) -> None:
    agent_id = spawn(cli, "alpha", "pair with me", "--interactive", "--label", "pair")
    live.wait_status(agent_id, "idle")

    res = cli("send", agent_id, "add a changelog entry")
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == f"sent message to {agent_id}"
    worker = live.fakes["alpha"].workers[agent_id]
    live.wait_for(lambda: worker.replies_emitted == 1, what="reply to the message")

    res = cli("end-input", agent_id)
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == f"end-input sent to {agent_id}"

    res = cli("follow", agent_id)
    assert res.exit_code == 0, res.output
    assert "Ready when you are." in res.stdout
    assert "echo: add a changelog entry" in res.stdout
    assert "[finished] EndOfTurn" in res.stdout
    assert [f["type"] for f in worker.inbound] == ["UserMessage", "EndInput"]
    assert worker.inbound[0]["text"] == "add a changelog entry"

    live.wait_status(agent_id, "done")
    res = cli("send", agent_id, "too late")
    assert res.exit_code == 5  # conflict
    assert res.stderr.startswith("error: server returned 409: ")


def test_send_to_non_interactive_is_409(cli: Cli, live: LiveStack) -> None:
    agent_id = spawn(cli, "beta", "slow job", "--label", "busy")
    live.wait_status(agent_id, "running")
    res = cli("send", agent_id, "hello")
    assert res.exit_code == 5 and "server returned 409: " in res.stderr
    res = cli("cancel", agent_id)  # the NDJSON driver cannot cancel a turn
    assert res.exit_code == 5 and "server returned 409: " in res.stderr
    assert cli("rm", agent_id, "--force").exit_code == 0


def test_kill_rm_respawn(cli: Cli, live: LiveStack) -> None:
    agent_id = spawn(cli, "alpha", "slow job", "--label", "victim")
    live.wait_status(agent_id, "running")

    res = cli("rm", agent_id)  # still running: caliband refuses without --force
    assert res.exit_code == 5 and res.stderr.startswith("error: server returned 409: ")

    res = cli("kill", agent_id)
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == f"kill requested for {agent_id}"
    live.wait_status(agent_id, "killed")

    res = cli("respawn", agent_id)
    assert res.exit_code == 0, res.output
    m = re.fullmatch(rf"respawned {agent_id} as (\S+)", res.stdout.strip())
    assert m, res.stdout
    new_id = m.group(1)
    assert new_id != agent_id
    live.wait_status(new_id, "running")

    res = cli("rm", new_id, "--force")
    assert res.exit_code == 0 and res.stdout.strip() == f"removed {new_id}"
    ids = {
        a["id"]
        for w in json.loads(cli("ls", "-o", "json").stdout)["workspaces"]
        for a in w["agents"]
    }
    assert new_id not in ids

    res = cli("kill", "does-not-exist")
    assert res.exit_code == 3
    assert res.stderr.strip() == "error: server returned 404: agent 'does-not-exist' not found"


def test_usage(cli: Cli, live: LiveStack) -> None:
    agent_id = spawn(cli, "beta", "count the costs")
    live.wait_finished(agent_id)
    live.wait_status(agent_id, "done")

    def beta_group() -> dict | None:
        res = cli("usage", "-o", "json")
        assert res.exit_code == 0, res.output
        report = json.loads(res.stdout)
        assert {"since", "until", "groups"} <= set(report)
        g = next((g for g in report["groups"] if g["workspace"] == "beta"), None)
        return g if g and g["outcomes"]["done"] >= 1 else None

    group = live.wait_for(beta_group, what="usage for beta")
    assert group["runs"] >= 1 and group["turns"] >= 3
    assert group["cost_usd"] is not None and group["cost_usd"] > 0
    assert group["input_tokens"] >= 1713

    res = cli("usage", "--days", "2")
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("usage from ")
    assert re.search(r"^beta\s+\d+\s+\d+", res.stdout, re.M), res.stdout
    assert cli("usage", "--since", "2000-01-01T00:00:00+00:00", "-o", "json").exit_code == 0
    res = cli("usage", "--since", "yesterday")
    assert res.exit_code == 2 and res.stderr.startswith("error: server returned 4")


# ---------------------------------------------------------------------------- failures


def test_unreachable_daemon_is_one_line(cli: Cli) -> None:
    addr = f"http://127.0.0.1:{free_port()}"
    for args in (["ls"], ["ls", "-o", "json"], ["status"], ["follow", "abc"], ["kill", "abc"]):
        res = cli(*args, addr=addr)
        assert res.exit_code == 6, (args, res.output)  # unreachable
        assert res.stderr.strip().splitlines()[-1] == (
            f"error: cannot reach prosperod at {addr} (is the daemon running?)"
        )
        assert len(res.stderr.strip().splitlines()) == 1
        no_traceback(res)


def test_invalid_addr_is_a_usage_error(cli: Cli) -> None:
    for bad in ("ftp://example.org", "http://", "http://[::1"):
        res = cli("ls", addr=bad)
        assert res.exit_code == 2, (bad, res.output)
        assert res.stderr.startswith(f"error: invalid --addr / PROSPERO_ADDR {bad!r}")
        no_traceback(res)


def test_addr_without_scheme_and_after_command(cli: Cli, live: LiveStack) -> None:
    bare = live.url.removeprefix("http://")
    res = cli("ls", "-o", "json", addr=bare)
    assert res.exit_code == 0 and json.loads(res.stdout)["host"] == "cli-test"
    dead = f"http://127.0.0.1:{free_port()}"
    res = cli("ls", "--addr", live.url, addr=dead)  # per-command --addr wins over the env
    assert res.exit_code == 0, res.output


def test_typos_show_usage_not_tracebacks(cli: Cli) -> None:
    res = cli("lss")
    assert res.exit_code == 2
    assert "Usage: prospero" in res.output and "No such command" in res.output
    no_traceback(res)

    res = cli("spawn", "alpha")  # missing PROMPT
    assert res.exit_code == 2 and "Usage:" in res.output and "PROMPT" in res.output
    no_traceback(res)

    res = cli("ls", "--output", "xml")
    assert res.exit_code == 2 and "Usage:" in res.output
    res = cli("spawn", "alpha", "x", "--drive-protocol", "smoke-signals")
    assert res.exit_code == 2 and "Usage:" in res.output
    res = cli("follow", "x", "--from", "-3")
    assert res.exit_code == 2 and "Usage:" in res.output

    res = cli("--help")
    assert res.exit_code == 0
    for cmd in ("workspace", "spawn", "ls", "status", "follow", "kill", "respawn", "rm",
                "send", "end-input", "cancel", "adopt", "usage", "demo"):  # fmt: skip
        assert cmd in res.stdout
    assert "--install-completion" in res.stdout  # shell completion is available


def test_follow_a_killed_agent_ends(cli: Cli, live: LiveStack) -> None:
    """A killed worker never writes RunEnd: its history still ends, with agent_finished
    `killed`, and follow stops there. A second kill is refused (the agent has finished)."""
    agent_id = spawn(cli, "beta", "slow job", "--label", "doomed")
    live.wait_status(agent_id, "running")
    assert cli("kill", agent_id).exit_code == 0
    live.wait_status(agent_id, "killed")
    res = cli("follow", agent_id)
    assert res.exit_code == 0, res.output
    assert "line 0001" in res.stdout
    assert "[status] running → killed" in res.stdout
    assert "[finished] killed" in res.stdout
    res = cli("kill", agent_id)
    assert res.exit_code == 5 and "already finished" in res.stderr
