"""`prospero`: the command-line client of prosperod (prospero-surface.md §2).

A thin HTTP client, never a second control path: every command maps to API calls. `demo`
is the one exception in shape only: it replaces this process with the demo daemon.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

# The workspace and agent commands register themselves on `app` (before `demo`, so the
# order of `prospero --help` stays).
from prospero.cli import agents as _agents  # noqa: F401
from prospero.cli import workspaces as _workspaces  # noqa: F401
from prospero.cli.app import app


@app.command("demo")
def demo(
    port: Annotated[int, typer.Option("--port", "-p", min=0, max=65535, help="HTTP port.")] = 7878,
    data_dir: Annotated[
        str | None, typer.Option("--data-dir", help="Keep demo data here (default: a temp dir).")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Bind address.")] = "127.0.0.1",
    api_tokens_file: Annotated[
        str | None,
        typer.Option(
            "--api-tokens-file",
            help="Require scoped API tokens from this file (prospero token new).",
        ),
    ] = None,
) -> None:
    """Run prosperod with a fake caliband serving a demo fleet (no caliban needed)."""
    argv = [sys.executable, "-m", "prospero.daemon.demo", "--port", str(port), "--host", host]
    if data_dir:
        argv += ["--data-dir", data_dir]
    if api_tokens_file:
        argv += ["--api-tokens-file", api_tokens_file]
    sys.stdout.flush()
    sys.stderr.flush()
    # Replace this process: the CLI stays a pure HTTP client, the daemon runs on its own.
    os.execv(sys.executable, argv)


# The decisions, approve, deny, policy, token and cluster commands register themselves on `app`.
from prospero.cli import cluster as _cluster  # noqa: E402, F401
from prospero.cli import decisions as _decisions  # noqa: E402, F401
from prospero.cli import tokens as _tokens  # noqa: E402, F401


def main() -> None:
    app(prog_name="prospero")


if __name__ == "__main__":
    main()
