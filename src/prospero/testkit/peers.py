"""Command lines for the real third-party peers the tests drive: ACP agents (acp.md §14) and
the MCP inspector CLI (the MCP server at /mcp, issue 15).

They are installed by `tests/peers/install.sh` (npm ci of the pinned TypeScript SDK and
inspector CLI, and the Python SDK's sdist examples). When one is missing these functions raise `PeerNotInstalled`
with the command to run: a missing peer is a test failure, never a silent skip.

`PROSPERO_PEERS_DIR` overrides where the peers live (default: `<repo>/tests/peers`).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

TS_SDK_VERSION = "1.9.0"
MCP_INSPECTOR_CLI_VERSION = "1.0.3"
PY_SDK_VERSION = "0.12.1"


class PeerNotInstalled(RuntimeError):
    """A real ACP peer is not installed; the message says how to install it."""


def peers_dir() -> Path:
    env = os.environ.get("PROSPERO_PEERS_DIR")
    if env:
        return Path(env)
    # src/prospero/testkit/peers.py -> repo root is three levels above the package dir
    return Path(__file__).resolve().parents[3] / "tests" / "peers"


def install_command() -> str:
    return f"bash {peers_dir() / 'install.sh'}"


def _missing(what: str) -> PeerNotInstalled:
    return PeerNotInstalled(f"{what} is not installed; run: {install_command()}")


def ts_example_agent_path() -> Path:
    return (
        peers_dir()
        / "node_modules"
        / "@agentclientprotocol"
        / "sdk"
        / "dist"
        / "examples"
        / "agent.js"
    )


def ts_example_agent_command() -> list[str]:
    """The TypeScript SDK's example agent (@agentclientprotocol/sdk@1.9.0): a scripted turn
    with 1 s pauses, a read tool call, then an edit that asks permission (`allow` /
    `reject`); honours session/cancel."""
    node = shutil.which("node")
    if node is None:
        raise PeerNotInstalled("node (>= 20) is not on PATH; the TypeScript ACP peer needs it")
    path = ts_example_agent_path()
    if not path.is_file():
        raise _missing(f"the TypeScript ACP example agent ({path})")
    return [node, str(path)]


def python_example_path(name: str) -> Path:
    return peers_dir() / "python" / "examples" / name


def _python_example(name: str) -> list[str]:
    path = python_example_path(name)
    if not path.is_file():
        raise _missing(f"the Python SDK example {name} ({path})")
    # The examples import `acp`: run them with this interpreter (the project venv has it).
    return [sys.executable, str(path)]


def python_echo_agent_command() -> list[str]:
    """The Python SDK's `examples/echo_agent.py`: one agent_message_chunk per prompt block."""
    return _python_example("echo_agent.py")


def python_example_agent_command() -> list[str]:
    """The Python SDK's `examples/agent.py`: "Client sent:" then each prompt block."""
    return _python_example("agent.py")


def mcp_inspector_cli_dir() -> Path:
    """Where the MCP inspector CLI must run: its own `build/` directory. Its `index.js` picks the
    package.json for its client identity with `fs.existsSync("../package.json")` (relative to
    the working directory) but imports it relative to the module, so from a directory whose
    parent has no package.json it looks for `node_modules/@modelcontextprotocol/package.json`
    and exits 1 (1.0.3)."""
    return peers_dir() / "node_modules" / "@modelcontextprotocol" / "inspector-cli" / "build"


def mcp_inspector_cli_command() -> list[str]:
    """The MCP inspector CLI (`@modelcontextprotocol/inspector-cli@1.0.3`, the `mcp-inspector-cli`
    bin): `--cli URL --transport http --method tools/list|tools/call ...` prints the JSON
    result on stdout (its deprecation banner goes to stderr). Run it in
    `mcp_inspector_cli_dir()`."""
    node = shutil.which("node")
    if node is None:
        raise PeerNotInstalled("node (>= 20) is not on PATH; the MCP inspector CLI needs it")
    path = mcp_inspector_cli_dir() / "cli.js"
    if not path.is_file():
        raise _missing(f"the MCP inspector CLI ({path})")
    return [node, str(path)]
