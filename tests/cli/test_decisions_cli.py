"""`prospero decisions / approve / deny / policy / workspace config --posture` and the follow
rendering of decision events, end to end against a live prosperod (Runtime + HTTP API + fake
calibands serving scripted ACP agents), with API auth on so the audit shows the token name."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prospero.api.app import create_app
from prospero.api.server import ApiServer
from prospero.api.settings import ApiSettings
from prospero.cli.main import app as cli_app
from prospero.core.discovery import socket_path_for
from prospero.core.sources import canonical_root
from prospero.core.tokens import TokenTable
from prospero.core.wire.control import SpawnSpec
from prospero.daemon.runtime import DaemonConfig, Runtime
from prospero.testkit import acp_scripts as S
from prospero.testkit.fake_caliband import FakeCaliband
from tests.cli.conftest import Cli, LiveStack, git_repo
from tests.core.test_decisions import ask_turn

TOKEN = "tok-ops"
TOKENS = {"ops": TOKEN}


def acp_script_for(spec: SpawnSpec) -> S.AcpScript:
    if spec.initial_prompt.startswith("twice"):
        return S.AcpScript(turns=[[*ask_turn("c1")[:-1], *ask_turn("c2")[1:]]])
    return S.AcpScript(turns=[ask_turn()])


class AcpLiveStack(LiveStack):
    """LiveStack with ACP allowed and workspaces whose fake caliband serves scripted ACP
    agents."""

    async def _start(self) -> None:
        cfg = DaemonConfig(
            bind_host="127.0.0.1",
            port=0,
            data_dir=self.tmp / "data",
            host_label="cli-test",
            autostart=False,
            poll_interval=0.1,
            allow_acp=True,
            default_env={"CALIBAN_DAEMON_RUNTIME_DIR": self.rundir},
        )
        self.runtime = Runtime(cfg)
        await self.runtime.start()
        settings = ApiSettings(
            tokens=TokenTable.from_plaintext(self.tokens), heartbeat_interval=1.0, access_log=False
        )
        self.server = ApiServer(
            create_app(self.runtime, settings), "127.0.0.1", 0, graceful_timeout=3
        )
        await self.server.start()
        self.url = self.server.url

    def add_workspace(self, name: str, *, register: bool = True) -> str:
        root = canonical_root(str(git_repo(self.tmp / "repos" / name)))

        async def go() -> None:
            path = socket_path_for(root, {"CALIBAN_DAEMON_RUNTIME_DIR": self.rundir})
            self.fakes[name] = await FakeCaliband.start_unix(
                path, root=root, acp_script_for=acp_script_for
            )
            assert self.runtime is not None and self.runtime.manager is not None
            await self.runtime.manager.add_workspace(name, root)

        self.call(go())
        return root

    def pending(self, agent_id: str) -> dict[str, Any]:
        def one() -> dict[str, Any] | None:
            r = self.get(f"/api/decisions?state=pending&agent={agent_id}")
            rows = r.json()
            return rows[0] if rows else None

        return self.wait_for(one, 20, f"a pending decision of {agent_id}")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AcpLiveStack]:
    stack = AcpLiveStack(tmp_path_factory.mktemp("cli-dec"), tokens=TOKENS)
    with stack.serving("ws", "other"):
        yield stack


@pytest.fixture(scope="module")
def cli(live: AcpLiveStack) -> Cli:
    return Cli(live.url)


def run(cli: Cli, *args: str) -> Any:
    res = cli(*args, token=TOKEN)
    assert res.exit_code == 0, (args, res.output, res.stderr if res.stderr_bytes else "")
    return res


def spawn(cli: Cli, prompt: str = "edit", ws: str = "ws", posture: str = "supervised") -> str:
    res = run(
        cli,
        "spawn",
        ws,
        prompt,
        "--drive-protocol",
        "acp",
        "--posture",
        posture,
        "--shared-tree",
        "-o",
        "json",
    )
    return str(json.loads(res.stdout)["agent_id"])


def test_decisions_lists_and_approve_lets_the_agent_finish(cli: Cli, live: AcpLiveStack) -> None:
    agent_id = spawn(cli)
    d = live.pending(agent_id)
    res = run(cli, "decisions")
    assert d["id"] in res.stdout and agent_id in res.stdout
    assert "Edit src/app.py (edit)" in res.stdout
    assert "allow-once: Allow once | allow-always: Allow always" in res.stdout
    assert "no deadline" in res.stdout
    rows = json.loads(run(cli, "decisions", "-o", "json").stdout)
    assert d["id"] in [r["id"] for r in rows]
    assert run(cli, "decisions", "--agent", agent_id[:6]).stdout.startswith(d["id"])  # a prefix
    res = cli("decisions", "--agent", "nobody", token=TOKEN)
    assert res.exit_code == 3 and "agent 'nobody' not found" in res.stderr

    res = run(cli, "approve", d["id"][:9], "--note", "lgtm")  # a unique prefix of a pending one
    assert res.stdout.strip() == f"approved {d['id']} (Allow once: Edit src/app.py) as ops"
    events = live.wait_finished(agent_id)
    resolved = [e["kind"] for e in events if e["kind"]["kind"] == "decision_resolved"]
    assert [(r["by"], r["note"]) for r in resolved] == [("ops", "lgtm")]

    audit = json.loads(
        run(cli, "decisions", "--state", "all", "--agent", agent_id, "-o", "json").stdout
    )
    assert [(a["id"], a["state"], a["decided_by"], a["option_id"]) for a in audit] == [
        (d["id"], "decided", "ops", "allow-once")
    ]
    text = run(cli, "decisions", "--state", "decided", "--agent", agent_id).stdout
    assert "allowed (Allow once) by ops: lgtm" in text

    # follow renders the decision lines.
    out = run(cli, "follow", agent_id).stdout
    assert f"⏸ permission asked: Edit src/app.py (edit)  decision {d['id']}" in out
    assert f"prospero approve {d['id']} | prospero deny {d['id']}" in out
    assert "✔ permission Edit src/app.py (edit): allowed (Allow once) by ops: lgtm" in out
    assert "[finished] EndOfTurn" in out

    # A second answer is refused with the server's reason.
    res = cli("deny", d["id"], token=TOKEN)
    assert res.exit_code == 5 and "already decided by ops" in res.stderr  # conflict


def test_deny_always_answers_the_sessions_next_ask(cli: Cli, live: AcpLiveStack) -> None:
    agent_id = spawn(cli, "twice")
    d = live.pending(agent_id)
    res = run(cli, "deny", d["id"].removeprefix("dec-")[:6], "--always", "-o", "json")
    decided = json.loads(res.stdout)
    assert (decided["option_id"], decided["decided_by"]) == ("reject-always", "ops")
    live.wait_finished(agent_id)
    audit = json.loads(
        run(cli, "decisions", "--state", "all", "--agent", agent_id, "-o", "json").stdout
    )
    assert [(a["tool_call"]["id"], a["decided_by"], a["rule"]) for a in audit] == [
        ("c1", "ops", None),
        ("c2", "rule", f"session:{d['id']}"),
    ]
    out = run(cli, "follow", agent_id).stdout
    assert f"denied (Reject always) by rule [session:{d['id']}]" in out


def test_answer_errors(cli: Cli, live: AcpLiveStack) -> None:
    res = cli("approve", "dec-nope", token=TOKEN)
    assert res.exit_code == 3 and "no decision 'dec-nope'" in res.stderr  # not found
    agent_id = spawn(cli)
    d = live.pending(agent_id)
    other = spawn(cli)
    o = live.pending(other)
    res = cli("approve", "dec-", token=TOKEN)  # a prefix of both
    assert res.exit_code == 5 and "ambiguous" in res.stderr  # conflict
    assert d["id"] in res.stderr and o["id"] in res.stderr
    run(cli, "approve", o["id"])
    live.wait_finished(other)
    res = cli("approve", d["id"], "--option", "bogus", token=TOKEN)
    assert res.exit_code == 2 and "has no option 'bogus'" in res.stderr  # usage
    res = cli("approve", d["id"], token="wrong")
    assert res.exit_code == 4 and "401" in res.stderr  # auth
    # Answering with an explicit option id works too.
    res = run(cli, "deny", d["id"], "--option", "reject-once")
    assert "denied" in res.stdout
    live.wait_finished(agent_id)


def test_decisions_watch_prints_events_as_they_come(cli: Cli, live: AcpLiveStack) -> None:
    runner = CliRunner()
    env = {"PROSPERO_ADDR": live.url, "PROSPERO_API_TOKEN": TOKEN, "NO_COLOR": "1"}
    result: dict[str, Any] = {}

    def watch() -> None:
        result["res"] = runner.invoke(
            cli_app,
            ["decisions", "--watch", "--count", "2", "--timeout", "30", "--workspace", "other"],
            env=env,
        )

    # Nothing pending in "other" yet: the watcher starts from now.
    hub = live.server.app.state.api.hub  # type: ignore[union-attr]
    before = hub.open_streams
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    live.wait_for(lambda: hub.open_streams > before, 20, "the watcher is on the fleet stream")
    # Spawn and decide over plain HTTP (the CLI runner is busy in the thread).
    agent_id = live.call(_spawn_direct(live, "other"))
    d = live.pending(agent_id)
    r = _post(live, f"/api/decisions/{d['id']}", {"option_id": "allow-once"})
    assert r.status_code == 200
    t.join(40)
    assert not t.is_alive()
    out = result["res"].stdout
    assert "(no pending decisions)" in out
    assert (
        f"⏸ permission asked: Edit src/app.py (edit)  decision {d['id']} (agent {agent_id})" in out
    )
    assert "✔ permission Edit src/app.py (edit): allowed (Allow once) by ops" in out
    live.wait_finished(agent_id)


async def _spawn_direct(live: AcpLiveStack, ws: str) -> str:
    assert live.runtime is not None and live.runtime.manager is not None
    from prospero.types.api import SpawnRequest

    res = await live.runtime.manager.spawn(
        ws,
        SpawnRequest(prompt="edit", isolation="shared", drive_protocol="acp", posture="supervised"),
    )
    return res.agent_id


def _post(live: AcpLiveStack, path: str, body: dict[str, Any]) -> Any:
    import httpx

    return httpx.post(
        live.url + path, json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )


def test_policy_and_workspace_posture_commands(
    cli: Cli, live: AcpLiveStack, tmp_path: Path
) -> None:
    out = run(cli, "policy", "show", "ws").stdout
    assert "posture: default (autonomous)" in out and "ask timeout: none" in out
    assert "rules: (none" in out
    res = run(
        cli,
        "policy",
        "set",
        "ws",
        "--rule",
        'allow kind=execute command="make *" name=make-ok',
        "--rule",
        "deny kind=delete",
        "--posture",
        "supervised",
        "--decision-timeout",
        "90",
    )
    assert "updated the permission policy of workspace 'ws'" in res.stdout
    policy = json.loads(run(cli, "policy", "show", "ws", "-o", "json").stdout)
    assert policy == {
        "posture": "supervised",
        "timeout_s": 90.0,
        "rules": [
            {"action": "allow", "kind": "execute", "command": "make *", "name": "make-ok"},
            {"action": "deny", "kind": "delete"},
        ],
    }
    out = run(cli, "policy", "show", "ws").stdout
    assert "1. allow kind='execute' command='make *'  [make-ok]" in out
    assert "2. deny kind='delete'  [ws#2]" in out
    run(cli, "policy", "set", "ws", "--rule", "ask title=Edit*", "--append")
    rules = json.loads(run(cli, "policy", "show", "ws", "-o", "json").stdout)["rules"]
    assert [r["action"] for r in rules] == ["allow", "deny", "ask"]

    # A JSON list replaces the rules only; an object replaces the whole policy.
    f = tmp_path / "rules.json"
    f.write_text(json.dumps([{"action": "deny", "path": "/etc/*"}]))
    policy = json.loads(run(cli, "policy", "set", "ws", str(f), "-o", "json").stdout)
    assert policy["rules"] == [{"action": "deny", "path": "/etc/*"}]
    assert policy["posture"] == "supervised" and policy["timeout_s"] == 90.0
    f.write_text(json.dumps({"rules": [{"action": "allow", "kind": "read"}]}))
    policy = json.loads(run(cli, "policy", "set", "ws", str(f), "-o", "json").stdout)
    assert policy == {
        "posture": None,
        "timeout_s": None,
        "rules": [{"action": "allow", "kind": "read"}],
    }

    bad = cli("policy", "set", "ws", "--rule", "perhaps kind=read", token=TOKEN)
    flat = " ".join(bad.output.replace("│", " ").split())
    assert bad.exit_code == 2 and "a rule starts with allow | deny | ask" in flat
    bad = cli("policy", "set", "ws", token=TOKEN)
    assert bad.exit_code == 2 and "nothing to set" in bad.stderr
    bad = cli("policy", "show", "nope", token=TOKEN)
    assert bad.exit_code == 3 and "404" in bad.stderr

    # workspace config --posture / --decision-timeout: only the permission defaults change.
    res = run(
        cli, "workspace", "config", "ws", "--posture", "supervised", "--decision-timeout", "30"
    )
    assert "updated permission defaults of workspace 'ws'" in res.stdout
    assert "provider config" not in res.stdout
    policy = json.loads(run(cli, "policy", "show", "ws", "-o", "json").stdout)
    assert (policy["posture"], policy["timeout_s"]) == ("supervised", 30.0)
    run(cli, "workspace", "config", "ws", "--decision-timeout", "none")
    policy = json.loads(run(cli, "policy", "show", "ws", "-o", "json").stdout)
    assert (policy["posture"], policy["timeout_s"]) == ("supervised", None)
    # Spawns without --posture now get the workspace default.
    res = run(cli, "spawn", "ws", "edit", "--drive-protocol", "acp", "--shared-tree", "-o", "json")
    agent_id = json.loads(res.stdout)["agent_id"]
    assert live.agent(agent_id)["posture"] == "supervised"  # type: ignore[index]
    d = live.pending(agent_id)
    run(cli, "approve", d["id"])
    live.wait_finished(agent_id)
    run(cli, "policy", "set", "ws", str(f))  # back to no posture for other tests
