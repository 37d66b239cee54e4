"""Two prosperod replicas with `--fleet-backend k8s` on one PostgreSQL database, one fake
Kubernetes API server + fake operator + caliband pods (issue 13: the observer).

Upstream, in a cluster one replica (the holder of `__fleet_observer`) persists the status
changes. Here that role is the workspace's lifecycle lease (`repo:<ws>`, ADR 0012 §5), whatever
the backend: both replicas watch the CalibanTasks, the holder alone records what the polls
derive (discovered, status changed, gone), each agent's stream has one writer (the holder of
the agent's lease), and when the observer stops the other replica takes the lease over and
records what changed meanwhile, once."""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from prospero.core.wire.control import SpawnSpec
from prospero.core.wire.k8s import API_VERSION, TASK_KIND, TASK_PLURAL, task_name
from prospero.testkit import acp_scripts as S
from prospero.testkit import scripts
from tests.api.conftest import Stack, StackFactory
from tests.api.test_cluster_takeover import crash, holder
from tests.api.test_decisions_api import pending
from tests.api.test_k8s_backend import NS, Cluster, k8s_stack, register
from tests.core.test_decisions import ask_turn
from tests.kubectl import Kubectl
from tests.support import wait_until

TTL = 1.0
BEAT = 0.25
T = 20.0


def pod_script(spec: SpawnSpec) -> scripts.Script:
    if spec.interactive:  # a first reply, then waits for its end of input
        return scripts.interactive_script()
    if spec.initial_prompt.startswith("long"):
        return [scripts.turn_start(0), scripts.sleep(3600), scripts.run_end()]
    return scripts.text_script(3)


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with Cluster.running(tmp_path / "cluster", script_for=pod_script) as c:
        yield c


async def replica(make_stack: StackFactory, kube: Cluster, pg_dsn: str, rid: str) -> Stack:
    return await k8s_stack(
        make_stack,
        kube,
        database_url=pg_dsn,
        replica_id=rid,
        lease_ttl=TTL,
        heartbeat_interval=BEAT,
    )


async def apply_foreign(kube: Cluster, prompt: str) -> str:
    """A CalibanTask another client created (a POST to the API server, as `kubectl create`
    does): Prospero discovers it."""
    name = task_name("app", prompt, None)
    body = {
        "apiVersion": API_VERSION,
        "kind": TASK_KIND,
        "metadata": {"name": name, "namespace": NS},
        "spec": {"workspaceRef": {"name": "app"}, "task": {"prompt": prompt}},
    }
    url = f"{kube.kube.url}/apis/{API_VERSION}/namespaces/{NS}/{TASK_PLURAL}"
    async with httpx.AsyncClient() as client:
        r = await client.post(url, json=body)
    assert r.status_code == 201, r.text
    return name


def lifecycle_once(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The stream's checks: one writer (seqs 1..n, no event twice), each lifecycle event at
    most once, the status changes one chain (each starts where the one before ended).
    Returns the changes."""
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    kinds = [e["kind"]["kind"] for e in events]
    for once in ("agent_spawned", "agent_discovered", "agent_finished", "agent_gone"):
        assert kinds.count(once) <= 1, (once, kinds)
    changes = [
        (e["kind"]["from"], e["kind"]["to"])
        for e in events
        if e["kind"]["kind"] == "status_changed"
    ]
    for (_, to), (frm, _) in itertools.pairwise(changes):
        assert to == frm, changes
    assert all(frm != to for frm, to in changes), changes
    return changes


async def cluster_view(stack: Stack) -> dict[str, Any]:
    r = await stack.client.get("/api/cluster")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def lease_owners(stack: Stack, key: str) -> list[str]:
    return [x["owner"] for x in (await cluster_view(stack))["leases"] if x["key"] == key]


async def history(stack: Stack, agent: str) -> list[dict[str, Any]]:
    """The agent's stored events, as this replica serves them (none before it knows the
    agent: 404)."""
    r = await stack.client.get(f"/api/agents/{agent}/events")
    if r.status_code == 404:
        return []
    assert r.status_code == 200, r.text
    return list(r.json())


async def test_two_k8s_replicas_elect_one_observer_and_hand_it_over(
    kube: Cluster, make_stack: StackFactory, pg_dsn: str
) -> None:
    # `kube` first: torn down after the stacks (no watch of theirs outlives the API server)
    a = await replica(make_stack, kube, pg_dsn, "a")
    b = await replica(make_stack, kube, pg_dsn, "b")
    await register(a, "app")

    async def both_know_app() -> bool:
        for s in (a, b):
            if (await s.client.get("/api/workspaces/app/agents")).status_code != 200:
                return False
        return True

    await wait_until(both_know_app, T, interval=0.05, what="both replicas read the registry")

    # an agent spawned through b (it waits for its end of input after a first reply), and a
    # CalibanTask another client created, which runs to its end on its own
    waiting = await b.spawn(ws="app", prompt="wait for me", interactive=True)
    foreign = await apply_foreign(kube, "from another client")

    async def settled() -> bool:
        for s in (a, b):
            text = "".join(e["kind"].get("chunk", "") for e in await history(s, waiting))
            if "What next?" not in text:
                return False
        kinds = [e["kind"]["kind"] for e in await history(a, foreign)]
        # (announced `DISCOVER_GRACE` after the observer first listed it)
        return "agent_finished" in kinds and "status_changed" in kinds and (
            "agent_discovered" in kinds
        )

    await wait_until(settled, T, interval=0.05, what="both agents' runs recorded")
    await a.wait_status(foreign, "done", within=T)
    await b.wait_status(waiting, "idle", within=T)  # its pod's caliband: waiting for input

    # exactly one observer: the workspace's lease has one holder, the same seen from both
    observer = await holder(a, "repo:app")
    assert observer in ("a", "b")
    for s in (a, b):
        assert await lease_owners(s, "repo:app") == [observer]
    # each agent's stream has one writer: its lease has one holder, shown as its owner
    for agent in (waiting, foreign):
        [owner] = await lease_owners(a, agent)
        assert await lease_owners(b, agent) == [owner]
        for s in (a, b):
            r = await s.client.get(f"/api/agents/{agent}")
            assert r.status_code == 200 and r.json()["owner"] == owner, r.text

    # each lifecycle event stored once, across both replicas (one database: both serve it)
    for agent in (waiting, foreign):
        events = await history(a, agent)
        assert events == await history(b, agent)
        lifecycle_once(events)
    kinds = [e["kind"]["kind"] for e in await history(a, foreign)]
    assert kinds.count("agent_discovered") == 1 and "agent_spawned" not in kinds, kinds
    assert lifecycle_once(await history(a, foreign))[-1][1] == "done"
    kinds = [e["kind"]["kind"] for e in await history(a, waiting)]
    assert kinds.count("agent_spawned") == 1 and "agent_discovered" not in kinds, kinds
    assert lifecycle_once(await history(a, waiting))[-1][1] == "idle"

    # the observer stops without handing over; the operator finishes the waiting agent before
    # the lease expires, while nobody observes: the next observer records that change, once
    dead, survivor = (a, b) if observer == "a" else (b, a)
    me = survivor.runtime.cluster.replica_id
    await crash(dead)
    assert kube.kube.operator is not None
    assert kube.kube.operator.finish(NS, waiting, "Completed") is not None

    async def taken_over() -> bool:
        return await holder(survivor, "repo:app") == me

    await wait_until(taken_over, 5 * TTL + 5.0, interval=0.05, what="the observer lease taken")
    await survivor.wait_status(waiting, "done", within=T)

    # and it goes on observing: a new CalibanTask, which the operator then fails
    late = await apply_foreign(kube, "long after the takeover")
    await survivor.wait_status(late, "running", within=T)
    assert kube.kube.operator.finish(NS, late, "Failed") is not None
    await survivor.wait_status(late, "failed", within=T)
    await survivor.wait_finished(late, within=T)

    async def changed_to_done() -> bool:
        changes = lifecycle_once(await history(survivor, waiting))
        return bool(changes) and changes[-1][1] == "done"

    await wait_until(changed_to_done, T, interval=0.05, what="→ done recorded")
    changes = lifecycle_once(await history(survivor, waiting))
    assert [to for _, to in changes].count("done") == 1, changes
    # its run ends too, once, whichever replica drove it (the dead one's lease on the agent
    # outlives the status change: the survivor's run is refused until it expires)
    await survivor.wait_finished(waiting, within=T)
    kinds = [e["kind"]["kind"] for e in await history(survivor, waiting)]
    assert kinds.count("agent_finished") == 1, kinds
    late_events = await history(survivor, late)
    late_changes = lifecycle_once(late_events)
    assert late_changes[-1] == ("running", "failed"), late_changes
    assert [e["kind"]["kind"] for e in late_events].count("agent_discovered") == 1
    assert lifecycle_once(await history(survivor, foreign))[-1][1] == "done"
    assert await lease_owners(survivor, "repo:app") == [me]
    for agent in (waiting, foreign, late):  # none written by the dead replica any more
        assert await lease_owners(survivor, agent) in ([], [me])


# --- issue 13's "done when": an ACP CalibanTask, seen by kubectl, followed by the CLI ----------

PROSPERO = Path(sys.executable).parent / "prospero"  # the console script, a real process


def acp_pod_script(spec: SpawnSpec) -> S.AcpScript:
    return S.AcpScript(turns=[ask_turn()])  # asks to edit a file, then answers


@pytest.fixture
async def acp_kube(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with Cluster.running(tmp_path / "cluster", acp_script_for=acp_pod_script) as c:
        yield c


async def run_cli(*argv: str, timeout: float = 60) -> tuple[int, str, str]:
    """A real process (never blocking this loop, which serves prosperod): exit code, out, err."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROSPERO_")}
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**env, "NO_COLOR": "1"},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_an_acp_task_kubectl_shows_is_approved_and_followed_by_the_cli(
    acp_kube: Cluster, make_stack: StackFactory, tmp_path: Path
) -> None:
    """Against the fake API server: `kubectl get calibantasks -o json` shows the CR Prospero
    applied with `driveProtocol: acp` (and the posture), its pod serves the ACP agent, the
    permission it asks is a pending decision that `prospero approve` answers, and
    `prospero follow` (real processes against the real HTTP server) prints the ACP turn
    through to its end."""
    kube = acp_kube  # first: torn down after the stack
    stack = await k8s_stack(make_stack, kube, allow_acp=True)
    await register(stack, "app")
    body = {"prompt": "edit", "drive_protocol": "acp", "posture": "supervised"}
    r = await stack.client.post("/api/workspaces/app/agents", json=body)
    assert r.status_code == 201, r.text
    agent = str(r.json()["agent_id"])

    home = tmp_path / "kubectl"
    kubectl = Kubectl(home, kube.kube.write_kubeconfig(home, NS))
    (item,) = orjson.loads(await kubectl.ok("get", "calibantasks", "-o", "json"))["items"]
    assert item["metadata"]["name"] == agent
    assert item["spec"]["task"]["driveProtocol"] == "acp"
    assert item["spec"]["task"]["permissionPosture"] == "supervised"

    follow = asyncio.create_task(run_cli(str(PROSPERO), "--addr", stack.url, "follow", agent))
    [decision] = await pending(stack, agent)
    [pod] = kube.pods.values()
    assert list(pod.acp_listeners) != []  # the pod's caliband serves an ACP agent
    code, out, err = await run_cli(str(PROSPERO), "--addr", stack.url, "decisions")
    assert code == 0, err
    assert decision["id"] in out and agent in out and "Edit src/app.py (edit)" in out
    code, out, err = await run_cli(str(PROSPERO), "--addr", stack.url, "approve", decision["id"])
    assert code == 0, err
    assert out.strip().startswith(f"approved {decision['id']} (Allow once: Edit src/app.py)")

    code, out, err = await asyncio.wait_for(follow, T * 2)
    assert code == 0, err
    assert out.startswith(f"— following {agent}")
    assert f"⏸ permission asked: Edit src/app.py (edit)  decision {decision['id']}" in out
    assert "✔ permission Edit src/app.py (edit): allowed (Allow once)" in out
    assert "Looking." in out and "call_edit done." in out
    assert out.rstrip().splitlines()[-1].startswith("[finished] EndOfTurn"), out
    history = await stack.history(agent)
    kinds = [e["kind"]["kind"] for e in history]
    assert kinds.count("agent_finished") == 1 and "decision_resolved" in kinds, kinds
