"""K8sFleet against the fake Kubernetes API server (prospero.testkit.fake_kube) and its fake
operator, whose "pods" are fake calibands on TCP + TLS + bearer token, one per CalibanTask:
the FleetProvider suite, plus the CR name, the phase mapping, skewed CRs, spawn idempotence and
error translation."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest
from lightkube import ApiError, ConfigError

from prospero.core.errors import (
    AgentNotFound,
    Conflict,
    FleetUnreachable,
    InvalidConfig,
    InvalidState,
    NotFound,
    ProtocolError,
)
from prospero.core.fleet.k8s import K8sFleet
from prospero.core.fleet.k8s_records import agent_spec_from_task, pod_spawn_spec
from prospero.core.fleet.k8s_tasks import translate_kube_error
from prospero.core.fleet.provider import FleetProvider
from prospero.core.fleet.records import AgentSpec
from prospero.core.transport import TcpAddress, close_writer, open_endpoint, read_line
from prospero.core.wire.control import SpawnSpec, TcpEndpoint
from prospero.core.wire.k8s import CalibanTask, Workspace, decode_items, phase_to_status, task_name
from prospero.testkit import scripts
from prospero.testkit.certs import make_certs
from prospero.testkit.fake_caliband import FakeCaliband
from prospero.testkit.fake_kube import FakeKube
from prospero.testkit.fake_kube.operator import TASKS
from prospero.types.model import AgentStatus, RegisteredWorkspace
from tests.conformance.fleet_provider import FleetExpectations, FleetProviderConformance
from tests.support import wait_until

NS = "default"
TOKEN = "pod-token-0123"
CERTS = make_certs()


def pod_script(spec: SpawnSpec) -> list[dict[str, Any] | str]:
    if spec.initial_prompt.startswith("long"):
        return [scripts.turn_start(0), scripts.sleep(3600), scripts.run_end()]
    return list(scripts.default_script())


@dataclass
class K8sHarness:
    kube: FakeKube
    provider: K8sFleet
    workspace: RegisteredWorkspace
    pods: dict[str, FakeCaliband]
    expect: FleetExpectations = field(
        default_factory=lambda: FleetExpectations(
            label_names_agent=False,
            kill_keeps_record=False,
            respawn_new_id=False,
            rm_refuses_active=False,
            identical_spawn_creates=False,
            keeps_posture=True,
            lists_address=False,
        )
    )

    def received_specs(self) -> list[AgentSpec]:
        """What reached the backend: the spec each CR in the API server stands for."""
        tasks, _ = decode_items(CalibanTask, self.kube.store.items(TASKS, NS))
        return [agent_spec_from_task(t) for t in tasks]

    async def make_unreachable(self) -> None:
        await self.kube.stop()

    async def end(self, agent_id: str) -> None:
        assert self.kube.operator is not None
        assert self.kube.operator.finish(NS, agent_id, "Completed") is not None

    def long_running_spec(self, **overrides: object) -> AgentSpec:
        return AgentSpec(**{"prompt": "long task", "worktree": False, **overrides})  # type: ignore[arg-type]


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[K8sHarness]:
    pods: dict[str, FakeCaliband] = {}  # the current pod of each CR name
    uids: dict[str, str] = {}
    every_pod: list[FakeCaliband] = []

    async def start_pod(task: dict[str, Any]) -> str:
        """The operator's hook: one caliband "pod" per CalibanTask incarnation, TLS + token."""
        name, uid = task["metadata"]["name"], task["metadata"].get("uid", "")
        pod = pods.get(name)
        if pod is None or uids.get(name) != uid:
            pod = pods[name] = await FakeCaliband.start_tcp(
                "127.0.0.1", 0, CERTS.cert_pem, CERTS.key_pem, TOKEN, script_for=pod_script
            )
            uids[name] = uid
            every_pod.append(pod)
        assert isinstance(pod.endpoint, TcpEndpoint)
        return pod.endpoint.addr

    files = CERTS.write(tmp_path / "tls")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    kube = FakeKube(operator=True, endpoint=start_pod)
    await kube.start()
    provider = K8sFleet(
        NS,
        kube.write_kubeconfig(tmp_path),
        caliband_ca_file=files.ca,
        caliband_token_file=token_file,
        poll_interval=0.02,
        restart_timeout=5,
    )
    try:
        yield K8sHarness(kube, provider, RegisteredWorkspace(name="app", root=""), pods)
    finally:
        await provider.close()
        for pod in every_pod:
            with contextlib.suppress(Exception):
                await pod.stop()
        await kube.stop()


class TestK8sFleet(FleetProviderConformance):
    pass


def test_k8sfleet_is_a_fleet_provider(harness: K8sHarness) -> None:
    assert isinstance(harness.provider, FleetProvider)


# --- pure functions ---------------------------------------------------------------------------


def test_task_name_hashes_workspace_prompt_and_label() -> None:
    # sha256(b"app\x00fix it\x00") — fixed so a change of the hash input is noticed
    assert task_name("app", "fix it", None) == "ct-5c081db296e1e818"
    assert task_name("app", "fix it", None) == task_name("app", "fix it", "")
    assert task_name("app", "fix it", "x") != task_name("app", "fix it", None)
    assert task_name("app", "fix it", None) != task_name("ap", "pfix it", None)
    name = task_name("w", "p", "l")
    assert len(name) == 19 and name.startswith("ct-") and int(name[3:], 16) >= 0


@pytest.mark.parametrize(
    ("phase", "status"),
    [
        ("", AgentStatus.spawning),
        ("Pending", AgentStatus.spawning),
        ("Provisioning", AgentStatus.spawning),
        ("Running", AgentStatus.running),
        ("Draining", AgentStatus.idle),
        ("Completed", AgentStatus.done),
        ("Failed", AgentStatus.failed),
        ("Succeeded", AgentStatus.failed),
        ("TimedOut", AgentStatus.failed),
    ],
)
def test_phase_to_status(phase: str, status: AgentStatus) -> None:
    assert phase_to_status(phase) == status


def test_a_cr_round_trips_camel_case_and_tolerates_unknown_keys() -> None:
    raw = {
        "apiVersion": "caliban.caliban-ai.dev/v1alpha1",
        "kind": "CalibanTask",
        "metadata": {
            "name": "ct-1",
            "namespace": "default",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "workspaceRef": {"name": "app"},
            "providerRef": "main",
            "task": {
                "prompt": "p",
                "interactive": True,
                "driveProtocol": "acp",
                "permissionPosture": "supervised",
            },
            "tools": ["Edit"],
            "isolation": {"runtimeClass": "gvisor", "worktrees": "per-source"},
            "future": {"x": 1},
        },
        "status": {
            "phase": "Running",
            "calibandEndpoint": "10.0.0.5:7070",
            "sandboxRef": {"name": "sb"},
            "conditions": [{"type": "Ready", "status": "True"}],
            "permissionPosture": "autonomous",
            "resolvedWorkspace": {
                "sources": [{"name": "s", "repo": "r", "path": "."}],
                "provider": {"name": "main", "kind": "anthropic", "model": "m1"},
            },
        },
    }
    task = CalibanTask.model_validate(raw)
    assert task.spec.task.drive_protocol == "acp" and task.drive_protocol == "acp"
    assert task.spec.task.permission_posture == "supervised"
    assert task.permission_posture == "autonomous"  # the operator-admitted one wins
    assert task.status is not None and task.status.resolved_workspace is not None
    assert task.status.resolved_workspace.sources[0].ref == "main"
    spec = pod_spawn_spec(task)  # what the pod's caliband is asked to run
    assert (spec.label, spec.provider, spec.model, spec.tool_allowlist) == (
        "ct-1",
        "anthropic",
        "m1",
        ["Edit"],
    )
    assert spec.interactive and spec.drive_protocol == "acp" and not spec.isolation_worktree
    listed = agent_spec_from_task(task)  # what the seam lists the agent as spawned with
    assert (listed.label, listed.provider, listed.model, listed.tool_allowlist) == (
        "ct-1",
        "anthropic",
        "m1",
        ("Edit",),
    )
    assert listed.interactive and listed.drive_protocol == "acp" and not listed.worktree
    assert listed.posture == "supervised"  # as requested (the manager reads its AgentMeta)
    body = task.apply_body()
    assert "status" not in body and body["metadata"] == {"name": "ct-1", "namespace": "default"}
    assert body["spec"]["workspaceRef"] == {"name": "app"}
    assert body["spec"]["task"]["driveProtocol"] == "acp"
    absent = CalibanTask.model_validate(
        {**raw, "spec": {"workspaceRef": {"name": "a"}, "task": {"prompt": "p"}}}
    )
    assert absent.drive_protocol == "ndjson"  # absent ⇒ ndjson


# --- against the fake API server --------------------------------------------------------------


def cr(h: K8sHarness, name: str) -> dict[str, Any]:
    obj = h.kube.store.get(TASKS, NS, name)
    assert obj is not None
    return obj


async def test_spawn_applies_the_cr_and_is_idempotent(harness: K8sHarness) -> None:
    h = harness
    spec = h.long_running_spec(
        label="a", tool_allowlist=("Edit",), drive_protocol="acp", posture="supervised"
    )
    first = await h.provider.spawn(h.workspace, spec)
    assert first.id == task_name("app", "long task", "a") and first.created
    obj = cr(h, first.id)
    assert obj["spec"] == {
        "workspaceRef": {"name": "app"},
        "task": {"prompt": "long task", "driveProtocol": "acp", "permissionPosture": "supervised"},
        "tools": ["Edit"],
    }  # interactive omitted when false, providerRef/isolation/agentType never written
    managers = {(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]}
    assert ("prospero", "Apply") in managers
    again = await h.provider.spawn(h.workspace, spec)
    assert again.id == first.id and not again.created
    assert len(h.kube.store.items(TASKS, NS)) == 1
    rec = {r.id: r for r in await h.provider.list_agents(h.workspace)}[first.id]
    assert rec.spec.drive_protocol == "acp"  # read back from the CR
    task = await h.provider.get_task(h.workspace, first.id)
    assert task.spec.task.permission_posture == "supervised"


async def test_interactive_written_only_when_true(harness: K8sHarness) -> None:
    h = harness
    reply = await h.provider.spawn(h.workspace, h.long_running_spec(interactive=True))
    assert cr(h, reply.id)["spec"]["task"] == {
        "prompt": "long task",
        "interactive": True,
        "driveProtocol": "ndjson",
    }


async def test_a_skewed_cr_is_skipped_and_counted(harness: K8sHarness) -> None:
    h = harness
    good = await h.provider.spawn(h.workspace, h.long_running_spec())
    # A CR written under another version of the CRD: `task` is not an object here.
    h.kube.store.put(
        TASKS,
        {
            "apiVersion": "caliban.caliban-ai.dev/v1alpha1",
            "kind": "CalibanTask",
            "metadata": {"name": "ct-skewed", "namespace": NS, "uid": "u-1"},
            "spec": {"workspaceRef": {"name": "app"}, "task": "do it"},
        },
        "ADDED",
    )
    assert [r.id for r in await h.provider.list_agents(h.workspace)] == [good.id]
    assert [r.id for r in await h.provider.list_agents(h.workspace)] == [good.id]
    assert (h.provider.skipped_crs, h.provider.skipped_total) == (1, 2)
    with pytest.raises(ProtocolError, match="does not match"):  # typed, not a crash
        await h.provider.kill(h.workspace, "ct-skewed")


async def test_only_the_workspace_s_crs_are_listed(harness: K8sHarness) -> None:
    h = harness
    mine = await h.provider.spawn(h.workspace, h.long_running_spec())
    other_ws = RegisteredWorkspace(name="other", root="")
    theirs = await h.provider.spawn(other_ws, h.long_running_spec())
    assert mine.id != theirs.id
    assert [r.id for r in await h.provider.list_agents(h.workspace)] == [mine.id]
    with pytest.raises(AgentNotFound):
        await h.provider.kill(h.workspace, theirs.id)


async def test_attach_spawns_the_pod_agent_once_and_overlays_its_status(
    harness: K8sHarness,
) -> None:
    h = harness
    reply = await h.provider.spawn(h.workspace, h.long_running_spec(tool_allowlist=("Read",)))
    attaches = 1
    try:
        await h.provider.attach(h.workspace, reply.id)
    except InvalidState:  # may still be provisioning: refused, typed (the pod not asked)
        attaches = 0

    async def running() -> bool:
        recs = await h.provider.list_agents(h.workspace)
        return bool(recs) and recs[0].status == AgentStatus.running

    await wait_until(running, 10, what="CR Running")
    first = await h.provider.attach(h.workspace, reply.id)
    again = await h.provider.attach(h.workspace, reply.id)
    assert first == again and isinstance(first, TcpAddress)
    # the session plane: the per-agent stream, dialled with the provider's TLS + token
    reader, writer = await open_endpoint(first, h.provider.security(h.workspace))
    try:
        line = await asyncio.wait_for(read_line(reader), 5)
    finally:
        await close_writer(writer)
    assert line is not None and orjson.loads(line)["type"] == "TurnStart"
    pod = h.pods[reply.id]
    assert [(s.label, s.initial_prompt, s.tool_allowlist) for s in pod.received_specs] == [
        (reply.id, "long task", ["Read"])
    ]
    (pod_id,) = pod.agents
    # the attach that spawned the pod's agent answered the endpoint of the `spawned` reply:
    # the worker runs from then on and a remote agent's lines are only in its replay until it
    # exits, so no round trip comes before the driver's dial; the next ones look it up
    assert pod.received_attach_ids == [pod_id] * (attaches + 1)
    pod.set_status(pod_id, "idle")  # the pod's truth wins over the CR's perpetual Running
    (rec,) = await h.provider.list_agents(h.workspace)
    assert rec.status == AgentStatus.idle
    pod.set_status(pod_id, "done")
    (rec,) = await h.provider.list_agents(h.workspace)
    assert rec.status == AgentStatus.done
    with pytest.raises(InvalidState, match="ended"):
        await h.provider.attach(h.workspace, reply.id)
    await pod.stop()  # settled for this CR: its perpetual Running does not un-settle it
    (rec,) = await h.provider.list_agents(h.workspace)
    assert rec.status == AgentStatus.done
    # a respawn is a new incarnation of the same name: the settled status no longer applies
    assert await h.provider.respawn(h.workspace, reply.id) == reply.id
    (rec,) = await h.provider.list_agents(h.workspace)
    assert not rec.status.terminal
    await wait_until(running, 10, what="the new incarnation Running")
    await h.provider.attach(h.workspace, reply.id)
    assert h.pods[reply.id] is not pod and len(h.pods[reply.id].received_specs) == 1


async def test_an_unreachable_pod_keeps_the_cr_status(harness: K8sHarness) -> None:
    h = harness
    reply = await h.provider.spawn(h.workspace, h.long_running_spec())

    async def running() -> bool:
        recs = await h.provider.list_agents(h.workspace)
        return bool(recs) and recs[0].status == AgentStatus.running

    await wait_until(running, 10, what="CR Running")
    await h.provider.attach(h.workspace, reply.id)
    pod = h.pods[reply.id]
    (pod_id,) = pod.agents
    pod.set_status(pod_id, "idle")
    assert (await h.provider.list_agents(h.workspace))[0].status == AgentStatus.idle
    await pod.stop()
    assert (await h.provider.list_agents(h.workspace))[0].status == AgentStatus.running


async def test_kube_errors_are_translated(harness: K8sHarness, tmp_path: Path) -> None:
    h = harness
    with pytest.raises(AgentNotFound):
        await h.provider.remove(h.workspace, "ct-0000000000000000", True)
    await h.kube.stop()
    for op in (
        h.provider.list_agents(h.workspace),
        h.provider.spawn(h.workspace, h.long_running_spec()),
        h.provider.attach(h.workspace, "ct-x"),
    ):
        with pytest.raises(FleetUnreachable, match="Kubernetes API unreachable") as info:
            await op
        assert info.value.__cause__ is not None


def test_workspace_mirror() -> None:
    ws = Workspace.model_validate(
        {
            "apiVersion": "caliban.caliban-ai.dev/v1alpha1",
            "kind": "Workspace",
            "metadata": {"name": "app", "generation": 3},
            "spec": {
                "displayName": "App",
                "sources": [
                    {"name": "app", "repo": "https://example.invalid/app.git", "path": "/work/app"}
                ],
                "providers": [
                    {
                        "name": "main",
                        "kind": "anthropic",
                        "credentialsRef": {"secretName": "s", "key": "k"},
                    }
                ],
                "defaultProvider": "main",
                "env": [{"name": "A", "value": "1"}],
                "agentPolicy": {"future": True},
            },
            "status": {"phase": "Ready", "observedGeneration": 3, "message": "ok"},
        }
    )
    assert ws.spec.sources[0].ref == "main"
    assert ws.spec.providers[0].credentials_ref is not None
    assert ws.spec.providers[0].credentials_ref.secret_name == "s"
    assert ws.status is not None and ws.status.observed_generation == 3
    wire = ws.to_wire()
    assert wire["spec"]["defaultProvider"] == "main" and "agentPolicy" not in wire["spec"]
    assert wire["spec"]["providers"][0]["credentialsRef"] == {"secretName": "s", "key": "k"}


async def test_the_pod_is_dialled_with_tls_and_the_token(
    harness: K8sHarness, tmp_path: Path
) -> None:
    h = harness
    reply = await h.provider.spawn(h.workspace, h.long_running_spec())

    async def running() -> bool:
        recs = await h.provider.list_agents(h.workspace)
        return bool(recs) and recs[0].status == AgentStatus.running

    await wait_until(running, 10, what="CR Running")
    bad = tmp_path / "bad-token"
    bad.write_text("not-the-token")
    wrong = K8sFleet(
        NS,
        h.kube.write_kubeconfig(tmp_path / "other"),
        caliband_ca_file=CERTS.write(tmp_path / "tls2").ca,
        caliband_token_file=bad,
    )
    try:
        with pytest.raises(FleetUnreachable):  # the pod's caliband drops it unanswered
            await wrong.attach(h.workspace, reply.id)
    finally:
        await wrong.close()
    assert h.pods[reply.id].auth_failures >= 1
    assert h.pods[reply.id].received_specs == []
    assert isinstance(await h.provider.attach(h.workspace, reply.id), TcpAddress)


def _api_error(code: int, message: str = "boom") -> ApiError:
    request = httpx2.Request("PATCH", "http://kube.invalid/apis/x")
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "code": code,
    }
    return ApiError(request=request, response=httpx2.Response(code, json=body, request=request))


@pytest.mark.parametrize(
    ("error", "name", "expected"),
    [
        (_api_error(404), "ct-1", AgentNotFound),
        (_api_error(404), None, NotFound),
        (_api_error(409), None, Conflict),
        (_api_error(410), None, Conflict),
        (_api_error(403), None, FleetUnreachable),
        (_api_error(422), None, ProtocolError),
        (_api_error(503), None, FleetUnreachable),
        (httpx2.ConnectError("refused"), None, FleetUnreachable),
        (ConfigError("no context"), None, InvalidConfig),
    ],
)
def test_kubernetes_errors_become_prospero_errors(
    error: Exception, name: str | None, expected: type[Exception]
) -> None:
    with pytest.raises(expected) as info:
        translate_kube_error(error, "apply CalibanTask ct-1", name)
    assert type(info.value).__module__ == "prospero.core.errors"
    assert info.value.__cause__ is error
    if isinstance(error, ApiError) and name is None:
        assert "boom" in str(info.value)


async def test_an_acp_task_reaches_the_pod_and_kubectl_shows_it(
    harness: K8sHarness, tmp_path: Path
) -> None:
    """Issue 13's "done when", the K8sFleet half: kubectl sees the CR Prospero applied with
    `driveProtocol: acp`, and the pod's caliband is asked for an ACP agent."""
    h = harness
    reply = await h.provider.spawn(
        h.workspace, h.long_running_spec(drive_protocol="acp", posture="supervised")
    )
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, (
        "kubectl is missing: apt-get install kubernetes-client (.ci/run does)"
    )
    proc = await asyncio.create_subprocess_exec(
        kubectl,
        "--kubeconfig",
        str(h.kube.write_kubeconfig(tmp_path / "kubectl")),
        "--cache-dir",
        str(tmp_path / "kubectl" / "cache"),
        "get",
        "calibantasks",
        "-o",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HOME": str(tmp_path / "kubectl")},  # nothing read from ~/.kube
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    (item,) = orjson.loads(out)["items"]
    assert item["metadata"]["name"] == reply.id
    assert item["spec"]["task"]["driveProtocol"] == "acp"
    assert item["spec"]["task"]["permissionPosture"] == "supervised"

    async def running() -> bool:
        recs = await h.provider.list_agents(h.workspace)
        return bool(recs) and recs[0].status == AgentStatus.running

    await wait_until(running, 10, what="CR Running")
    await h.provider.attach(h.workspace, reply.id)
    (spec,) = h.pods[reply.id].received_specs
    assert spec.drive_protocol == "acp" and spec.label == reply.id


# --- the list + watch cache -------------------------------------------------------------------


@dataclass
class Watched:
    kube: FakeKube
    provider: K8sFleet
    workspace: RegisteredWorkspace

    def lists(self) -> int:
        """LIST requests for CalibanTasks the fake server received (watches excluded)."""
        return sum(
            1
            for method, path in self.kube.app.requests
            if method == "GET"
            and path.split("?")[0].endswith("/calibantasks")
            and "watch=" not in path
        )

    def watches(self) -> list[str]:
        return [p for m, p in self.kube.app.requests if m == "GET" and "watch=" in p]

    def put(
        self,
        name: str,
        *,
        ws: str = "app",
        ns: str = NS,
        phase: str | None = None,
        skewed: bool = False,
    ) -> None:
        """Another client's write (it reaches watchers as ADDED or MODIFIED)."""
        obj: dict[str, Any] = {
            "apiVersion": "caliban.caliban-ai.dev/v1alpha1",
            "kind": "CalibanTask",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}"},
            "spec": {"workspaceRef": {"name": ws}, "task": "do it" if skewed else {"prompt": name}},
        }
        if phase is not None:
            obj["status"] = {"phase": phase}
        exists = self.kube.store.get(TASKS, ns, name) is not None
        self.kube.store.put(TASKS, obj, "MODIFIED" if exists else "ADDED")

    async def listed(self) -> dict[str, AgentStatus]:
        return {r.id: r.status for r in await self.provider.list_agents(self.workspace)}

    async def watching(self, n: int = 1) -> None:
        """Until the provider's `n`th WATCH is open on the server."""
        await wait_until(lambda: len(self.watches()) == n and len(self.kube.store.watchers) == 1, 5)


@pytest.fixture
async def watched(tmp_path: Path) -> AsyncIterator[Watched]:
    """The fake API server without its operator (nothing writes but the test), and a K8sFleet."""
    kube = FakeKube()
    await kube.start()
    provider = K8sFleet(NS, kube.write_kubeconfig(tmp_path), request_timeout=5)
    provider.cache.backoff_initial = 0.02
    provider.cache.backoff_max = 0.2
    try:
        yield Watched(kube, provider, RegisteredWorkspace(name="app", root=""))
    finally:
        await provider.close()
        await kube.stop()


async def test_other_clients_changes_reach_the_listing_without_another_list(
    watched: Watched,
) -> None:
    w, cache = watched, watched.provider.cache
    w.put("ct-a")
    assert await w.listed() == {"ct-a": AgentStatus.spawning}
    assert w.lists() == 1 and cache.lists == 1 and cache.ready
    await w.watching()
    (watch,) = w.watches()
    assert "allowWatchBookmarks=true" in watch and "timeoutSeconds=" in watch
    assert f"resourceVersion={cache.resource_version}" in watch
    cache.changed.clear()
    w.put("ct-b")  # created
    await wait_until(lambda: "ct-b" in cache.tasks, 5)
    assert cache.changed.is_set()
    w.put("ct-a", phase="Running")  # changed
    w.put("ct-elsewhere", ws="other")  # another workspace's
    w.kube.store.remove(TASKS, NS, "ct-b")  # deleted
    await wait_until(lambda: "ct-b" not in cache.tasks, 5)
    assert await w.listed() == {"ct-a": AgentStatus.running}
    assert cache.resource_version == str(w.kube.store.rv)
    # the provider's own writes are read back at once, still without a LIST
    reply = await w.provider.spawn(
        w.workspace, AgentSpec(prompt="mine")
    )
    assert reply.created and reply.id in await w.listed()
    await w.provider.kill(w.workspace, reply.id)
    assert reply.id not in await w.listed()
    assert w.lists() == 1 and cache.lists == 1 and len(w.watches()) == 1


async def test_bookmarks_advance_the_resource_version(watched: Watched) -> None:
    w, cache = watched, watched.provider.cache
    await w.listed()
    await w.watching()
    w.put("ct-x", ns="elsewhere")  # a revision this namespace's watch never sees
    assert cache.resource_version == str(w.kube.store.rv - 1)
    w.kube.bookmark()
    await wait_until(lambda: cache.bookmarks == 1, 5)
    assert cache.resource_version == str(w.kube.store.rv)
    assert cache.lists == 1 and cache.tasks == {}


async def test_a_cut_watch_resumes_and_a_compacted_one_relists_missing_nothing(
    watched: Watched,
) -> None:
    w, cache = watched, watched.provider.cache
    w.put("ct-a")
    w.put("ct-b")
    await w.listed()
    await w.watching()
    # a cut: re-watched from the last resourceVersion, the change made meanwhile replayed once
    w.kube.cut_watches()
    w.put("ct-c")
    await wait_until(lambda: "ct-c" in cache.tasks, 5)
    await w.watching(2)
    assert (cache.lists, cache.expired) == (1, 0)
    # a cut, changes nobody watched, then the history is compacted: the re-watch gets the
    # in-stream 410 and the loop relists
    w.kube.cut_watches()
    w.put("ct-a", phase="Running")
    w.kube.store.remove(TASKS, NS, "ct-b")
    w.put("ct-d")
    w.kube.compact()
    await wait_until(lambda: cache.lists == 2 and cache.ready, 5)
    assert cache.expired == 1
    assert await w.listed() == {
        "ct-a": AgentStatus.running,
        "ct-c": AgentStatus.spawning,
        "ct-d": AgentStatus.spawning,
    }
    assert cache.resource_version == str(w.kube.store.rv)
    w.put("ct-e")  # and it watches on from the relist
    await wait_until(lambda: "ct-e" in cache.tasks, 5)
    assert w.lists() == 2


async def test_a_skewed_cr_in_a_watch_event_is_skipped_and_counted(watched: Watched) -> None:
    w, cache = watched, watched.provider.cache
    w.put("ct-good")
    await w.listed()
    await w.watching()
    w.put("ct-skewed", skewed=True)
    await wait_until(lambda: cache.skipped_events == 1, 5)
    assert await w.listed() == {"ct-good": AgentStatus.spawning}
    assert (w.provider.skipped_crs, w.provider.skipped_total) == (1, 1)
    w.put("ct-good", phase="Running")  # the watch goes on after the skewed event
    await wait_until(lambda: cache.tasks["ct-good"].phase == "Running", 5)
    w.put("ct-skewed")  # fixed: it decodes now
    await wait_until(lambda: "ct-skewed" in cache.tasks, 5)
    assert set(await w.listed()) == {"ct-good", "ct-skewed"}
    assert (w.provider.skipped_crs, w.provider.skipped_total) == (0, 1)
    assert cache.lists == 1 and cache.ready


async def test_an_unreachable_api_server_fails_the_listing_and_close_leaves_no_task(
    watched: Watched,
) -> None:
    w, cache = watched, watched.provider.cache
    w.put("ct-a")
    assert set(await w.listed()) == {"ct-a"}
    task = cache._task
    assert task is not None and not task.done()
    await w.kube.stop()  # its watch streams end; the re-watch is refused, and backs off
    await wait_until(lambda: cache.error is not None, 5)
    with pytest.raises(FleetUnreachable, match="Kubernetes API unreachable") as info:
        await w.provider.list_agents(w.workspace)
    assert info.value.__cause__ is not None
    await w.provider.close()
    assert task.done() and cache._task is None
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("k8s-watch-")]


@pytest.mark.parametrize("body", ["a: [", "- 1\n- 2\n", "clusters: 3\n"])
def test_a_malformed_kubeconfig_is_an_invalid_config(tmp_path: Path, body: str) -> None:
    """Broken YAML or a file of the wrong shape: Prospero's InvalidConfig, never a YAML or
    attribute error from the client library."""
    f = tmp_path / "kubeconfig"
    f.write_text(body)
    with pytest.raises(InvalidConfig, match="cannot load Kubernetes configuration"):
        K8sFleet("default", kubeconfig=f)


# --- concurrent identical spawns --------------------------------------------------------------


async def test_of_concurrent_identical_spawns_exactly_one_creates_the_cr(
    harness: K8sHarness, tmp_path: Path
) -> None:
    """Eight identical spawns at once from two providers (two replicas) on one API server:
    its create decides, so exactly one reports `created`; all of them name the same CR, which
    Prospero owns as its applier."""
    h = harness
    other = K8sFleet(NS, h.kube.write_kubeconfig(tmp_path / "other"))
    spec = h.long_running_spec(label="same", posture="supervised")
    try:
        replies = await asyncio.gather(
            *(p.spawn(h.workspace, spec) for p in [h.provider, other] * 4)
        )
    finally:
        await other.close()
    assert [r.created for r in replies].count(True) == 1, [r.created for r in replies]
    assert {r.id for r in replies} == {task_name("app", "long task", "same")}
    (obj,) = h.kube.store.items(TASKS, NS)
    assert obj["spec"]["task"]["permissionPosture"] == "supervised"
    managers = {(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]}
    assert ("prospero", "Apply") in managers
    again = await h.provider.spawn(h.workspace, spec)  # one more, alone
    assert again.id == replies[0].id and not again.created


async def test_a_create_of_an_existing_cr_is_refused_as_the_apiserver_refuses_it(
    harness: K8sHarness,
) -> None:
    """What K8sFleet's spawn reads as "it existed": kube-apiserver's 409 AlreadyExists Status
    (the fake writes it the same: code, reason, message and details)."""
    h = harness
    first = await h.provider.spawn(h.workspace, h.long_running_spec())
    body = {
        "apiVersion": "caliban.caliban-ai.dev/v1alpha1",
        "kind": "CalibanTask",
        "metadata": {"name": first.id},
        "spec": {"workspaceRef": {"name": "app"}, "task": {"prompt": "long task"}},
    }
    url = f"{h.kube.url}/apis/caliban.caliban-ai.dev/v1alpha1/namespaces/{NS}/calibantasks"
    async with httpx2.AsyncClient() as client:
        r = await client.post(url, json=body)
    assert r.status_code == 409
    assert r.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'calibantasks.caliban.caliban-ai.dev "{first.id}" already exists',
        "reason": "AlreadyExists",
        "details": {
            "name": first.id,
            "group": "caliban.caliban-ai.dev",
            "kind": "calibantasks",
        },
        "code": 409,
    }
