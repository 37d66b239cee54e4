"""`prospero automation ...` end to end through HTTP (typer's CliRunner) against a live
prosperod (Runtime + API + fake calibands): create with a webhook (secret written 0600),
list/show, a signed `trigger` spawning an agent, a forged one refused, run-now, runs with the
agents, disable/enable, rotate-secret, delete, and usage errors."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from tests.cli.conftest import Cli, LiveStack


def test_automation_lifecycle(cli: Cli, live: LiveStack, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    r = cli(
        "automation",
        "create",
        "triage",
        "--workspace",
        "alpha",
        "--prompt",
        "Triage {{payload.title}} ({{trigger}})",
        "--cron",
        "0 3 * * *",
        "--webhook",
        "--label",
        "team=infra",
        "--secret-file",
        str(secret),
    )
    assert r.exit_code == 0, r.output
    assert "created automation triage" in r.output
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert len(secret.read_text().strip()) == 64
    assert secret.read_text().strip() not in r.output

    r = cli("automation", "list")
    assert r.exit_code == 0, r.output
    assert "triage" in r.output and "0 3 * * *" in r.output and "alpha" in r.output
    r = cli("automation", "show", "triage", "-o", "json")
    shown = json.loads(r.output)
    assert shown["labels"] == {"team": "infra"} and shown["webhook"] is True
    assert shown["next_fire"].endswith("T03:00:00.000000+00:00")

    r = cli(
        "automation",
        "trigger",
        "triage",
        "--secret-file",
        str(secret),
        "--data",
        '{"title": "flaky test"}',
    )
    assert r.exit_code == 0, r.output
    agent = r.output.split("spawned agent ")[1].strip()
    rec = live.agent(agent)
    assert rec is not None
    r = cli("automation", "trigger", "triage", "--secret-file", str(secret), "--timestamp")
    assert r.exit_code == 0, r.output

    forged = tmp_path / "forged"
    forged.write_text("0" * 64)
    r = cli("automation", "trigger", "triage", "--secret-file", str(forged))
    assert r.exit_code != 0 and "signature does not match" in r.output

    r = cli("automation", "run", "triage")
    assert r.exit_code == 0, r.output
    manual = r.output.split("spawned agent ")[1].strip()

    r = cli("automation", "runs", "triage", "-o", "json")
    runs = json.loads(r.output)
    assert [x["trigger"] for x in runs] == ["manual", "webhook", "webhook"]
    assert runs[0]["agent_id"] == manual and runs[2]["agent_id"] == agent
    r = cli("automation", "runs", "triage")
    assert manual in r.output and "webhook" in r.output

    r = cli("automation", "disable", "triage")
    assert r.exit_code == 0 and "disabled triage" in r.output
    r = cli("automation", "run", "triage")
    assert r.exit_code != 0 and "disabled" in r.output
    r = cli("automation", "enable", "triage")
    assert r.exit_code == 0 and "enabled triage" in r.output

    r = cli("automation", "rotate-secret", "triage")
    assert r.exit_code == 0 and "shown only now" in r.output
    r = cli("automation", "trigger", "triage", "--secret-file", str(secret))
    assert r.exit_code != 0  # the old secret stopped verifying

    r = cli("automation", "delete", "triage")
    assert r.exit_code == 0, r.output
    r = cli("automation", "show", "triage")
    assert r.exit_code != 0 and "no automation" in r.output


def test_automation_bad_input(cli: Cli) -> None:
    r = cli("automation", "create", "x", "--workspace", "alpha", "--prompt", "p", "--cron", "* *")
    assert r.exit_code != 0 and "5 fields" in r.output
    r = cli("automation", "create", "x", "--workspace", "nope", "--prompt", "p")
    assert r.exit_code != 0 and "unknown workspace" in r.output
    r = cli("automation", "create", "x", "--workspace", "alpha", "--prompt", "{{ nope }}")
    assert r.exit_code != 0 and "offset 0" in r.output
    r = cli("automation", "create", "x", "--workspace", "alpha", "--prompt", "p", "--label", "k")
    assert r.exit_code != 0 and "KEY=VALUE" in r.output
