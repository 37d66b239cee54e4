"""`prospero workspace add NAME ROOT --caliband-addr HOST:PORT --ca-file F --token-file F
--server-name S`: a workspace on its own networked caliband (issue 14, Deliver 1)."""

from __future__ import annotations

import json
from pathlib import Path

from prospero.core.sources import canonical_root
from prospero.core.wire.control import TcpEndpoint
from prospero.testkit.certs import make_certs
from prospero.testkit.fake_caliband import FakeCaliband
from tests.cli.conftest import Cli, LiveStack, cli_script_for, git_repo

TOKEN = "tok-edge-secret"


def caliband_of(live: LiveStack, name: str) -> dict[str, str] | None:
    row = next(r for r in live.get("/api/workspaces").json() if r["name"] == name)
    found = row["config"].get("caliband")
    return found if isinstance(found, dict) else None


def test_workspace_add_on_its_own_networked_caliband(
    cli: Cli, live: LiveStack, tmp_path: Path
) -> None:
    certs = make_certs()
    ca = tmp_path / "ca.pem"
    ca.write_bytes(certs.ca_pem)
    token_file = tmp_path / "edge.token"
    token_file.write_text(TOKEN + "\n")
    root = git_repo(live.tmp / "repos" / "edge")

    async def start() -> FakeCaliband:
        return await FakeCaliband.start_tcp(
            "127.0.0.1",
            0,
            certs.cert_pem,
            certs.key_pem,
            TOKEN,
            root=canonical_root(str(root)),
            script_for=cli_script_for,
        )

    fake = live.call(start())
    live.fakes["edge-tcp"] = fake  # stopped with the stack
    endpoint = fake.endpoint
    assert isinstance(endpoint, TcpEndpoint)
    pre = live.call(fake.add_agent(working_dir=canonical_root(str(root)), serve=False))

    res = cli(
        "workspace", "add", "edge", str(root),
        "--caliband-addr", endpoint.addr, "--ca-file", str(ca),
        "--token-file", str(token_file), "--server-name", "caliband",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    want = {
        "addr": endpoint.addr,
        "ca_file": str(ca),
        "token_file": str(token_file),
        "server_name": "caliband",
    }
    assert caliband_of(live, "edge") == want
    assert TOKEN not in live.get("/api/workspaces").text
    live.wait_for(
        lambda: {a["id"] for a in live.get("/api/workspaces/edge/agents").json()} == {pre.id},
        what="edge lists the agent of its caliband",
    )

    # The provider options leave the endpoint as it is.
    res = cli("workspace", "config", "edge", "--env", "X=1")
    assert res.exit_code == 0, res.output
    assert caliband_of(live, "edge") == want

    rows = json.loads(cli("workspace", "list", "-o", "json").stdout)
    assert next(r for r in rows if r["name"] == "edge")["config"]["caliband"] == want
    assert cli("workspace", "rm", "edge").exit_code == 0


def test_workspace_add_refuses_a_bad_endpoint(cli: Cli, live: LiveStack) -> None:
    root = git_repo(live.tmp / "repos" / "badnet")
    res = cli("workspace", "add", "badnet", str(root), "--caliband-addr", "nohost")
    assert res.exit_code != 0
    assert "expected HOST:PORT" in res.stderr
    res = cli("workspace", "add", "badnet", str(root), "--ca-file", "/etc/hostname")
    assert res.exit_code == 2 and "--caliband-addr" in res.output
    assert "badnet" not in {r["name"] for r in live.get("/api/workspaces").json()}
