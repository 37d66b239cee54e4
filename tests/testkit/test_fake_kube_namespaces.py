"""The fake API server's namespaces, as kube-apiserver has them: `default`, `kube-system`,
`kube-public` and `kube-node-lease` exist from the start, and a write that would create an
object in a namespace that does not exist (a create, or a server-side apply that creates) is
refused with 404 NotFound `namespaces "X" not found`, by the real kubectl and over raw HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from prospero.testkit.fake_kube import FakeKube
from tests.kubectl import Kubectl

G = "caliban.caliban-ai.dev"
APPLY = {"content-type": "application/apply-patch+yaml"}


def task(name: str, namespace: str) -> str:
    return json.dumps(
        {
            "apiVersion": f"{G}/v1alpha1",
            "kind": "CalibanTask",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"workspaceRef": {"name": "app"}, "task": {"prompt": "fix the tests"}},
        }
    )


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[FakeKube]:
    async with FakeKube() as kube:
        kube.write_kubeconfig(tmp_path)
        yield kube


async def test_writes_into_a_namespace_that_does_not_exist_are_refused(
    fake: FakeKube, tmp_path: Path
) -> None:
    kubectl = Kubectl(tmp_path, tmp_path / "kubeconfig", timeout=20)
    names = (await kubectl.ok("get", "namespaces", "-o", "name")).split()
    assert names == [
        "namespace/default",
        "namespace/kube-node-lease",
        "namespace/kube-public",
        "namespace/kube-system",
    ]

    for verb in (["apply", "--server-side"], ["create"]):
        rc, _out, err = await kubectl(*verb, "-f", "-", stdin=task("ct-a", "ghost").encode())
        assert rc != 0 and 'namespaces "ghost" not found' in err, (verb, err)
        assert "(NotFound)" in err, err

    async with httpx.AsyncClient(base_url=fake.url, timeout=5) as http:
        path = f"/apis/{G}/v1alpha1/namespaces/ghost/calibantasks"
        r = await http.patch(
            f"{path}/ct-a?fieldManager=t", content=task("ct-a", "ghost"), headers=APPLY
        )
        assert r.status_code == 404, r.text
        body = r.json()
        assert (body["kind"], body["status"], body["reason"], body["code"]) == (
            "Status",
            "Failure",
            "NotFound",
            404,
        )
        assert body["message"] == 'namespaces "ghost" not found'
        assert body["details"] == {"name": "ghost", "kind": "namespaces"}
        r = await http.get(path)  # a list of a namespace that does not exist is just empty
        assert r.status_code == 200 and r.json()["items"] == []

    # Once the namespace exists (created from a manifest: `kubectl create namespace` sends
    # protobuf, which the fake refuses), both work.
    ns = json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ghost"}})
    await kubectl.ok("create", "-f", "-", stdin=ns.encode())
    out = await kubectl.ok(
        "apply", "--server-side", "-f", "-", stdin=task("ct-a", "ghost").encode()
    )
    assert out.strip() == f"calibantask.{G}/ct-a serverside-applied"
    out = await kubectl.ok("create", "-f", "-", stdin=task("ct-b", "ghost").encode())
    assert out.strip() == f"calibantask.{G}/ct-b created"
    out = await kubectl.ok("get", "calibantasks", "-n", "ghost", "-o", "name")
    assert out.split() == [f"calibantask.{G}/ct-a", f"calibantask.{G}/ct-b"]
