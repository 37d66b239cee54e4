"""`prospero demo`: replaces this process with the demo daemon (prosperod with a fake
caliband serving a demo fleet), so the CLI itself stays a pure HTTP client."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from prospero.cli.app import app


@app.command("demo", rich_help_panel="Setup")
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
