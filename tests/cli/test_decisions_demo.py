"""The issue's "done when": in `prospero demo` (a real process), a supervised ACP agent stops on
a permission request, `prospero decisions` lists it, `prospero approve ID` lets the agent
finish, and the audit shows who approved."""

from __future__ import annotations

import json
import shlex
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.daemon.test_demo import DemoProcess, cli, wait_for

LABEL = "acp-supervised-edit"


@pytest.fixture
def demo() -> Iterator[DemoProcess]:
    d = DemoProcess()
    try:
        yield d
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(10)


def test_demo_supervised_agent_waits_for_approval(demo: DemoProcess) -> None:
    url = demo.wait_banner()
    assert "prospero --addr" in demo.banner_text() and " decisions " in demo.banner_text()
    fleet = httpx.get(f"{url}/api/fleet", timeout=10).json()
    agent = next(a for w in fleet["workspaces"] for a in w["agents"] if a["label"] == LABEL)
    assert (agent["drive_protocol"], agent["posture"]) == ("acp", "supervised")

    def pending() -> list[dict[str, Any]] | None:
        res = cli(url, "decisions", "--agent", agent["id"], "-o", "json")
        assert res.returncode == 0, res.stderr
        rows = json.loads(res.stdout)
        return rows or None

    [d] = wait_for(pending, 60, "the supervised agent's permission request")
    assert d["tool_call"]["title"] == "Edit src/app.py" and d["state"] == "pending"
    listing = cli(url, "decisions")
    assert listing.returncode == 0 and d["id"] in listing.stdout
    # The agent is stopped on the request: no finish yet.
    events = httpx.get(f"{url}/api/agents/{agent['id']}/events", timeout=10).json()
    assert not any(e["kind"]["kind"] == "agent_finished" for e in events)

    res = cli(url, "approve", d["id"], "--note", "demo approval")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"approved {d['id']} (Allow once: Edit src/app.py) as anonymous"
    # The follow and the audit are independent once the approval is in: both CLI processes
    # (~1.3 s of imports each) run at once.
    with ThreadPoolExecutor(max_workers=2) as pool:
        following = pool.submit(cli, url, "follow", agent["id"])
        auditing = pool.submit(
            cli, url, "decisions", "--state", "all", "--agent", agent["id"], "-o", "json"
        )
        res, audit = following.result(), auditing.result()
    assert res.returncode == 0, res.stderr
    assert "⏸ permission asked: Edit src/app.py (edit)" in res.stdout
    assert "✔ permission Edit src/app.py (edit): allowed (Allow once) by anonymous" in res.stdout
    assert "✓ Edit src/app.py" in res.stdout and "[finished] EndOfTurn" in res.stdout

    [a] = json.loads(audit.stdout)
    assert (a["state"], a["decided_by"], a["note"], a["option_id"]) == (
        "decided",
        "anonymous",
        "demo approval",
        "allow-once",
    )
    demo.proc.send_signal(signal.SIGTERM)
    assert demo.proc.wait(30) == 0, "".join(demo.stderr)
    assert "Traceback" not in "".join(demo.stderr)


def test_the_demos_suggested_acp_spawn_does_what_it_says(demo: DemoProcess) -> None:
    """The banner's ACP spawn runs supervised: its edit waits in `prospero decisions`, and
    once approved the edit is made. The same spawn under the default posture (autonomous) has
    its edit denied, and its follow says so instead of ending on a bare `EndOfTurn`."""
    url = demo.wait_banner()
    banner = wait_for(
        lambda: text if "usage" in (text := demo.banner_text()) else None, 30, "the banner"
    )
    [line] = [ln for ln in banner.splitlines() if "spawn" in ln and "--drive-protocol acp" in ln]
    argv = shlex.split(line.split("#", 1)[0])
    assert argv[0] == "prospero" and argv[1:3] == ["--addr", url], argv
    suggested = argv[3:]
    assert suggested[-2:] == ["--posture", "supervised"], suggested
    assert "decisions" in banner.split(line, 1)[1].splitlines()[1]  # the hint below it

    res = cli(url, *suggested, "-o", "json")
    assert res.returncode == 0, res.stderr
    agent_id = json.loads(res.stdout)["agent_id"]

    def pending() -> list[dict[str, Any]] | None:
        res = cli(url, "decisions", "--agent", agent_id, "-o", "json")
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout) or None

    [d] = wait_for(pending, 60, "the suggested agent's permission request")
    assert d["tool_call"]["title"] == "Edit src/app.py"
    assert cli(url, "approve", d["id"]).returncode == 0
    res = cli(url, "follow", agent_id)
    assert res.returncode == 0, res.stderr
    assert "✔ permission Edit src/app.py (edit): allowed" in res.stdout, res.stdout
    assert "✓ Edit src/app.py" in res.stdout and "[finished] EndOfTurn" in res.stdout
    assert "denied by its posture" not in res.stdout

    # without --posture supervised (what the banner used to suggest): denied, and said so
    unsupervised = suggested[:-2]
    res = cli(url, *unsupervised, "--follow")
    assert res.returncode == 0, res.stderr
    out = " ".join(res.stdout.split())
    assert "✘ permission Edit src/app.py (edit): denied" in out, out
    assert "[finished] EndOfTurn" in out
    assert (
        "⚠ every permission request of this run (1) was denied by its posture: an autonomous "
        "agent has nobody to ask. To approve them, spawn with --posture supervised (or set the "
        "workspace's: prospero policy set payments-api --posture supervised) and answer with "
        "prospero decisions / prospero approve ID"
    ) in out, out
    assert out.index("[finished]") < out.index("⚠ every permission request")
    demo.proc.send_signal(signal.SIGTERM)
    assert demo.proc.wait(30) == 0, "".join(demo.stderr)
