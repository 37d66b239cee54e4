"""The k8s config plane through the HTTP API (issue 13): under `--fleet-backend k8s` a workspace
is a `Workspace` CR. `POST /api/workspaces` and `PUT .../config` apply it (202, with the CR's
phase as it stands), the fake operator reconciles it to Ready, `GET /api/workspaces` lists the
CRs with their status (credentials only as a flag), `DELETE` deletes it; the registry follows
the CRs, also those another client made. The real kubectl reads what prosperod wrote. Bad
input is a clear 4xx that changes nothing. The local backend refuses the k8s-only fields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prospero.core.wire.k8s import task_name
from prospero.testkit.fake_kube.operator import WORKSPACES
from tests.api.conftest import Stack, StackFactory
from tests.api.test_k8s_backend import K8S_CONFIG, NS, Cluster, cluster, k8s_stack
from tests.kubectl import Kubectl
from tests.support import wait_until
from tests.testkit.test_fake_kube import kubectl_in, kubectl_present

__all__ = ["cluster", "kubectl_present"]  # fixtures, used by name

G = "caliban.caliban-ai.dev"


def kubectl_for(cluster: Cluster, tmp: Path) -> Kubectl:
    """kubectl with its own HOME and cache dir, on the fake API server."""
    tmp.mkdir(parents=True, exist_ok=True)
    cluster.kube.write_kubeconfig(tmp)
    return kubectl_in(tmp)


async def cr_items(kubectl: Kubectl) -> dict[str, dict[str, Any]]:
    out = await kubectl.ok("get", "workspaces", "-n", NS, "-o", "json", "--show-managed-fields")
    return {i["metadata"]["name"]: i for i in json.loads(out)["items"]}


async def listed(stack: Stack) -> dict[str, dict[str, Any]]:
    r = await stack.client.get("/api/workspaces")
    assert r.status_code == 200, r.text
    return {w["name"]: w for w in r.json()}


async def wait_ready(stack: Stack, name: str, generation: int) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def ready() -> bool:
        ws = (await listed(stack)).get(name)
        status = (ws or {}).get("status") or {}
        if status.get("phase") == "Ready" and status.get("observed_generation") == generation:
            seen.update(ws or {})
            return True
        return False

    await wait_until(ready, 10, interval=0.05, what=f"{name} Ready at generation {generation}")
    return seen


def error(r: Any, status: int, kind: str, text: str) -> None:
    assert r.status_code == status, r.text
    assert r.json()["kind"] == kind and text in r.json()["error"], r.text


@pytest.mark.usefixtures("kubectl_present")
async def test_workspaces_are_workspace_crs_under_the_k8s_backend(
    cluster: Cluster, make_stack: StackFactory, tmp_path: Path
) -> None:
    stack = await k8s_stack(make_stack, cluster)
    kubectl = kubectl_for(cluster, tmp_path / "kubectl")
    r = await stack.client.get("/api/capabilities")
    assert r.json()["async_workspace_ops"] is True and r.json()["admin"] is True

    # POST: 202 with the CR's phase (the operator has not written a status yet)
    config = {**K8S_CONFIG, "display_name": "The app", "env": {"CI": "1"}}
    r = await stack.client.post("/api/workspaces", json={"name": "app", "config": config})
    assert r.status_code == 202, r.text
    assert r.json() == {
        "name": "app",
        "status": {
            "phase": "Pending",
            "message": None,
            "generation": 1,
            "observed_generation": None,
        },
    }
    cr = (await cr_items(kubectl))["app"]
    assert cr["spec"] == {
        "displayName": "The app",
        "sources": [
            {
                "name": "app",
                "repo": "https://git.example/app.git",
                "ref": "main",
                "path": "/src/app",
            }
        ],
        "providers": [
            {
                "name": "claude",
                "kind": "anthropic",
                "credentialsRef": {"secretName": "anthropic", "key": "api-key"},
            }
        ],
        "env": [{"name": "CI", "value": "1"}],
    }
    managers = {(m["manager"], m["operation"]) for m in cr["metadata"]["managedFields"]}
    assert ("prospero", "Apply") in managers

    # the operator reconciles it; GET lists the CR with its status, credentials as a flag
    ws = await wait_ready(stack, "app", 1)
    assert ws["root"] == "" and ws["health"] == {"state": "healthy"} and ws["agent_count"] == 0
    assert ws["display_name"] == "The app"
    assert ws["sources"] == [{"name": "app", "path": "/src/app"}]
    assert ws["source_specs"][0]["ref"] == "main"
    assert ws["providers"] == [
        {
            "name": "claude",
            "kind": "anthropic",
            "base_url": None,
            "model": None,
            "has_credentials": True,
        }
    ]
    assert ws["config"] == {"env": {"CI": "1"}}
    assert "secret" not in json.dumps(ws).lower()  # never the Secret's name or key

    # PUT replaces the config wholesale: 202, a new generation, reconciled again
    replaced = {
        "sources": K8S_CONFIG["sources"],
        "providers": [*K8S_CONFIG["providers"], {"name": "local", "kind": "ollama"}],
        "default_provider": "local",
        "isolation": {"worktrees": "per-source"},
    }
    r = await stack.client.put("/api/workspaces/app/config", json=replaced)
    assert r.status_code == 202, r.text
    assert r.json()["status"]["generation"] == 2
    assert r.json()["status"]["observed_generation"] == 1  # not yet reconciled
    spec = (await cr_items(kubectl))["app"]["spec"]
    assert spec["displayName"] == "app" and "env" not in spec  # omitted ⇒ removed
    assert spec["defaultProvider"] == "local" and spec["isolation"] == {"worktrees": "per-source"}
    ws = await wait_ready(stack, "app", 2)
    assert ws["default_provider"] == "local" and "config" in ws and ws["config"] == {}

    # an agent of the workspace: its CalibanTask names the Workspace CR, whose provider the
    # operator pins
    agent = await stack.spawn(ws="app", prompt="fix it")
    assert agent == task_name("app", "fix it", None)

    async def pinned() -> bool:
        task = cluster.task(agent) or {}
        resolved = (task.get("status") or {}).get("resolvedWorkspace") or {}
        return (resolved.get("provider") or {}).get("name") == "local"

    await wait_until(pinned, 10, interval=0.05, what="the operator pinned the provider")
    assert cluster.task(agent)["spec"]["workspaceRef"] == {"name": "app"}  # type: ignore[index]

    async def counted() -> bool:
        return (await listed(stack))["app"]["agent_count"] == 1

    await wait_until(counted, 10, interval=0.05, what="the agent counted under its CR")

    # a Workspace another client made is in the registry too
    other = {
        "apiVersion": f"{G}/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": "other", "namespace": NS},
        "spec": {
            "displayName": "Other",
            "sources": [{"name": "o", "repo": "r", "path": "/o"}],
            "providers": [{"name": "p", "kind": "ollama"}],
        },
    }
    await kubectl.ok(
        "apply", "--server-side", "--field-manager=ops", "-f", "-", stdin=json.dumps(other).encode()
    )
    await wait_ready(stack, "other", 1)

    async def in_fleet() -> bool:
        r = await stack.client.get("/api/fleet")
        return "other" in [w["name"] for w in r.json()["workspaces"]]

    await wait_until(in_fleet, 10, interval=0.05, what="the other workspace in the fleet")

    # DELETE deletes the CR (204), then 404: it is gone
    r = await stack.client.delete("/api/workspaces/other")
    assert r.status_code == 204, r.text
    assert "other" not in await cr_items(kubectl)
    error(await stack.client.delete("/api/workspaces/other"), 404, "not_found", "other")
    assert "other" not in await listed(stack)
    r = await stack.client.get("/api/fleet")
    assert "other" not in [w["name"] for w in r.json()["workspaces"]]

    # Prospero named the Secret; it never asked the API server for one
    paths = [p for _m, p in cluster.kube.app.requests]
    assert not [p for p in paths if "/secrets" in p], paths


async def test_bad_k8s_workspace_input_is_a_clear_error_and_changes_nothing(
    cluster: Cluster, make_stack: StackFactory
) -> None:
    stack = await k8s_stack(make_stack, cluster)
    r = await stack.client.post("/api/workspaces", json={"name": "app", "config": K8S_CONFIG})
    assert r.status_code == 202, r.text
    before = cluster.kube.store.get(WORKSPACES, NS, "app")
    assert before is not None

    post = stack.client.post
    cases = [
        ({"name": "app2", "root": str(stack.tmp)}, 400, "invalid_config", "leave `root` out"),
        ({"name": "app2"}, 400, "invalid_config", "at least one source"),
        (
            {"name": "app2", "config": {**K8S_CONFIG, "providers": []}},
            400,
            "invalid_config",
            "at least one provider",
        ),
        (
            {"name": "App_2", "config": K8S_CONFIG},
            400,
            "invalid_config",
            "cannot name a Workspace CR",
        ),
        (
            {"name": "app2", "config": {**K8S_CONFIG, "api_key_from_env": "K"}},
            400,
            "invalid_config",
            "credentials_ref",
        ),
        (
            {"name": "app2", "config": {**K8S_CONFIG, "default_provider": "x"}},
            400,
            "invalid_config",
            "default_provider",
        ),
        (
            {"name": "app2", "config": {**K8S_CONFIG, "sorces": []}},
            422,
            "invalid_request",
            "config.sorces",
        ),
        (
            {"name": "app2", "config": {**K8S_CONFIG, "sources": [{"name": "a", "repo": "r"}]}},
            422,
            "invalid_request",
            "path",
        ),
        ({"name": "app", "config": {**K8S_CONFIG, "display_name": "New"}}, 409, "conflict", "PUT"),
    ]
    for body, status, kind, text in cases:
        error(await post("/api/workspaces", json=body), status, kind, text)
    put = stack.client.put
    error(await put("/api/workspaces/nope/config", json=K8S_CONFIG), 404, "not_found", "nope")
    error(
        await put("/api/workspaces/app/config", json={"sources": []}),
        400,
        "invalid_config",
        "source",
    )
    # the CR is replaced whole: no merge patch of it (the answer says what to do instead)
    r = await stack.client.patch("/api/workspaces/app/config", json={"env": {"A": "1"}})
    error(r, 409, "unsupported", "replaced whole: PUT /api/workspaces/app/config")
    # nothing was lost or added
    assert cluster.kube.store.get(WORKSPACES, NS, "app") == before
    assert [o["metadata"]["name"] for o in cluster.kube.store.items(WORKSPACES, NS)] == ["app"]


async def test_the_local_backend_refuses_the_k8s_only_fields(make_stack: StackFactory) -> None:
    stack = await make_stack()
    root = stack.tmp / "other"
    root.mkdir()
    body = {"name": "other", "root": str(root), "config": {"sources": K8S_CONFIG["sources"]}}
    error(await stack.client.post("/api/workspaces", json=body), 400, "invalid_config", "sources")
    r = await stack.client.put("/api/workspaces/ws/config", json={"default_provider": "x"})
    error(r, 400, "invalid_config", "--fleet-backend local")
    r = await stack.client.get("/api/capabilities")
    assert r.json()["async_workspace_ops"] is False
    # as before: unknown keys are ignored, no k8s tail in the listing
    r = await stack.client.put("/api/workspaces/ws/config", json={"provider": "ollama", "x": 1})
    assert r.status_code == 204, r.text
    [ws] = (await stack.client.get("/api/workspaces")).json()
    assert set(ws) == {"name", "root", "sources", "health", "agent_count", "config"}
    assert ws["config"] == {"provider": "ollama"}


async def test_the_cli_applies_k8s_workspaces_and_shows_their_phase(
    cluster: Cluster, make_stack: StackFactory, tmp_path: Path
) -> None:
    """`prospero workspace add/config/list/rm` under k8s (the CLI, blocking, in a thread; the
    server on this loop)."""
    import asyncio

    from tests.cli.conftest import Cli

    stack = await k8s_stack(make_stack, cluster)
    cli = Cli(stack.url)

    async def run(*args: str) -> Any:
        res = await asyncio.to_thread(cli, *args)
        assert res.exception is None or isinstance(res.exception, SystemExit), res.output
        return res

    config = tmp_path / "ws.json"
    config.write_text(json.dumps(K8S_CONFIG))
    res = await run("workspace", "add", "app", "--file", str(config))
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())  # (the console may wrap)
    assert "applied Workspace CR 'app' (generation 1, not reconciled yet: phase Pending)" in said
    await wait_ready(stack, "app", 1)
    res = await run("workspace", "list")
    assert res.exit_code == 0, res.output
    header, *rows = [ln.split() for ln in res.stdout.splitlines()]
    assert header == ["NAME", "HEALTH", "AGENTS", "PROVIDER", "PHASE", "ROOT"], res.output
    assert rows[0][0] == "app" and rows[0][4] == "Ready", res.output

    config.write_text(json.dumps({**K8S_CONFIG, "display_name": "Renamed"}))
    res = await run("workspace", "config", "app", "--file", str(config))
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert (
        "re-applied Workspace CR 'app' (generation 2, not reconciled yet: phase Ready is of "
        "generation 1)" in said
    )
    assert cluster.kube.store.get(WORKSPACES, NS, "app")["spec"]["displayName"] == "Renamed"  # type: ignore[index]
    res = await run("workspace", "config", "app", "--file", str(config), "--provider", "x")
    assert res.exit_code != 0 and "--file replaces the whole config" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"sources": []}))
    res = await run("workspace", "add", "other", "--file", str(bad))
    assert res.exit_code != 0 and "at least one source" in res.output, res.output
    res = await run("workspace", "add", "-o", "json", "app2", "--file", str(config))
    assert json.loads(res.stdout)["reconcile"]["phase"] == "Pending", res.output

    res = await run("workspace", "rm", "app2")
    assert res.exit_code == 0, res.output
    assert cluster.kube.store.get(WORKSPACES, NS, "app2") is None


@pytest.mark.usefixtures("kubectl_present")
async def test_daily_caps_of_a_k8s_workspace_are_annotations_of_its_cr(
    cluster: Cluster, make_stack: StackFactory, tmp_path: Path
) -> None:
    # The daily caps (issue 15) are Prospero's, not the CRD's: they ride as annotations of the
    # Workspace CR, owned by field manager prospero, read back into the registry's config.
    stack = await k8s_stack(make_stack, cluster)
    kubectl = kubectl_for(cluster, tmp_path / "kubectl")
    caps = {"daily_budget_usd": 0.5, "daily_budget_tokens": 20000}
    r = await stack.client.post(
        "/api/workspaces", json={"name": "app", "config": {**K8S_CONFIG, **caps}}
    )
    assert r.status_code == 202, r.text
    cr = (await cr_items(kubectl))["app"]
    assert cr["metadata"]["annotations"] == {
        f"prospero.{G.removeprefix('caliban.')}/daily-budget-usd": "0.5",
        f"prospero.{G.removeprefix('caliban.')}/daily-budget-tokens": "20000",
    }
    assert "dailyBudgetUsd" not in json.dumps(cr["spec"])
    ws = await wait_ready(stack, "app", 1)
    assert {k: ws["config"].get(k) for k in caps} == caps
    assert stack.runtime.manager is not None
    (reg,) = [w for w in stack.runtime.manager.list_workspaces() if w.name == "app"]
    assert (reg.config.daily_budget_usd, reg.config.daily_budget_tokens) == (0.5, 20000)
    # the same POST again is a no-op; another cap is a different config (409)
    r = await stack.client.post(
        "/api/workspaces", json={"name": "app", "config": {**K8S_CONFIG, **caps}}
    )
    assert r.status_code == 202, r.text
    r = await stack.client.post(
        "/api/workspaces", json={"name": "app", "config": {**K8S_CONFIG, "daily_budget_usd": 9}}
    )
    error(r, 409, "conflict", "another config")
    # a hand-edited cap that does not parse is ignored (logged); the other stays
    await kubectl.ok(
        "annotate",
        "workspace",
        "app",
        "-n",
        NS,
        "--overwrite",
        f"prospero.{G.removeprefix('caliban.')}/daily-budget-usd=lots",
    )

    async def usd_gone() -> bool:
        cfg = (await listed(stack))["app"]["config"]
        return cfg.get("daily_budget_usd") is None and cfg.get("daily_budget_tokens") == 20000

    await wait_until(usd_gone, 10, interval=0.05, what="the unparsable cap ignored")
    # a PUT without caps removes the ones Prospero owns; the one kubectl edited is kubectl's
    # now (server-side apply), so it stays, still ignored
    r = await stack.client.put("/api/workspaces/app/config", json=K8S_CONFIG)
    assert r.status_code == 202, r.text
    annotations = (await cr_items(kubectl))["app"]["metadata"].get("annotations") or {}
    assert annotations == {f"prospero.{G.removeprefix('caliban.')}/daily-budget-usd": "lots"}
    cfg = (await listed(stack))["app"]["config"]
    assert cfg.get("daily_budget_usd") is None and cfg.get("daily_budget_tokens") is None
    # bad caps are refused before anything is applied
    r = await stack.client.put(
        "/api/workspaces/app/config", json={**K8S_CONFIG, "daily_budget_usd": -1}
    )
    assert r.status_code == 422, r.text
