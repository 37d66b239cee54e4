"""prosperod with `--fleet-backend k8s` (issue 13, deliverable 2), end to end in one process: the
config flags build the Runtime's K8sFleet, which talks to the fake Kubernetes API server; its
fake operator starts a caliband "pod" (TLS + bearer token) per CalibanTask. Through the HTTP
API: register a workspace, spawn (the CR carries the posture), list, follow the NDJSON stream
to `agent_finished`, kill and remove (each deletes the CR)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prospero.core.wire.control import SpawnSpec, TcpEndpoint
from prospero.core.wire.k8s import task_name
from prospero.daemon.config import load_config
from prospero.testkit import scripts
from prospero.testkit.certs import make_certs
from prospero.testkit.fake_caliband import FakeCaliband
from prospero.testkit.fake_kube import FakeKube
from prospero.testkit.fake_kube.operator import TASKS
from tests.api.conftest import SseReader, Stack, StackFactory, sse_headers
from tests.support import wait_until

NS = "agents"
TOKEN = "pod-token-k8s-backend"


def pod_script(spec: SpawnSpec) -> scripts.Script:
    if spec.initial_prompt.startswith("long"):
        return [scripts.turn_start(0), scripts.sleep(3600), scripts.run_end()]
    return scripts.text_script(3)


class Cluster:
    def __init__(self, tmp: Path, **pod_options: Any) -> None:
        """`pod_options`: more FakeCaliband options for every pod (`script_for` replaces
        `pod_script`; `acp_script_for` scripts its ACP agents)."""
        self.tmp = tmp
        self.certs = make_certs()
        self.pods: dict[str, FakeCaliband] = {}  # per CR incarnation (name/uid)
        self.pod_options: dict[str, Any] = {"script_for": pod_script, **pod_options}
        self.kube = FakeKube(operator=True, endpoint=self.start_pod)

    async def start_pod(self, task: dict[str, Any]) -> str:
        key = f"{task['metadata']['name']}/{task['metadata'].get('uid', '')}"
        pod = self.pods.get(key)
        if pod is None:
            pod = self.pods[key] = await FakeCaliband.start_tcp(
                "127.0.0.1",
                0,
                self.certs.cert_pem,
                self.certs.key_pem,
                TOKEN,
                **self.pod_options,
            )
        assert isinstance(pod.endpoint, TcpEndpoint)
        return pod.endpoint.addr

    async def start(self) -> None:
        """The API server, with the agents' namespace created (as `kubectl create namespace`
        would: writes into a namespace that does not exist are refused)."""
        await self.kube.start()
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
        async with httpx.AsyncClient(base_url=self.kube.url) as client:
            r = await client.post("/api/v1/namespaces", json=ns)
        assert r.status_code == 201, r.text

    async def stop(self) -> None:
        await self.kube.stop()
        for pod in self.pods.values():
            with contextlib.suppress(Exception):
                await pod.stop()

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls, tmp: Path, **pod_options: Any) -> AsyncIterator[Cluster]:
        """A started cluster in `tmp` (created), stopped with its pods on the way out."""
        c = cls(tmp, **pod_options)
        c.tmp.mkdir()
        await c.start()
        try:
            yield c
        finally:
            await c.stop()

    def task(self, name: str) -> dict[str, Any] | None:
        return self.kube.store.get(TASKS, NS, name)

    def flags(self) -> list[str]:
        files = self.certs.write(self.tmp / "tls")
        token = self.tmp / "pod-token"
        token.write_text(TOKEN + "\n")
        return [
            "--fleet-backend",
            "k8s",
            "--kubeconfig",
            str(self.kube.write_kubeconfig(self.tmp / "kube")),
            "--k8s-namespace",
            NS,
            "--caliband-ca-file",
            str(files.ca),
            "--caliband-token-file",
            str(token),
        ]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with Cluster.running(tmp_path / "cluster") as c:
        yield c


async def k8s_stack(make_stack: StackFactory, cluster: Cluster, **config: Any) -> Stack:
    """The API stack with the fleet settings `prosperod <flags>` parses (flags > env > file)."""
    cfg = load_config(cluster.flags(), {})
    assert cfg.fleet_backend == "k8s" and cfg.caliband_network is None
    return await make_stack(workspace=False, fleet_backend=cfg.fleet_backend, k8s=cfg.k8s, **config)


# A workspace's config under the k8s backend: its Workspace CR's sources and providers (a
# provider's key is a Secret in the cluster, named and never read by prosperod).
K8S_CONFIG: dict[str, Any] = {
    "sources": [{"name": "app", "repo": "https://git.example/app.git", "path": "/src/app"}],
    "providers": [
        {
            "name": "claude",
            "kind": "anthropic",
            "credentials_ref": {"secret_name": "anthropic", "key": "api-key"},
        }
    ],
}


async def register(stack: Stack, name: str, config: dict[str, Any] | None = None) -> None:
    """A workspace under the k8s backend is a Workspace CR (`spec.workspaceRef.name` of its
    CalibanTasks): applied by `POST /api/workspaces` (202: the operator reconciles it), then in
    the registry of every replica (the registry is the namespace's Workspace CRs)."""
    body = {"name": name, "config": config or K8S_CONFIG}
    r = await stack.client.post("/api/workspaces", json=body)
    assert r.status_code == 202, r.text


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
async def test_prosperod_drives_a_k8s_fleet_through_the_api(
    cluster: Cluster, make_stack: StackFactory, store: str, request: pytest.FixtureRequest
) -> None:
    """Standalone on SQLite, or clustered on PostgreSQL (one replica): the same wiring."""
    # `cluster` first: torn down after the stack (no watch of K8sFleet's outlives the server)
    config: dict[str, Any] = {}
    if store == "postgres":
        config = {"database_url": request.getfixturevalue("pg_dsn"), "replica_id": "r1"}
    stack = await k8s_stack(make_stack, cluster, **config)
    assert stack.runtime.cluster.mode == ("clustered" if store == "postgres" else "standalone")
    from prospero.core.fleet.k8s import K8sFleet

    assert stack.runtime.manager is not None
    provider = stack.runtime.manager.provider
    assert isinstance(provider, K8sFleet) and provider.namespace == NS
    await register(stack, "app")
    # the provider's key is a Secret in the cluster, not in prosperod's environment: the pods
    # get it, so the spawn is not refused here (the local backend refuses a missing key)
    r = await stack.client.put("/api/workspaces/app/config", json=K8S_CONFIG)
    assert r.status_code == 202, r.text

    # spawn: the agent id is the CR name; the CR carries the protocol and the posture
    agent = await stack.spawn(ws="app", prompt="fix it", posture="supervised")
    assert agent == task_name("app", "fix it", None) and agent.startswith("ct-")
    cr = cluster.task(agent)
    assert cr is not None
    assert cr["spec"]["workspaceRef"] == {"name": "app"}
    assert cr["spec"]["task"]["driveProtocol"] == "ndjson"
    assert cr["spec"]["task"]["permissionPosture"] == "supervised"
    r = await stack.client.get("/api/workspaces/app/agents")
    assert r.status_code == 200 and agent in [a["id"] for a in r.json()], r.text
    r = await stack.client.get(f"/api/agents/{agent}")
    assert r.status_code == 200 and r.json()["posture"] == "supervised", r.text

    # the pod's stream, through the NDJSON driver over TLS + token, to the end of the run
    history = await stack.wait_finished(agent, within=10)
    kinds = [e["kind"]["kind"] for e in history]
    events = history[: kinds.index("agent_finished") + 1]  # the run (status_changed may follow)
    kinds = [e["kind"]["kind"] for e in events]
    assert kinds[0] == "agent_spawned" and kinds.count("agent_finished") == 1, kinds
    # the same spawn again finds its CR: not created, and no second `agent_spawned`
    body = {"prompt": "fix it", "isolation": "shared", "posture": "supervised"}
    r = await stack.client.post("/api/workspaces/app/agents", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["agent_id"] == agent and r.json()["created"] is False, r.json()
    r = await stack.client.get(f"/api/agents/{agent}")
    assert r.status_code == 200 and r.json()["posture"] == "supervised", r.text
    again = [e["kind"]["kind"] for e in await stack.history(agent)]
    assert again.count("agent_spawned") == 1, again
    text = "".join(e["kind"].get("chunk", "") for e in events if e["kind"]["kind"] == "output")
    assert "line" in text, kinds
    assert events[-1]["kind"]["outcome"] == "EndOfTurn", events[-1]
    await stack.wait_status(agent, "done", within=10)

    # the agent's SSE stream serves the same events and ends after agent_finished
    async with stack.client.stream(
        "GET", f"/api/agents/{agent}/stream", headers=sse_headers()
    ) as resp:
        assert resp.status_code == 200
        reader = SseReader(resp)
        streamed = []
        while (msg := await asyncio.wait_for(reader.next(), 10)) is not None:
            streamed.append(msg.json())
    assert [e["seq"] for e in streamed] == [e["seq"] for e in events]
    assert [e["kind"]["kind"] for e in streamed] == kinds

    # kill a running agent: its CR is deleted (the operator tears the pod down)
    long = await stack.spawn(ws="app", prompt="long task")
    await stack.wait_status(long, "running", within=10)
    r = await stack.client.post(f"/api/agents/{long}/kill")
    assert r.status_code in (200, 202, 204), r.text
    assert cluster.task(long) is None

    # its run ends `killed` (the manager concludes it: no terminal status will ever be listed
    # for a deleted CR), then, with its CR gone, the agent is gone
    async def gone() -> bool:
        return (await stack.client.get(f"/api/agents/{long}")).status_code == 404

    await wait_until(gone, 5, interval=0.05, what="the killed agent gone")
    history = await stack.history(long)
    kinds_killed = [e["kind"]["kind"] for e in history]
    assert kinds_killed.count("agent_finished") == 1 and kinds_killed[-1] == "agent_gone"
    [fin] = [e["kind"] for e in history if e["kind"]["kind"] == "agent_finished"]
    assert fin["outcome"] == "killed"
    seqs = [e["seq"] for e in history]
    assert seqs == list(range(1, len(seqs) + 1))

    # remove the finished one: its CR is deleted, the agent is gone from the listing
    r = await stack.client.delete(f"/api/agents/{agent}")
    assert r.status_code in (200, 204), r.text
    assert cluster.task(agent) is None

    async def unlisted() -> bool:
        r = await stack.client.get("/api/workspaces/app/agents")
        return agent not in [a["id"] for a in r.json()]

    await wait_until(unlisted, 5, interval=0.05, what="the removed agent unlisted")
    # nothing else is left in the namespace but the killed agent's absence
    assert cluster.kube.store.items(TASKS, NS) == []
