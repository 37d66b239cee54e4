"""Named contexts (`prospero context ...`, issue 14 item 3): the config file under
XDG_CONFIG_HOME (mode 0600), the current context's server and token, --context, and the flags
and environment that override it. Against a real prosperod that requires a token, and a
recording HTTP server (a context's token must never go to another server)."""

from __future__ import annotations

import json
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from prospero.cli import config
from tests.cli.conftest import Cli, LiveStack, free_port

TOKEN = "ctx-s3cret"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    stack = LiveStack(tmp_path_factory.mktemp("cli-ctx"), tokens={"ops": TOKEN})
    with stack.serving("alpha"):
        yield stack


class Recorder(BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def do_GET(self) -> None:
        Recorder.seen.append(self.headers.get("Authorization"))
        body = json.dumps({"host": "recorder", "workspaces": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Recorder.seen = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def no_env_server(cli: Cli, *args: str, **env: str | None) -> object:
    """The CLI with neither PROSPERO_ADDR nor PROSPERO_API_TOKEN: the context decides."""
    return cli(*args, env={"PROSPERO_ADDR": None, "PROSPERO_API_TOKEN": None, **env})


def test_contexts_file_server_token_and_overrides(
    secured: LiveStack, recorder: str, tmp_path: Path
) -> None:
    home = tmp_path / "xdg"
    cli = Cli(secured.url, home)
    res = no_env_server(cli, "context", "ls")
    assert res.exit_code == 0 and res.stdout.startswith("no contexts")  # type: ignore[attr-defined]

    token_file = tmp_path / "ops.token"
    token_file.write_text(TOKEN + "\n")
    res = cli("context", "add", "prod", "--server", secured.url, "--token-file", str(token_file))
    assert res.exit_code == 0, res.output
    path = home / "prospero" / "config.yaml"
    assert res.stdout.strip() == f"added context 'prod' (current): {secured.url} in {path}"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    doc = yaml.safe_load(path.read_text())
    assert doc == {
        "current-context": "prod",
        "contexts": {"prod": {"server": secured.url, "token-file": str(token_file)}},
    }

    # the current context names the server and the token
    res = no_env_server(cli, "ls", "-o", "json")
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    assert json.loads(res.stdout)["host"] == "cli-test"  # type: ignore[attr-defined]
    # an --addr naming the same server still gets the context's token
    res = cli("--addr", secured.url + "/", "ls", env={"PROSPERO_API_TOKEN": None})
    assert res.exit_code == 0, res.output
    # an --addr naming another server never gets it
    res = cli("--addr", recorder, "ls", "-o", "json", env={"PROSPERO_API_TOKEN": None})
    assert res.exit_code == 0, res.output
    assert Recorder.seen and set(Recorder.seen) == {None}
    # flags and the environment win over the context
    res = no_env_server(cli, "ls", PROSPERO_API_TOKEN="wrong")
    assert res.exit_code == 4  # type: ignore[attr-defined]
    dead = f"http://127.0.0.1:{free_port()}"
    res = no_env_server(cli, "ls", PROSPERO_ADDR=dead)
    assert res.exit_code == 6 and dead in res.stderr  # type: ignore[attr-defined]

    # a second context with an inline token (stdin), chosen per command or made current
    res = cli("context", "add", "rec", "--server", recorder, "--token-stdin", input="tok-rec\n")
    assert res.exit_code == 0 and "(current)" not in res.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    Recorder.seen = []
    res = no_env_server(cli, "--context", "rec", "ls")
    assert res.exit_code == 0 and set(Recorder.seen) == {"Bearer tok-rec"}  # type: ignore[attr-defined]
    res = no_env_server(cli, "ls", PROSPERO_CONTEXT="rec")
    assert res.exit_code == 0  # type: ignore[attr-defined]
    listed = json.loads(cli("context", "ls", "-o", "json").stdout)
    assert listed == [
        {"name": "prod", "server": secured.url, "token_file": str(token_file),
         "has_token": False, "current": True},
        {"name": "rec", "server": recorder, "token_file": None, "has_token": True,
         "current": False},
    ]  # fmt: skip
    assert "tok-rec" not in cli("context", "ls").stdout  # the token is never shown
    assert cli("context", "use", "rec").stdout.strip() == f"switched to context 'rec' ({recorder})"
    assert cli("context", "current").stdout.strip() == "rec"

    res = no_env_server(cli, "--context", "nope", "ls")
    assert res.exit_code == 2  # type: ignore[attr-defined]
    assert "no context 'nope' (contexts: prod, rec)" in res.stderr  # type: ignore[attr-defined]
    assert cli("context", "use", "nope").exit_code == 3
    assert cli("context", "rm", "rec").exit_code == 0
    assert cli("context", "current").exit_code == 3  # the current one was removed
    assert yaml.safe_load(path.read_text())["current-context"] is None

    bad = cli("context", "add", "x y", "--server", recorder)
    assert bad.exit_code == 2 and "invalid context name" in bad.stderr
    bad = cli("context", "add", "x", "--server", "ftp://nowhere")
    assert bad.exit_code == 2
    bad = cli("context", "add", "x", "--server", recorder, "--token-file", str(tmp_path / "no"))
    assert bad.exit_code == 2 and "cannot read the token file" in bad.stderr


def test_a_broken_config_file_is_one_line(tmp_path: Path, secured: LiveStack) -> None:
    home = tmp_path / "xdg"
    (home / "prospero").mkdir(parents=True)
    (home / "prospero" / "config.yaml").write_text("contexts: [not, a, mapping]\n")
    cli = Cli(secured.url, home)
    res = no_env_server(cli, "ls")
    assert res.exit_code == 2  # type: ignore[attr-defined]
    assert res.stderr.startswith("error: ") and "contexts must be a mapping" in res.stderr  # type: ignore[attr-defined]
    assert len(res.stderr.strip().splitlines()) == 1  # type: ignore[attr-defined]
    # with both the server and the token given the file is not needed
    res = cli("ls", "-o", "json", token=TOKEN)
    assert res.exit_code == 0, res.output


def test_config_path_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(config.CONFIG_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config.config_path() == tmp_path / "xdg" / "prospero" / "config.yaml"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")  # invalid per the spec: ignored
    assert config.config_path() == tmp_path / "home" / ".config" / "prospero" / "config.yaml"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert config.config_path() == tmp_path / "home" / ".config" / "prospero" / "config.yaml"
    monkeypatch.setenv(config.CONFIG_ENV, str(tmp_path / "elsewhere.yaml"))
    assert config.config_path() == tmp_path / "elsewhere.yaml"
