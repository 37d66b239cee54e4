"""Setup that tells the truth (issue 14, Deliver 2): `prospero workspace add` and `workspace
config` against a real stack, saying what is wrong and how to fix it, and registering nothing
that cannot work."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.conftest import Cli, LiveStack


def names(live: LiveStack) -> set[str]:
    return {r["name"] for r in live.get("/api/workspaces").json()}


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
        err = res.stderr.strip()
        assert err == f"error: server returned 400: workspace root {root!r} {words}", err
        no_traceback(res)
        res = cli("workspace", "add", "c", root, "-o", "json")
        assert res.exit_code == 2 and res.stdout == "", res.output
    # nothing was registered
    assert names(live) == before
    assert live.get("/api/workspaces/c/agents").status_code == 404
