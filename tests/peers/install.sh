#!/usr/bin/env bash
# Install the third-party peers the test suite drives: ACP agents (acp.md §14) and the MCP
# inspector CLI (tests/api/test_mcp.py). Idempotent: a second run with nothing changed does no
# network I/O. Used by .ci/run and ./run test.
#
#   1. `npm ci` of package-lock.json (versions pinned exactly in package.json):
#      - the TypeScript SDK's example agent (@agentclientprotocol/sdk@1.9.0)
#        -> node_modules/@agentclientprotocol/sdk/dist/examples/agent.js
#      - the MCP inspector CLI (@modelcontextprotocol/inspector-cli@1.0.3)
#        -> node_modules/@modelcontextprotocol/inspector-cli/build/cli.js
#   2. the Python SDK's example agents (only in the sdist): agent-client-protocol==0.12.1,
#      verified by sha256, examples extracted to python/examples/ (echo_agent.py, agent.py, ...)
#
# Both destinations are git-ignored. Needs node >= 20 + npm, and python3 with pip (or uv).
set -euo pipefail
cd "$(dirname "$0")"

ACP_PY_VERSION="0.12.1"
ACP_PY_SDIST="agent_client_protocol-${ACP_PY_VERSION}.tar.gz"
ACP_PY_SHA256="9963ccb590ed96d7dc542c9c023e90676fc76b1c6562e21a9ee112f4fbcb0095"

# --- 1. npm peers: TypeScript example agent, MCP inspector CLI ---------------------------------
lock_sum="$(sha256sum package-lock.json | cut -d' ' -f1)"
stamp="node_modules/.prospero-lock-sha256"
if [ -f node_modules/@agentclientprotocol/sdk/dist/examples/agent.js ] \
  && [ -f node_modules/@modelcontextprotocol/inspector-cli/build/cli.js ] \
  && [ "$(cat "$stamp" 2>/dev/null)" = "$lock_sum" ]; then
  echo "peers: npm peers already installed"
else
  command -v npm >/dev/null 2>&1 || { echo "peers: npm not found (need node >= 20 and npm)" >&2; exit 1; }
  echo "peers: npm ci (@agentclientprotocol/sdk@1.9.0, @modelcontextprotocol/inspector-cli@1.0.3)"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$lock_sum" >"$stamp"
fi

# --- 2. Python SDK example agents -------------------------------------------------------------
if [ -f python/examples/echo_agent.py ] && [ -f python/examples/agent.py ] \
  && [ "$(cat python/.version 2>/dev/null)" = "$ACP_PY_VERSION" ]; then
  echo "peers: Python SDK examples already installed"
else
  echo "peers: fetching the agent-client-protocol==${ACP_PY_VERSION} sdist"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  if python3 -m pip --version >/dev/null 2>&1; then
    pip=(python3 -m pip)
  elif command -v uvx >/dev/null 2>&1; then
    pip=(uvx pip)
  else
    echo "peers: need pip (python3 -m pip) or uv (uvx) to fetch the sdist" >&2
    exit 1
  fi
  "${pip[@]}" download --quiet --no-binary :all: --no-deps \
    "agent-client-protocol==${ACP_PY_VERSION}" -d "$tmp"
  echo "${ACP_PY_SHA256}  $tmp/${ACP_PY_SDIST}" | sha256sum -c --quiet -
  rm -rf python
  mkdir -p python/examples
  python3 - "$tmp/${ACP_PY_SDIST}" python/examples <<'PY'
import sys, tarfile
from pathlib import Path

sdist, dest = sys.argv[1], Path(sys.argv[2])
with tarfile.open(sdist) as tf:
    for m in tf.getmembers():
        parts = Path(m.name).parts
        if m.isfile() and len(parts) == 3 and parts[1] == "examples" and parts[2].endswith(".py"):
            (dest / parts[2]).write_bytes(tf.extractfile(m).read())
PY
  echo "$ACP_PY_VERSION" >python/.version
fi
echo "peers: ready"
