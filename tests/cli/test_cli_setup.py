"""Setup that tells the truth (issue 14, Deliver 2): `prospero workspace add` and `workspace
config` against a real stack, saying what is wrong and how to fix it, and registering nothing
that cannot work."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prospero.core.discovery import autostarted_processes
from tests.cli.conftest import Cli, LiveStack, git_repo


def names(live: LiveStack) -> set[str]:
    return {r["name"] for r in live.get("/api/workspaces").json()}


def said(res: Any) -> str:
    """What a command printed, as one line (the console wraps; usage errors come boxed)."""
    return " ".join(str(res.output).replace("│", " ").split())


def said_err(res: Any) -> str:
    """What a command printed on stderr, as one line."""
    return " ".join(str(res.stderr).split())


def no_traceback(res: object) -> None:
    out = getattr(res, "output", "")
    assert "Traceback" not in out, out
    exc = getattr(res, "exception", None)
    assert exc is None or isinstance(exc, SystemExit), repr(exc)


# ---------------------------------------------------------------------------- roots


def test_workspace_add_refuses_a_root_that_is_not_a_directory(
    cli: Cli, live: LiveStack, tmp_path: Path
) -> None:
    before = names(live)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a directory\n")
    cases = (
        (str(tmp_path / "nonexistent" / "path"), "does not exist"),
        (str(a_file), "is not a directory"),
    )
    for root, words in cases:
        res = cli("workspace", "add", "c", root)
        assert res.exit_code == 2, res.output  # usage: the input as given is invalid
        assert res.stdout == "", res.stdout  # no "registered"
        err = res.stderr.strip()  # one line (no progress: stderr is not a terminal)
        assert err == f"error: server returned 400: workspace root {root!r} {words}", err
        no_traceback(res)
        res = cli("workspace", "add", "c", root, "-o", "json")
        assert res.exit_code == 2 and res.stdout == "", res.output
    # nothing was registered
    assert names(live) == before
    assert live.get("/api/workspaces/c/agents").status_code == 404


# ---------------------------------------------------------------------------- autostart


@contextlib.contextmanager
def autostarting(tmp: Path, caliband_bin: str, **env: str) -> Iterator[tuple[LiveStack, Cli]]:
    """A stack whose prosperod autostarts `caliband_bin` for a root no caliband serves (`env`
    laid over the environment the caliband is started with)."""
    stack = LiveStack(tmp / "stack", autostart=True, caliband_bin=caliband_bin, default_env=env)
    with stack.serving():
        yield stack, Cli(stack.url, tmp / "xdg")


def executable(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def add_unreachable(cli: Cli, root: Path) -> tuple[str, dict[str, Any]]:
    """`workspace add w ROOT`: registered (exit 0, stdout says so), the cause on stderr."""
    res = cli("workspace", "add", "w", str(root))
    assert res.exit_code == 0, res.output
    no_traceback(res)
    assert res.stdout.strip() == f"registered workspace 'w' at {root}", res.output
    err = " ".join(res.stderr.split())  # (the console may wrap)
    assert err.startswith("warning: "), err
    assert "warning: the caliband of workspace 'w' is unreachable: " in err, err
    assert "`prospero workspace list` shows its health" in err, err
    row = json.loads(cli("workspace", "list", "-o", "json").stdout)[0]
    assert row["name"] == "w" and row["health"]["state"] == "unreachable", row
    assert row["health"]["reason"] in err, (row, err)
    return err, row


def test_autostart_without_caliband_on_path_says_so_and_how_to_fix_it(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    root = tmp_path / "w"
    root.mkdir()
    with autostarting(tmp_path, "caliband", PATH=str(empty)) as (_live, cli):
        err, row = add_unreachable(cli, root)
        want = (
            "caliband not found on PATH: install caliban, or pass --caliband-bin PATH to "
            "prosperod (or caliband_bin in its config file)"
        )
        assert row["health"]["reason"] == want, row
        assert "Errno" not in err, err
        # `ls` and `status` show the same cause, not a raw OSError
        res = cli("status", "-o", "json")
        fleet_ws = json.loads(res.stdout)["fleet"]["workspaces"][0]
        assert fleet_ws["health"] == {"state": "unreachable", "reason": want}
        # -o json carries it too (and nothing goes to stderr: no progress, no warning)
        res = cli("workspace", "add", "w", str(root), "-o", "json")
        assert res.exit_code == 0 and res.stderr == "", res.output
        out = json.loads(res.stdout)
        assert out["workspace"]["health"] == {"state": "unreachable", "reason": want}, out


def test_autostart_of_a_caliband_that_dies_or_cannot_run(tmp_path: Path) -> None:
    root = tmp_path / "w"
    root.mkdir()
    dies = executable(tmp_path / "dies", "#!/bin/sh\necho 'no licence' >&2\nexit 3\n")
    with autostarting(tmp_path, dies) as (_live, cli):
        _err, row = add_unreachable(cli, root)
        reason = row["health"]["reason"]
        assert f"caliband ('{dies}') for {root} exited with code 3 before listening" in reason
        assert "prosperod's log" in reason, reason
    not_exec = tmp_path / "not-exec"
    not_exec.write_text("#!/bin/sh\n")
    not_exec.chmod(0o644)
    with autostarting(tmp_path, str(not_exec)) as (_live, cli):
        _err, row = add_unreachable(cli, root)
        assert row["health"]["reason"] == (
            f"caliband binary {not_exec} cannot be executed (Permission denied): pass "
            "--caliband-bin PATH to prosperod (or caliband_bin in its config file)"
        )
    with autostarting(tmp_path, str(tmp_path / "nowhere" / "caliband")) as (_live, cli):
        _err, row = add_unreachable(cli, root)
        assert row["health"]["reason"].startswith(
            f"caliband binary {tmp_path / 'nowhere' / 'caliband'} does not exist: install"
        )


def test_autostart_that_works_registers_a_healthy_workspace_without_warning(
    tmp_path: Path,
) -> None:
    root = git_repo(tmp_path / "w")
    wrapper = executable(
        tmp_path / "caliband",
        f'#!/bin/sh\nexec "{sys.executable}" -m prospero.testkit.fake_caliband "$@"\n',
    )
    try:
        with autostarting(tmp_path, wrapper) as (_live, cli):
            res = cli("workspace", "add", "w", str(root))
            assert res.exit_code == 0, res.output
            assert res.stdout.strip() == f"registered workspace 'w' at {root}"
            assert res.stderr == "", res.stderr  # no warning (and no progress: not a tty)
            row = json.loads(cli("workspace", "list", "-o", "json").stdout)[0]
            assert row["health"] == {"state": "healthy"}, row
    finally:
        # Detached by design, so ended here; once the stack is stopped (a running one would
        # autostart the next as soon as its poll found this one gone).
        for proc in autostarted_processes():
            proc.terminate()
            proc.wait(10)
        assert autostarted_processes() == []


def test_a_terminal_sees_progress_while_prosperod_reaches_the_caliband(
    cli: Cli, live: LiveStack, tmp_path: Path
) -> None:
    """On an interactive terminal a transient spinner says what `workspace add` waits for
    (rich draws it on stderr and erases it once prosperod answers)."""
    root = tmp_path / "tty"
    root.mkdir()
    tty = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}
    res = cli("workspace", "add", "tty", str(root), env=tty)
    assert res.exit_code == 0, res.output
    assert "registering workspace 'tty': checking its root and reaching its caliband…" in (
        res.stderr
    ), res.stderr
    assert "warning: the caliband of workspace 'tty' is unreachable" in res.stderr
    assert cli("workspace", "rm", "tty").exit_code == 0
    res = cli("workspace", "add", "tty", str(root / "missing"), env=tty)
    assert res.exit_code == 2, res.output
    assert res.stderr.rstrip().endswith("does not exist"), res.stderr  # the error comes last


# ---------------------------------------------------------------------------- workspace config


def config_of(live: LiveStack, name: str) -> dict[str, Any]:
    row = next(r for r in live.get("/api/workspaces").json() if r["name"] == name)
    return dict(row["config"])


def test_workspace_config_changes_only_the_fields_given(
    cli: Cli, live: LiveStack, tmp_path: Path
) -> None:
    root = git_repo(tmp_path / "patchy")
    assert cli("workspace", "add", "patchy", str(root)).exit_code == 0
    res = cli(
        "workspace", "config", "patchy", "--provider", "ollama",
        "--base-url", "http://gpu:11434", "--env", "A=1", "--env", "B=2",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    full = {"provider": "ollama", "base_url": "http://gpu:11434", "env": {"A": "1", "B": "2"}}
    assert config_of(live, "patchy") == full

    # --env FOO=1 adds FOO; the provider, the base URL and the other variables stay
    res = cli("workspace", "config", "patchy", "--env", "FOO=1")
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == "updated provider config for workspace 'patchy'"
    assert config_of(live, "patchy") == {**full, "env": {"A": "1", "B": "2", "FOO": "1"}}
    # -o json shows the workspace after the change, as the PATCH answered it
    res = cli("workspace", "config", "patchy", "--unset-env", "A", "-o", "json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["workspace"]["config"]["env"] == {"B": "2", "FOO": "1"}, out

    # --clear-… unsets a field
    res = cli("workspace", "config", "patchy", "--clear-base-url")
    assert res.exit_code == 0, res.output
    assert config_of(live, "patchy") == {"provider": "ollama", "env": {"B": "2", "FOO": "1"}}
    res = cli("workspace", "config", "patchy", "--clear-env", "--env", "ONLY=1")
    assert res.exit_code == 0, res.output
    assert config_of(live, "patchy") == {"provider": "ollama", "env": {"ONLY": "1"}}
    res = cli("workspace", "config", "patchy", "--clear-env", "--clear-provider")
    assert res.exit_code == 0, res.output
    assert config_of(live, "patchy") == {}

    # contradictions and empty values are usage errors, before any request
    assert cli("workspace", "config", "patchy", "--provider", "ollama").exit_code == 0
    for args, words in (
        (("--provider", "x", "--clear-provider"), "--provider and --clear-provider contradict"),
        (("--provider", ""), "--provider needs a value (to unset it: --clear-provider)"),
        (("--env", "K=1", "--unset-env", "K"), "K: given to both --env and --unset-env"),
        (("--unset-env", ""), "expected a variable name"),
        (("--file", str(tmp_path / "c.json"), "--clear-env"), "--file replaces the whole config"),
    ):
        res = cli("workspace", "config", "patchy", *args)
        assert res.exit_code == 2, (args, res.output)
        assert words in said(res), (args, res.output)
        no_traceback(res)
    # the server's refusal loses nothing either
    res = cli("workspace", "config", "patchy", "--api-key-env", "K")
    assert res.exit_code == 2 and "takes no API key" in res.stderr, res.output
    assert config_of(live, "patchy") == {"provider": "ollama"}
    res = cli("workspace", "config", "nope", "--env", "A=1")
    assert res.exit_code == 3, res.output
    assert cli("workspace", "rm", "patchy").exit_code == 0


def test_workspace_daily_budget_is_set_shown_and_cleared(
    cli: Cli, live: LiveStack, tmp_path: Path
) -> None:
    root = git_repo(tmp_path / "capped")
    assert cli("workspace", "add", "capped", str(root)).exit_code == 0
    res = cli(
        "workspace", "config", "capped", "--daily-budget-usd", "2.5",
        "--daily-budget-tokens", "100000",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert config_of(live, "capped") == {"daily_budget_usd": 2.5, "daily_budget_tokens": 100000}
    res = cli("describe", "workspace", "capped")
    assert res.exit_code == 0, res.output
    assert "$2.5 or 100,000 tokens per UTC day" in " ".join(res.stdout.split()), res.stdout
    for bad in (("--daily-budget-usd", "0"), ("--daily-budget-tokens", "0")):
        res = cli("workspace", "config", "capped", *bad)
        assert res.exit_code == 2, (bad, res.output)
        no_traceback(res)
    assert config_of(live, "capped") == {"daily_budget_usd": 2.5, "daily_budget_tokens": 100000}
    res = cli("workspace", "config", "capped", "--clear-daily-budget")
    assert res.exit_code == 0, res.output
    assert config_of(live, "capped") == {}
    assert cli("workspace", "rm", "capped").exit_code == 0


# ---------------------------------------------------------------------------- provider keys

NO_KEY = "PROSPERO_TEST_KEY_NOT_SET"
KEY_WARNING = (
    f"provider 'anthropic' needs ANTHROPIC_API_KEY: set {NO_KEY} in prosperod's environment "
    "(until then its spawns are refused)"
)


def test_a_provider_key_missing_from_prosperod_is_a_warning_at_config_time(
    cli: Cli, live: LiveStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(NO_KEY, raising=False)  # (the stack's prosperod runs in this process)
    root = git_repo(tmp_path / "keyed")
    assert cli("workspace", "add", "keyed", str(root)).exit_code == 0
    res = cli("workspace", "config", "keyed", "--provider", "anthropic", "--api-key-env", NO_KEY)
    assert res.exit_code == 0, res.output  # accepted: the variable may be set before a spawn
    assert res.stdout.strip() == "updated provider config for workspace 'keyed'"
    assert f"warning: {KEY_WARNING}" in said_err(res), res.stderr
    # the API says it in the answer and in the listing; -o json carries it
    res = cli("workspace", "config", "keyed", "--env", "A=1", "-o", "json")
    assert json.loads(res.stdout)["workspace"]["warnings"] == [KEY_WARNING], res.stdout
    row = next(r for r in live.get("/api/workspaces").json() if r["name"] == "keyed")
    assert row["warnings"] == [KEY_WARNING]
    assert f"keyed: warning: {KEY_WARNING}" in said(cli("workspace", "list"))
    assert f"Warning: {KEY_WARNING}" in said(cli("describe", "workspace", "keyed"))
    # ... and the spawn is refused for that very reason
    res = cli("spawn", "keyed", "hello", "--shared-tree")
    assert res.exit_code == 2, res.output
    assert KEY_WARNING.split(" (until")[0] in res.stderr, res.stderr
    # once prosperod's environment has it, there is nothing to warn about
    monkeypatch.setenv(NO_KEY, "sk-test")
    row = next(r for r in live.get("/api/workspaces").json() if r["name"] == "keyed")
    assert "warnings" not in row, row
    res = cli("workspace", "config", "keyed", "--env", "B=2")
    assert res.exit_code == 0 and "needs ANTHROPIC_API_KEY" not in res.stderr, res.output
    monkeypatch.delenv(NO_KEY)
    # --file (PUT, the whole config) and `add --config` warn alike
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps({"provider": "anthropic", "api_key_from_env": NO_KEY}))
    res = cli("workspace", "config", "keyed", "--file", str(whole))
    assert res.exit_code == 0 and f"warning: {KEY_WARNING}" in said_err(res), res.output
    assert cli("workspace", "rm", "keyed").exit_code == 0
    res = cli("workspace", "add", "keyed", str(root), "--file", str(whole))
    assert res.exit_code == 0 and f"warning: {KEY_WARNING}" in said_err(res), res.output
    assert cli("workspace", "rm", "keyed").exit_code == 0


# ---------------------------------------------------------------------------- one flag per concept


def options_of(cli: Cli, *command: str) -> set[str]:
    """The options `--help` lists for a command."""
    return set(re.findall(r"(--[a-z][a-z-]+)", said(cli(*command, "--help"))))


def test_the_decision_timeout_has_one_name_and_the_old_one_still_works(
    cli: Cli, live: LiveStack, tmp_path: Path
) -> None:
    assert "--decision-timeout" in options_of(cli, "policy", "set")
    assert "--timeout" not in options_of(cli, "policy", "set")  # hidden, deprecated
    assert "--decision-timeout" in options_of(cli, "workspace", "config")

    def timeout_s() -> Any:
        return json.loads(cli("policy", "show", "alpha", "-o", "json").stdout)["timeout_s"]

    res = cli("policy", "set", "alpha", "--decision-timeout", "45")
    assert res.exit_code == 0 and res.stderr == "", res.output
    assert timeout_s() == 45.0
    res = cli("workspace", "config", "alpha", "--decision-timeout", "50")
    assert res.exit_code == 0 and timeout_s() == 50.0, res.output
    # the former spelling of `policy set` keeps scripts working, and says so
    res = cli("policy", "set", "alpha", "--timeout", "60")
    assert res.exit_code == 0, res.output
    assert res.stderr.strip() == "warning: --timeout is deprecated: use --decision-timeout"
    assert timeout_s() == 60.0
    res = cli("policy", "set", "alpha", "--timeout", "60", "--decision-timeout", "70")
    assert res.exit_code == 2, res.output
    assert "--timeout is the former name of --decision-timeout" in said(res)
    res = cli("policy", "set", "alpha", "--decision-timeout", "soon")
    assert res.exit_code == 2 and "--decision-timeout" in said(res), res.output
    assert timeout_s() == 60.0
    reset = tmp_path / "policy.json"
    reset.write_text(json.dumps({"rules": []}))
    assert cli("policy", "set", "alpha", str(reset)).exit_code == 0
    assert timeout_s() is None


def test_a_config_file_is_file_everywhere(cli: Cli, live: LiveStack, tmp_path: Path) -> None:
    """`workspace add --file` as `workspace config --file` (`--config` was add's name)."""
    assert "--file" in options_of(cli, "workspace", "add")
    assert "--config" not in options_of(cli, "workspace", "add")
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"env": {"A": "1"}}))
    for name, flag in (("filed", "--file"), ("configed", "--config")):
        root = tmp_path / name
        root.mkdir()
        res = cli("workspace", "add", name, str(root), flag, str(cfg))
        assert res.exit_code == 0, res.output
        assert config_of(live, name) == {"env": {"A": "1"}}
        deprecated = "warning: --config is deprecated: use --file"
        assert (deprecated in res.stderr) == (flag == "--config"), res.stderr
        assert cli("workspace", "rm", name).exit_code == 0


def test_the_tokens_file_is_named_as_prosperod_names_it(cli: Cli, tmp_path: Path) -> None:
    """`token new/list --api-tokens-file`, prosperod's flag (`--tokens-file` was the CLI's)."""
    assert "--api-tokens-file" in options_of(cli, "token", "new")
    assert "--tokens-file" not in options_of(cli, "token", "list")
    f = tmp_path / "tokens"
    res = cli("token", "new", "ci", "--scope", "operate", "--api-tokens-file", str(f))
    assert res.exit_code == 0 and res.stdout.startswith("pspo_"), res.output
    res = cli("token", "new", "old", "--tokens-file", str(f))
    assert res.exit_code == 0 and res.stdout.startswith("pspo_"), res.output
    assert res.stderr.startswith("warning: --tokens-file is deprecated: use --api-tokens-file")
    res = cli("token", "list", "--tokens-file", str(f), "-o", "json")
    assert [t["name"] for t in json.loads(res.stdout)] == ["ci", "old"], res.output
    res = cli("token", "list", env={"PROSPERO_API_TOKENS_FILE": str(f)})
    assert res.exit_code == 0 and "ci" in res.stdout, res.output
    res = cli("token", "list")
    assert res.exit_code == 2 and "give --api-tokens-file FILE" in said(res), res.output
