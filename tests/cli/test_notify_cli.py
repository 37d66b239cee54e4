"""`prospero notify ...` end to end through HTTP against a live prosperod: add (URL shown
masked), list/show, test against a real receiver (delivered: exit 0; refused: non-zero with
the status), disable/enable, log, remove, and usage errors before any request."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.cli.conftest import Cli, LiveStack


class _Hook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        server = self.server
        length = int(self.headers.get("Content-Length", "0"))
        server.bodies.append(json.loads(self.rfile.read(length)))  # type: ignore[attr-defined]
        status = server.statuses.pop(0) if server.statuses else 200  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    srv.bodies = []  # type: ignore[attr-defined]
    srv.statuses = []  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_notify_lifecycle(cli: Cli, live: LiveStack, hook: ThreadingHTTPServer) -> None:
    port = hook.server_address[1]
    url = f"http://127.0.0.1:{port}/services/T0/B0/very-secret"
    r = cli("notify", "add", "ops", url, "--format", "slack", "-e", "agent_failed")
    assert r.exit_code == 0, r.output
    assert f"http://127.0.0.1:{port}/…" in r.output and "very-secret" not in r.output
    r = cli("notify", "list")
    assert r.exit_code == 0, r.output
    assert "ops" in r.output and "slack" in r.output and "agent_failed" in r.output
    assert "very-secret" not in r.output
    shown = json.loads(cli("notify", "show", "ops", "-o", "json").output)
    assert shown["events"] == ["agent_failed"] and shown["workspaces"] is None

    r = cli("notify", "test", "ops")
    assert r.exit_code == 0, r.output
    assert "delivered (HTTP 200)" in r.output
    assert hook.bodies[0]["text"].startswith("[Prospero] Test:")  # type: ignore[attr-defined]
    hook.statuses.append(410)  # type: ignore[attr-defined]
    r = cli("notify", "test", "ops")
    assert r.exit_code == 1, r.output
    assert "not delivered" in r.output and "HTTP 410" in r.output

    r = cli("notify", "log", "ops")
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if " test " in ln]
    assert len(lines) == 2 and "failed" in lines[0] and "delivered" in lines[1], r.output

    assert cli("notify", "disable", "ops").exit_code == 0
    assert json.loads(cli("notify", "show", "ops", "-o", "json").output)["enabled"] is False
    assert cli("notify", "enable", "ops").exit_code == 0
    assert cli("notify", "remove", "ops").exit_code == 0
    r = cli("notify", "show", "ops")
    assert r.exit_code == 3, r.output  # not found


def test_notify_usage_errors(cli: Cli, live: LiveStack) -> None:
    for args, words in (
        (("notify", "add", "x", "https://h/x", "--format", "teams"), "slack, discord or json"),
        (("notify", "add", "x", "https://h/x", "-e", "exploded"), "is not one of"),
    ):
        r = cli(*args)
        assert r.exit_code == 2, (args, r.output)
        assert words in r.output, (args, r.output)
    r = cli("notify", "add", "x", "ftp://host/x")
    assert r.exit_code == 2, r.output  # the server's 422, as a usage error
    assert "http:// or https://" in r.output
    assert json.loads(cli("notify", "list", "-o", "json").output) == []
