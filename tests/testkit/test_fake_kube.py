"""The fake Kubernetes API server (prospero.testkit.fake_kube) driven by real clients: the
real `kubectl` as a subprocess, and raw HTTP for what kubectl does not show (watch framing,
bookmarks, 410 Gone, Status bodies, managedFields)."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from prospero.testkit.fake_kube import FakeKube
from tests.kubectl import Kubectl
from tests.support import wait_until

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "k8s"
REPO = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl")


@pytest.fixture
def kubectl_present() -> None:
    """Never skipped: a machine without kubectl fails these tests with what to install."""
    assert KUBECTL is not None, (
        "kubectl is missing: apt-get install kubernetes-client (.ci/run does)"
    )


needs_kubectl = pytest.mark.usefixtures("kubectl_present")

G = "caliban.caliban-ai.dev"
BASE = f"/apis/{G}/v1alpha1/namespaces/default/calibantasks"
MERGE = {"content-type": "application/merge-patch+json"}
APPLY = {"content-type": "application/apply-patch+yaml"}


def task(name: str, prompt: str = "fix the tests", **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {
        "apiVersion": f"{G}/v1alpha1",
        "kind": "CalibanTask",
        "metadata": meta,
        "spec": {"workspaceRef": {"name": "app"}, "task": {"prompt": prompt}},
    }


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[FakeKube]:
    async with FakeKube() as kube:
        kube.write_kubeconfig(tmp_path)
        yield kube


@pytest.fixture
async def fake_op(tmp_path: Path) -> AsyncIterator[FakeKube]:
    """With the fake operator, pointing each task at its caliband "pod" (the endpoint hook)."""
    endpoints = {"ct-0123456789abcdef": "10.0.0.7:7443"}
    async with FakeKube(endpoint=lambda t: endpoints.get(t["metadata"]["name"])) as kube:
        kube.write_kubeconfig(tmp_path)
        yield kube


@pytest.fixture
async def http(fake: FakeKube) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=fake.url, timeout=5) as c:
        yield c


def kubectl_in(tmp: Path) -> Kubectl:
    """kubectl on the kubeconfig `FakeKube.write_kubeconfig(tmp)` wrote, HOME and cache in tmp."""
    return Kubectl(tmp, tmp / "kubeconfig", timeout=20)


@pytest.fixture
def kubectl(tmp_path: Path) -> Kubectl:
    return kubectl_in(tmp_path)


# kubectl -----------------------------------------------------------------------------------


@needs_kubectl
async def test_kubectl_server_side_apply_get_watch_delete(
    fake_op: FakeKube, kubectl: Kubectl
) -> None:
    fake = fake_op
    http = httpx.AsyncClient(base_url=fake.url, timeout=5)
    out = await kubectl.ok("api-resources", f"--api-group={G}", "-o", "wide")
    row = next(line.split() for line in out.splitlines() if line.startswith("calibantasks"))
    assert row[:5] == ["calibantasks", "ctask", f"{G}/v1alpha1", "true", "CalibanTask"]
    assert row[5:7] == ["create,delete,deletecollection,get,list,patch,update,watch", "caliban"]

    manifest = str(FIXTURES / "calibantask-acp.yaml")
    changed = (
        (FIXTURES / "calibantask-acp.yaml")
        .read_text()
        .replace("add a changelog entry", "something else")
    )
    out = await kubectl.ok("apply", "--server-side", "-f", manifest)
    assert out.strip() == f"calibantask.{G}/ct-0123456789abcdef serverside-applied"

    # the fake operator moves the phase through the status subresource, to the hook's endpoint
    async def running() -> bool:
        doc = json.loads(await kubectl.ok("get", "calibantasks", "-o", "json"))
        return [i.get("status", {}).get("phase") for i in doc["items"]] == ["Running"]

    await wait_until(running, 5.0, interval=0.02, what="the task Running")
    doc = json.loads(await kubectl.ok("get", "calibantasks", "-o", "json", "--show-managed-fields"))
    (item,) = doc["items"]
    assert item["spec"]["task"] == {
        "prompt": "add a changelog entry",
        "driveProtocol": "acp",
        "permissionPosture": "supervised",
    }
    assert item["status"]["calibandEndpoint"] == "10.0.0.7:7443"
    meta = item["metadata"]
    assert meta["generation"] == 1 and meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert int(meta["resourceVersion"]) > 0
    managers = {
        (m["manager"], m["operation"], m.get("subresource", "")) for m in meta["managedFields"]
    }
    assert managers == {("kubectl", "Apply", ""), ("caliban-operator", "Apply", "status")}
    kubectl_fields = next(m for m in meta["managedFields"] if m["manager"] == "kubectl")["fieldsV1"]
    assert kubectl_fields["f:spec"]["f:task"] == {
        "f:driveProtocol": {},
        "f:permissionPosture": {},
        "f:prompt": {},
    }

    # re-applying the same manifest changes nothing (no new revision)
    await kubectl.ok("apply", "--server-side", "-f", manifest)
    again = json.loads(await kubectl.ok("get", "ctask", "ct-0123456789abcdef", "-o", "json"))
    assert again["metadata"]["resourceVersion"] == meta["resourceVersion"]

    # another manager changing a field kubectl owns: the apiserver's conflict, then --force-conflicts
    rc, _, err = await kubectl(
        "apply", "--server-side", "--field-manager=ci", "-f", "-", stdin=changed.encode()
    )
    assert rc == 1
    assert err.startswith(
        'error: Apply failed with 1 conflict: conflict with "kubectl": .spec.task.prompt'
    )
    await kubectl.ok(
        "apply",
        "--server-side",
        "--field-manager=ci",
        "--force-conflicts",
        "-f",
        "-",
        stdin=changed.encode(),
    )
    forced = json.loads(await kubectl.ok("get", "ctask", "ct-0123456789abcdef", "-o", "json"))
    assert (
        forced["spec"]["task"]["prompt"] == "something else"
        and forced["metadata"]["generation"] == 2
    )

    rc, _, err = await kubectl("get", "calibantask", "nope")
    assert rc == 1
    assert err.strip() == f'Error from server (NotFound): calibantasks.{G} "nope" not found'

    # kubectl get -w sees a change made by someone else, then the deletion
    watching = len(fake.store.watchers)
    proc = await asyncio.create_subprocess_exec(
        *kubectl.base,
        "get",
        "calibantasks",
        "--watch-only",
        "-o",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=kubectl.env,
    )
    try:
        await wait_until(
            lambda: len(fake.store.watchers) > watching, 5.0, interval=0.02, what="a new watch"
        )
        r = await http.patch(
            f"{BASE}/ct-0123456789abcdef",
            json={"metadata": {"labels": {"seen": "yes"}}},
            headers=MERGE,
        )
        assert r.status_code == 200
        out = await kubectl.ok("delete", "calibantask", "ct-0123456789abcdef")
        assert out.strip() == f'calibantask.{G} "ct-0123456789abcdef" deleted'
        assert proc.stdout is not None
        decoder, buf, objs = json.JSONDecoder(), "", []
        deadline = time.monotonic() + 5
        while len(objs) < 2 and time.monotonic() < deadline:
            buf += (await asyncio.wait_for(proc.stdout.read(65536), 5)).decode()
            buf = buf.lstrip()
            while buf:
                try:
                    obj, end = decoder.raw_decode(buf)
                except ValueError:
                    break
                objs.append(obj)
                buf = buf[end:].lstrip()
        assert objs[0]["metadata"]["labels"]["seen"] == "yes"
        assert objs[1]["metadata"]["name"] == "ct-0123456789abcdef"
    finally:
        proc.terminate()
        await proc.wait()
        await http.aclose()
    assert json.loads(await kubectl.ok("get", "calibantasks", "-o", "json"))["items"] == []


@needs_kubectl
async def test_kubectl_applies_the_deploy_crds_to_an_empty_server(tmp_path: Path) -> None:
    # deploy/crds are the CRDs the fake serves by default
    for f in (REPO / "deploy" / "crds").glob("*.yaml"):
        bundled = REPO / "src/prospero/testkit/fake_kube/crds" / f.name
        assert yaml.safe_load(f.read_text()) == yaml.safe_load(bundled.read_text())
    async with FakeKube(install_crds=False) as kube:
        kube.write_kubeconfig(tmp_path)
        kubectl = kubectl_in(tmp_path)
        rc, _, err = await kubectl("get", "calibantasks")
        assert rc == 1 and 'the server doesn\'t have a resource type "calibantasks"' in err
        crds = str(REPO / "deploy" / "crds")
        out = await kubectl.ok("apply", "--dry-run=server", "-f", crds)
        assert "created (server dry run)" in out
        assert kube.store.items(("apiextensions.k8s.io", "customresourcedefinitions"), None) == []
        await kubectl.ok("apply", "-f", crds)
        out = await kubectl.ok("apply", "-f", crds)
        assert out.count("unchanged") == 2
        bad = yaml.safe_dump(
            task("bad") | {"spec": {"task": {"prompt": "x", "driveProtocol": "grpc"}}}
        )
        rc, _, err = await kubectl("create", "-f", "-", stdin=bad.encode())
        assert rc == 1
        assert (
            'spec.task.driveProtocol: Unsupported value: "grpc": supported values: "ndjson", "acp"'
            in err
        )
        assert "spec.workspaceRef: Required value" in err
        await kubectl.ok("create", "-f", str(FIXTURES / "calibantask-acp.yaml"))
        out = await kubectl.ok("get", "ctask", "-o", "name")
        assert out.strip() == f"calibantask.{G}/ct-0123456789abcdef"


# raw HTTP ----------------------------------------------------------------------------------


async def test_discovery_documents(http: httpx.AsyncClient) -> None:
    api = (await http.get("/api")).json()
    assert api["kind"] == "APIVersions" and api["versions"] == ["v1"]
    groups = (await http.get("/apis")).json()
    assert groups["kind"] == "APIGroupList"
    ours = next(g for g in groups["groups"] if g["name"] == G)
    assert ours["preferredVersion"] == {"groupVersion": f"{G}/v1alpha1", "version": "v1alpha1"}
    rl = (await http.get(f"/apis/{G}/v1alpha1")).json()
    assert rl["kind"] == "APIResourceList" and rl["groupVersion"] == f"{G}/v1alpha1"
    by = {r["name"]: r for r in rl["resources"]}
    assert set(by) == {"calibantasks", "calibantasks/status", "workspaces", "workspaces/status"}
    assert by["calibantasks"]["kind"] == "CalibanTask" and by["calibantasks"]["namespaced"] is True
    assert by["calibantasks"]["shortNames"] == ["ctask"]
    assert by["calibantasks/status"]["verbs"] == ["get", "patch", "update"]
    assert (await http.get("/version")).json()["major"] == "1"
    missing = await http.get("/apis/nope.example.com/v1")
    assert missing.status_code == 404 and missing.json()["reason"] == "NotFound"


async def test_status_bodies_of_failures(http: httpx.AsyncClient) -> None:
    r = await http.get(f"{BASE}/nope")
    assert r.status_code == 404
    assert r.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'calibantasks.{G} "nope" not found',
        "reason": "NotFound",
        "details": {"name": "nope", "group": G, "kind": "calibantasks"},
        "code": 404,
    }
    assert (await http.post(BASE, json=task("a"))).status_code == 201
    r = await http.post(BASE, json=task("a"))
    assert (r.status_code, r.json()["reason"], r.json()["message"]) == (
        409,
        "AlreadyExists",
        f'calibantasks.{G} "a" already exists',
    )
    cur = (await http.get(f"{BASE}/a")).json()
    assert (
        await http.put(f"{BASE}/a", json=cur | {"spec": cur["spec"] | {"tools": ["Edit"]}})
    ).status_code == 200
    r = await http.put(f"{BASE}/a", json=cur)  # stale resourceVersion
    assert r.status_code == 409 and r.json()["reason"] == "Conflict"
    assert r.json()["message"] == (
        f'Operation cannot be fulfilled on calibantasks.{G} "a": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    no_rv = task("a")
    r = await http.put(f"{BASE}/a", json=no_rv)
    assert r.status_code == 422 and "must be specified for an update" in r.json()["message"]
    r = await http.post(BASE, json=task("b") | {"spec": {"task": {}}})
    body = r.json()
    assert r.status_code == 422 and body["reason"] == "Invalid"
    assert (
        body["message"]
        == f'CalibanTask.{G} "b" is invalid: [spec.workspaceRef: Required value, spec.task.prompt: Required value]'
    )
    assert {c["field"] for c in body["details"]["causes"]} == {
        "spec.workspaceRef",
        "spec.task.prompt",
    }
    r = await http.patch(
        f"{BASE}/a",
        content=b"{}",
        headers={"content-type": "application/strategic-merge-patch+json"},
    )
    assert r.status_code == 415 and r.json()["reason"] == "UnsupportedMediaType"
    assert r.json()["message"].endswith(
        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    )
    r = await http.patch(f"{BASE}/a", content=json.dumps(task("a")), headers=APPLY)
    assert r.status_code == 400 and "fieldManager" in r.json()["message"]
    r = await http.post(
        "/api/v1/namespaces/ghost/secrets",
        json={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}},
    )
    assert r.status_code == 404 and r.json()["message"] == 'namespaces "ghost" not found'
    r = await http.delete(f"{BASE}/a")
    assert r.status_code == 200 and r.json()["kind"] == "CalibanTask"


async def test_list_resource_versions_selectors_and_pages(http: httpx.AsyncClient) -> None:
    for i in range(5):
        assert (
            await http.post(BASE, json=task(f"t{i}", team="a" if i % 2 else "b"))
        ).status_code == 201
    lst = (await http.get(BASE)).json()
    assert lst["kind"] == "CalibanTaskList" and lst["apiVersion"] == f"{G}/v1alpha1"
    assert lst["metadata"] == {
        "continue": "",
        "resourceVersion": lst["metadata"]["resourceVersion"],
    }
    assert [i["metadata"]["name"] for i in lst["items"]] == ["t0", "t1", "t2", "t3", "t4"]
    rv = lst["metadata"]["resourceVersion"]
    sel = (await http.get(BASE, params={"labelSelector": "team=a"})).json()
    assert [i["metadata"]["name"] for i in sel["items"]] == ["t1", "t3"]
    sel = (
        await http.get(
            BASE,
            params={"labelSelector": "team in (b),team!=a", "fieldSelector": "metadata.name!=t0"},
        )
    ).json()
    assert [i["metadata"]["name"] for i in sel["items"]] == ["t2", "t4"]
    r = await http.get(BASE, params={"fieldSelector": "spec.x=1"})
    assert r.status_code == 400 and "field label not supported: spec.x" in r.json()["message"]
    assert (await http.delete(f"{BASE}/t0")).status_code == 200
    exact = (
        await http.get(BASE, params={"resourceVersion": rv, "resourceVersionMatch": "Exact"})
    ).json()
    assert len(exact["items"]) == 5 and exact["metadata"]["resourceVersion"] == rv
    page = (await http.get(BASE, params={"limit": "2"})).json()
    assert [i["metadata"]["name"] for i in page["items"]] == ["t1", "t2"]
    assert page["metadata"]["remainingItemCount"] == 2
    nxt = (
        await http.get(BASE, params={"limit": "2", "continue": page["metadata"]["continue"]})
    ).json()
    assert [i["metadata"]["name"] for i in nxt["items"]] == ["t3", "t4"] and nxt["metadata"][
        "continue"
    ] == ""


async def _events(resp: httpx.Response, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    lines = resp.aiter_lines()
    async with asyncio.timeout(timeout):
        while len(out) < n:
            line = await anext(lines)
            if line.strip():
                out.append(json.loads(line))
    return out


async def test_watch_events_bookmarks_and_410(fake: FakeKube, http: httpx.AsyncClient) -> None:
    assert (await http.post(BASE, json=task("w1"))).status_code == 201
    rv = (await http.get(BASE)).json()["metadata"]["resourceVersion"]
    params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true"}
    async with http.stream("GET", BASE, params=params) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
        assert resp.headers.get("transfer-encoding") == "chunked"
        await wait_until(
            lambda: len(fake.store.watchers) == 1, 5.0, interval=0.02, what="one watch"
        )
        await http.patch(f"{BASE}/w1", json={"spec": {"tools": ["Bash"]}}, headers=MERGE)
        await http.post(BASE, json=task("w2"))
        await http.delete(f"{BASE}/w1")
        fake.bookmark()
        evs = await _events(resp, 4)
        assert [(e["type"], e["object"]["metadata"].get("name")) for e in evs] == [
            ("MODIFIED", "w1"),
            ("ADDED", "w2"),
            ("DELETED", "w1"),
            ("BOOKMARK", None),
        ]
        bm = evs[-1]["object"]
        assert bm == {
            "apiVersion": f"{G}/v1alpha1",
            "kind": "CalibanTask",
            "metadata": {"resourceVersion": str(fake.store.rv)},
        }
        revs = [int(e["object"]["metadata"]["resourceVersion"]) for e in evs]
        assert revs[:3] == sorted(set(revs[:3])) and revs[0] > int(rv) and revs[3] == revs[2]

    # periodic bookmarks while nothing happens
    fake.app.bookmark_interval = 0.1
    async with http.stream(
        "GET", BASE, params={**params, "resourceVersion": str(fake.store.rv)}
    ) as resp:
        (idle,) = await _events(resp, 1)
    assert idle["type"] == "BOOKMARK" and idle["object"]["metadata"]["resourceVersion"] == str(
        fake.store.rv
    )

    # a resourceVersion older than the compacted history: 200, then one ERROR event with a 410
    fake.compact()
    async with http.stream("GET", BASE, params={"watch": "1", "resourceVersion": rv}) as resp:
        assert resp.status_code == 200
        lines = [json.loads(line) async for line in resp.aiter_lines() if line.strip()]
    assert len(lines) == 1 and lines[0]["type"] == "ERROR"
    status = lines[0]["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    assert status["message"] == f"too old resource version: {rv} ({fake.store.horizon})"
    r = await http.get(BASE, params={"resourceVersion": rv, "resourceVersionMatch": "Exact"})
    assert r.status_code == 410 and r.json()["reason"] == "Expired"

    # no resourceVersion: the current state as ADDED first; timeoutSeconds ends the stream
    async with http.stream("GET", BASE, params={"watch": "true", "timeoutSeconds": "1"}) as resp:
        lines = [json.loads(line) async for line in resp.aiter_lines() if line.strip()]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("ADDED", "w2")]

    # streaming list: initial events end with an annotated bookmark
    params = {
        "watch": "1",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "1",
    }
    async with http.stream("GET", BASE, params=params) as resp:
        evs = await _events(resp, 2)
    assert evs[0]["type"] == "ADDED"
    assert evs[1]["type"] == "BOOKMARK"
    assert evs[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_watch_label_selector_turns_leaving_into_deleted(
    fake: FakeKube, http: httpx.AsyncClient
) -> None:
    assert (await http.post(BASE, json=task("s1", team="a"))).status_code == 201
    rv = (await http.get(BASE)).json()["metadata"]["resourceVersion"]
    async with http.stream(
        "GET", BASE, params={"watch": "1", "resourceVersion": rv, "labelSelector": "team=a"}
    ) as resp:
        await wait_until(
            lambda: len(fake.store.watchers) == 1, 5.0, interval=0.02, what="one watch"
        )
        await http.patch(f"{BASE}/s1", json={"metadata": {"labels": {"team": "b"}}}, headers=MERGE)
        await http.patch(f"{BASE}/s1", json={"metadata": {"labels": {"team": "a"}}}, headers=MERGE)
        evs = await _events(resp, 2)
    assert [e["type"] for e in evs] == ["DELETED", "ADDED"]


async def test_server_side_apply_field_ownership_and_status(
    fake: FakeKube, http: httpx.AsyncClient
) -> None:
    body = task("ssa") | {
        "spec": {"workspaceRef": {"name": "app"}, "task": {"prompt": "p"}, "tools": ["Edit"]}
    }
    r = await http.patch(
        f"{BASE}/ssa",
        params={"fieldManager": "prospero", "force": "true"},
        content=yaml.safe_dump(body),
        headers=APPLY,
    )
    assert r.status_code == 201
    first = r.json()
    r = await http.patch(
        f"{BASE}/ssa",
        params={"fieldManager": "prospero"},
        content=yaml.safe_dump(body),
        headers=APPLY,
    )
    assert (
        r.status_code == 200
        and r.json()["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    )
    # a field the manager stops applying is removed; generation follows spec changes only
    del body["spec"]["tools"]
    r = await http.patch(
        f"{BASE}/ssa",
        params={"fieldManager": "prospero"},
        content=yaml.safe_dump(body),
        headers=APPLY,
    )
    assert "tools" not in r.json()["spec"] and r.json()["metadata"]["generation"] == 2
    # status through the main resource is ignored; through /status it is the only thing taken
    r = await http.patch(f"{BASE}/ssa/status", json={"status": {"phase": "Running"}}, headers=MERGE)
    assert r.status_code == 200 and r.json()["metadata"]["generation"] == 2
    cur = r.json()
    r = await http.put(f"{BASE}/ssa", json=cur | {"status": {"phase": "Failed"}})
    assert r.json()["status"]["phase"] == "Running"
    cur = r.json()
    r = await http.put(
        f"{BASE}/ssa/status",
        json=cur | {"status": {"phase": "Completed"}, "spec": cur["spec"] | {"providerRef": "x"}},
    )
    assert r.status_code == 200
    done = r.json()
    assert done["status"]["phase"] == "Completed" and "providerRef" not in done["spec"]
    assert done["metadata"]["generation"] == 2
    entry = next(m for m in done["metadata"]["managedFields"] if m["operation"] == "Update")
    assert entry["subresource"] == "status" and entry["manager"] == "python-httpx"
    # a spec the apply config gets wrong never reaches the object: structured-merge-diff's 500
    bad = task("ssa") | {
        "spec": {"workspaceRef": {"name": "app"}, "task": {"prompt": "p"}, "bogus": 1}
    }
    r = await http.patch(
        f"{BASE}/ssa",
        params={"fieldManager": "prospero"},
        content=yaml.safe_dump(bad),
        headers=APPLY,
    )
    assert r.status_code == 500 and r.json()["message"].endswith(
        ".spec.bogus: field not declared in schema"
    )
    assert "reason" not in r.json()


def test_standalone_prints_one_json_line_and_stops_on_sigterm(tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-m", "prospero.testkit.fake_kube", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert Path(info["kubeconfig"]).exists()
        cfg = yaml.safe_load(Path(info["kubeconfig"]).read_text())
        assert cfg["clusters"][0]["cluster"]["server"] == info["url"]
        r = httpx.get(info["url"] + BASE, timeout=5)
        assert r.json()["kind"] == "CalibanTaskList"
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
