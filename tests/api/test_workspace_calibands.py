"""Per-workspace caliband endpoints (issue 14, Deliver 1): one prosperod, two networked fake
calibands on two ports (TLS + a token each) plus a local one over its Unix socket; each
workspace lists only the agents whose working directory lies in its root, and a spawn lands on
the workspace's own caliband."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from prospero.core.fleet.local import CalibandNetworkConfig
from prospero.core.sources import canonical_root
from prospero.core.transport import NetworkSecurity
from prospero.testkit.certs import make_certs
from prospero.testkit.fake_caliband import FakeCaliband
from tests.api.conftest import Stack, StackFactory, script_for
from tests.support import wait_until

T = 20.0


@contextlib.asynccontextmanager
async def networked(
    tmp: Path, name: str, *, subdirs: tuple[str, ...] = ()
) -> AsyncIterator[tuple[FakeCaliband, dict[str, Any]]]:
    """A TLS + token fake caliband rooted at tmp/name, and the `caliband` config naming it."""
    root = tmp / name
    root.mkdir()
    for d in subdirs:
        (root / d).mkdir()
    certs = make_certs()
    token = f"tok-{name}-secret"
    (tmp / f"{name}.ca").write_bytes(certs.ca_pem)
    (tmp / f"{name}.token").write_text(token + "\n")
    fake = await FakeCaliband.start_tcp(
        "127.0.0.1",
        0,
        certs.cert_pem,
        certs.key_pem,
        token,
        root=canonical_root(str(root)),
        script_for=script_for,
    )
    cfg = {
        "addr": fake.endpoint.addr,  # type: ignore[union-attr]
        "ca_file": str(tmp / f"{name}.ca"),
        "token_file": str(tmp / f"{name}.token"),
        "server_name": "caliband",
    }
    try:
        yield fake, cfg
    finally:
        await fake.stop()


async def add(stack: Stack, name: str, root: Path, caliband: dict[str, Any] | None) -> Any:
    config = {"caliband": caliband} if caliband is not None else {}
    return await stack.client.post(
        "/api/workspaces", json={"name": name, "root": str(root), "config": config}
    )


async def agent_ids(stack: Stack, ws: str) -> set[str]:
    r = await stack.client.get(f"/api/workspaces/{ws}/agents")
    assert r.status_code == 200, r.text
    return {a["id"] for a in r.json()}


async def wait_agents(stack: Stack, ws: str, want: set[str]) -> None:
    async def ok() -> bool:
        return await agent_ids(stack, ws) == want

    await wait_until(ok, T, interval=0.05, what=f"{ws} lists {sorted(want)}")


async def test_workspaces_on_two_networked_calibands_and_a_local_one(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(workspace=False)
    tmp = stack.tmp
    async with (
        networked(tmp, "hosta") as (fake_a, cfg_a),
        networked(tmp, "hostb", subdirs=("left", "right", "leftover")) as (fake_b, cfg_b),
    ):
        root_b = tmp / "hostb"
        await stack.add_workspace("loc")  # the daemon-wide default: Unix discovery
        for name, root, cfg in (
            ("edge", tmp / "hosta", cfg_a),
            ("far", root_b, cfg_b),
            ("left", root_b / "left", {**cfg_b, "source": "left"}),
            ("right", root_b / "right", cfg_b),
        ):
            r = await add(stack, name, root, cfg)
            assert r.status_code == 201, r.text

        # Agents someone else started on caliband B, in its sources (and one whose path only
        # starts like `left`'s root: not `left`'s, but `far`'s).
        canon_b = canonical_root(str(root_b))
        pre_left = await fake_b.add_agent(working_dir=f"{canon_b}/left", serve=False)
        pre_right = await fake_b.add_agent(working_dir=f"{canon_b}/right/.caliban/wt", serve=False)
        pre_over = await fake_b.add_agent(working_dir=f"{canon_b}/leftover", serve=False)

        spawned = {ws: await stack.spawn("hello", ws=ws) for ws in ("loc", "edge", "far", "left")}
        assert spawned["loc"] in stack.fakes["loc"].agents
        assert spawned["edge"] in fake_a.agents and spawned["edge"] not in fake_b.agents
        assert spawned["far"] in fake_b.agents and spawned["far"] not in fake_a.agents
        # `left` names its source: its spawn runs there, in its root.
        assert fake_b.agents[spawned["left"]].working_dir == f"{canon_b}/left"
        assert fake_b.agents[spawned["far"]].working_dir == canon_b
        # Each spawned agent's driver dialled its worker with its workspace's TLS + token.
        for agent_id in spawned.values():
            await stack.wait_finished(agent_id, T)

        await wait_agents(stack, "loc", {spawned["loc"]})
        await wait_agents(stack, "edge", {spawned["edge"]})
        await wait_agents(stack, "far", {spawned["far"], pre_over.id})
        await wait_agents(stack, "left", {pre_left.id, spawned["left"]})
        await wait_agents(stack, "right", {pre_right.id})

        r = await stack.client.get("/api/fleet")
        assert r.status_code == 200, r.text
        placed = {a["id"]: w["name"] for w in r.json()["workspaces"] for a in w["agents"]}
        assert placed == {
            spawned["loc"]: "loc",
            spawned["edge"]: "edge",
            spawned["far"]: "far",
            pre_over.id: "far",
            pre_left.id: "left",
            spawned["left"]: "left",
            pre_right.id: "right",
        }

        # The summary names the files, never the token.
        r = await stack.client.get("/api/workspaces")
        assert "tok-hosta-secret" not in r.text and "tok-hostb-secret" not in r.text
        edge = next(w for w in r.json() if w["name"] == "edge")
        assert edge["config"]["caliband"] == cfg_a
        assert edge["health"]["state"] == "healthy"

        # The config update takes the endpoint too: `right` moved to caliband A (where no
        # agent lies in its root).
        r = await stack.client.put("/api/workspaces/right/config", json={"caliband": cfg_a})
        assert r.status_code == 204, r.text
        await wait_agents(stack, "right", set())
        assert await agent_ids(stack, "left") == {pre_left.id, spawned["left"]}


async def test_the_daemon_wide_caliband_stays_the_default(
    make_stack: StackFactory, tmp_path: Path
) -> None:
    async with (
        networked(tmp_path, "hosta") as (fake_a, cfg_a),
        networked(tmp_path, "hostb") as (fake_b, cfg_b),
    ):
        default = CalibandNetworkConfig(
            endpoint=fake_b.endpoint,  # type: ignore[arg-type]
            security=NetworkSecurity.from_files(cfg_b["ca_file"], cfg_b["token_file"]),
        )
        stack = await make_stack(workspace=False, caliband_network=default)
        assert (await add(stack, "dflt", tmp_path / "hostb", None)).status_code == 201
        assert (await add(stack, "edge", tmp_path / "hosta", cfg_a)).status_code == 201
        on_b = await stack.spawn("hello", ws="dflt")
        on_a = await stack.spawn("hello", ws="edge")
        assert on_b in fake_b.agents and on_b not in fake_a.agents
        assert on_a in fake_a.agents and on_a not in fake_b.agents
        for agent_id in (on_a, on_b):
            await stack.wait_finished(agent_id, T)
        await wait_agents(stack, "dflt", {on_b})
        await wait_agents(stack, "edge", {on_a})


@pytest.mark.parametrize(
    ("caliband", "message"),
    [
        ({"addr": "nohost"}, "expected HOST:PORT"),
        ({"addr": "127.0.0.1:99999"}, "expected HOST:PORT"),
        ({"addr": "a b:1"}, "expected HOST:PORT"),
        ({"addr": "127.0.0.1:1", "ca_file": "relative.pem"}, "must be an absolute path"),
        ({"addr": "127.0.0.1:1", "ca_file": "/nonexistent/ca.pem"}, "is not readable"),
        ({"addr": "127.0.0.1:1", "token_file": "/etc/hostname"}, "needs ca_file"),
        ({"addr": "127.0.0.1:1", "ca_file": "CA", "token_file": "/nonexistent/t"}, "not readable"),
        ({"addr": "127.0.0.1:1", "ca_file": "NOTCA"}, "no certificate"),
    ],
)
async def test_a_bad_endpoint_is_refused_and_nothing_is_stored(
    make_stack: StackFactory, caliband: dict[str, Any], message: str
) -> None:
    stack = await make_stack(workspace=False)
    root = stack.tmp / "ws"
    root.mkdir()
    ca = stack.tmp / "ca.pem"
    ca.write_bytes(make_certs().ca_pem)
    notca = stack.tmp / "notca.pem"
    notca.write_text("hello\n")
    subst = {"CA": str(ca), "NOTCA": str(notca)}
    caliband = {k: subst.get(v, v) for k, v in caliband.items()}
    r = await add(stack, "ws", root, caliband)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"], r.text
    assert (await stack.client.get("/api/workspaces")).json() == []

    # Registered without one, a bad endpoint in the config update leaves the config as it was.
    r = await add(stack, "ws", root, None)
    assert r.status_code == 201, r.text
    r = await stack.client.put("/api/workspaces/ws/config", json={"caliband": caliband})
    assert r.status_code == 400, r.text
    [ws] = (await stack.client.get("/api/workspaces")).json()
    assert "caliband" not in ws["config"]


async def test_the_openapi_document_describes_the_endpoint(make_stack: StackFactory) -> None:
    stack = await make_stack(workspace=False)
    doc = (await stack.client.get("/openapi.json")).json()
    schema = doc["components"]["schemas"]["CalibandEndpointConfig"]
    assert set(schema["properties"]) == {"addr", "ca_file", "token_file", "server_name", "source"}
    assert schema["required"] == ["addr"]
