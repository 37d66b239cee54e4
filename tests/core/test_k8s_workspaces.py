"""K8sWorkspaces, the k8s config plane (issue 13), against the fake Kubernetes API server and its
fake operator: the Workspace CR a config becomes (exactly), forced server-side apply as field
manager `prospero` (managedFields), wholesale replacement, validation before the API server,
idempotent delete, status read back once the operator reconciles, and no Secret ever read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from prospero.core.errors import Conflict, FleetUnreachable, InvalidConfig, WorkspaceNotFound
from prospero.core.fleet.k8s import K8sFleet
from prospero.core.fleet.k8s_workspaces import K8sWorkspaces
from prospero.core.fleet.provider import WorkspaceAdmin
from prospero.testkit.fake_kube import FakeKube
from prospero.testkit.fake_kube.operator import WORKSPACES
from prospero.types.k8s import WorkspaceConfig
from tests.support import wait_until

NS = "default"
WORKSPACES_PATH = f"/apis/caliban.caliban-ai.dev/v1alpha1/namespaces/{NS}/workspaces"

CONFIG: dict[str, Any] = {
    "display_name": "The app",
    "sources": [
        {"name": "app", "repo": "https://git.example/app.git", "path": "/src/app"},
        {"name": "lib", "repo": "https://git.example/lib.git", "ref": "v2", "path": "/src/lib"},
    ],
    "providers": [
        {
            "name": "claude",
            "kind": "anthropic",
            "model": "claude-sonnet",
            "credentials_ref": {"secret_name": "anthropic-key", "key": "api-key"},
        },
        {"name": "local", "kind": "ollama", "base_url": "http://ollama:11434"},
    ],
    "default_provider": "claude",
    "env": {"RUST_LOG": "info", "CI": "1"},
    "isolation": {"runtime_class": "gvisor", "worktrees": "per-source"},
}

# what CONFIG is as a Workspace spec, key for key
SPEC: dict[str, Any] = {
    "displayName": "The app",
    "sources": [
        {"name": "app", "repo": "https://git.example/app.git", "ref": "main", "path": "/src/app"},
        {"name": "lib", "repo": "https://git.example/lib.git", "ref": "v2", "path": "/src/lib"},
    ],
    "providers": [
        {
            "name": "claude",
            "kind": "anthropic",
            "model": "claude-sonnet",
            "credentialsRef": {"secretName": "anthropic-key", "key": "api-key"},
        },
        {"name": "local", "kind": "ollama", "baseUrl": "http://ollama:11434"},
    ],
    "defaultProvider": "claude",
    "env": [{"name": "CI", "value": "1"}, {"name": "RUST_LOG", "value": "info"}],
    "isolation": {"runtimeClass": "gvisor", "worktrees": "per-source"},
}


@dataclass
class Plane:
    kube: FakeKube
    admin: K8sWorkspaces

    def cr(self, name: str) -> dict[str, Any] | None:
        return self.kube.store.get(WORKSPACES, NS, name)

    async def ready(self, name: str, generation: int) -> None:
        async def reconciled() -> bool:
            view = await self.admin.get(name)
            assert view is not None
            s = view.status
            return s.phase == "Ready" and s.observed_generation == s.generation == generation

        await wait_until(reconciled, 5, interval=0.02, what=f"{name} Ready at {generation}")


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[Plane]:
    kube = FakeKube(operator=True)
    await kube.start()
    fleet = K8sFleet(NS, kube.write_kubeconfig(tmp_path))
    try:
        yield Plane(kube, K8sWorkspaces.for_fleet(fleet))
        # Prospero only names Secrets: nothing it did asked the API server for one (nor for
        # anything but the namespace's Workspaces)
        paths = [path.split("?")[0] for _method, path in kube.app.requests]
        assert not [p for p in paths if "secrets" in p], paths
        assert all(p.startswith(WORKSPACES_PATH) for p in paths), paths
    finally:
        await fleet.close()
        await kube.stop()


def config(**changes: Any) -> WorkspaceConfig:
    return WorkspaceConfig.model_validate({**CONFIG, **changes})


def test_k8s_workspaces_is_a_workspace_admin(plane: Plane) -> None:
    assert isinstance(plane.admin, K8sWorkspaces)
    admin: WorkspaceAdmin = plane.admin  # (mypy checks the seam)
    assert admin is plane.admin


async def test_apply_creates_exactly_the_spec_then_the_operator_reconciles(plane: Plane) -> None:
    accepted = await plane.admin.apply("app", config(), create=True)
    # answered at once: the operator has not written a status yet
    assert accepted.name == "app"
    assert accepted.status.phase == "Pending" and accepted.status.generation == 1
    assert accepted.status.observed_generation is None and not accepted.status.current
    cr = plane.cr("app")
    assert cr is not None
    assert cr["apiVersion"] == "caliban.caliban-ai.dev/v1alpha1" and cr["kind"] == "Workspace"
    assert cr["spec"] == SPEC
    # forced server-side apply as `prospero`: it owns the spec, the operator the status
    entries = {
        (m["manager"], m["operation"], m.get("subresource", "")): m
        for m in cr["metadata"]["managedFields"]
    }
    mine = entries[("prospero", "Apply", "")]
    assert set(mine["fieldsV1"]["f:spec"]) == {f"f:{k}" for k in SPEC}
    assert "f:status" not in mine["fieldsV1"]

    await plane.ready("app", 1)
    view = await plane.admin.get("app")
    assert view is not None
    assert view.display_name == "The app" and view.default_provider == "claude"
    assert [(s.name, s.ref) for s in view.sources] == [("app", "main"), ("lib", "v2")]
    assert [(p.name, p.has_credentials) for p in view.providers] == [
        ("claude", True),
        ("local", False),
    ]
    assert view.env == {"CI": "1", "RUST_LOG": "info"}
    assert "anthropic-key" not in view.model_dump_json()  # the Secret is a flag, never its name
    entries = {
        (m["manager"], m.get("subresource", ""))
        for m in plane.cr("app")["metadata"]["managedFields"]
    }  # type: ignore[index]
    assert ("caliban-operator", "status") in entries

    [registered] = await plane.admin.list_workspaces()
    assert (registered.name, registered.root) == ("app", "")
    assert [(s.name, s.path) for s in plane.admin.sources("app")] == [
        ("app", "/src/app"),
        ("lib", "/src/lib"),
    ]


async def test_a_replaced_config_removes_what_it_omits_and_is_reconciled_again(
    plane: Plane,
) -> None:
    await plane.admin.apply("app", config(), create=True)
    await plane.ready("app", 1)
    smaller = config(default_provider=None, env={}, isolation=None, display_name=None)
    smaller.sources = smaller.sources[:1] if smaller.sources else None
    accepted = await plane.admin.apply("app", smaller, create=False)
    assert accepted.status.generation == 2
    assert accepted.status.observed_generation == 1 and not accepted.status.current
    cr = plane.cr("app")
    assert cr is not None
    assert (
        cr["spec"]
        == {
            "displayName": "app",  # defaults to the workspace name
            "sources": SPEC["sources"][:1],
            "providers": SPEC["providers"],
        }
    )
    await plane.ready("app", 2)


async def test_the_apply_is_forced_over_another_field_manager(plane: Plane) -> None:
    await plane.admin.apply("app", config(), create=True)
    # someone else applies another display name (e.g. `kubectl apply --server-side`)
    other = {
        "apiVersion": "caliban.caliban-ai.dev/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": "app"},
        "spec": {"displayName": "Theirs"},
    }
    async with httpx.AsyncClient(base_url=plane.kube.url) as http:
        r = await http.patch(
            f"{WORKSPACES_PATH}/app",
            params={"fieldManager": "someone", "force": "true"},
            json=other,
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
    assert r.status_code == 200, r.text
    assert plane.cr("app")["spec"]["displayName"] == "Theirs"  # type: ignore[index]
    await plane.admin.apply("app", config(), create=False)  # no 409: forced
    cr = plane.cr("app")
    assert cr is not None and cr["spec"]["displayName"] == "The app"
    owners = {m["manager"]: m["fieldsV1"] for m in cr["metadata"]["managedFields"]}
    assert "f:displayName" in owners["prospero"]["f:spec"]
    assert "someone" not in owners  # it owned only the display name, now taken over


async def test_create_of_an_existing_workspace(plane: Plane) -> None:
    await plane.admin.apply("app", config(), create=True)
    rv = plane.cr("app")["metadata"]["resourceVersion"]  # type: ignore[index]
    again = await plane.admin.apply("app", config(), create=True)  # the same: a no-op
    assert again.status.generation == 1
    assert plane.cr("app")["metadata"]["resourceVersion"] == rv  # type: ignore[index]
    with pytest.raises(Conflict, match="exists with another config"):
        await plane.admin.apply("app", config(display_name="Other"), create=True)
    assert plane.cr("app")["spec"] == SPEC  # type: ignore[index]  # nothing lost
    with pytest.raises(WorkspaceNotFound):
        await plane.admin.apply("nope", config(), create=False)
    assert plane.cr("nope") is None


@pytest.mark.parametrize(
    ("name", "changes", "message"),
    [
        ("App_1", {}, "cannot name a Workspace CR"),
        ("app", {"sources": []}, "at least one source"),
        ("app", {"sources": None}, "at least one source"),
        ("app", {"providers": []}, "at least one provider"),
        ("app", {"default_provider": "gpt"}, "default_provider 'gpt' is not one of"),
        ("app", {"api_key_from_env": "ANTHROPIC_API_KEY"}, "api_key_from_env: local-backend"),
        ("app", {"provider": "anthropic"}, "provider: local-backend"),
        ("app", {"surprise": 1}, "unknown field"),
        (
            "app",
            {"providers": [{"name": "a", "kind": "x"}, {"name": "a", "kind": "y"}]},
            "provider name\\(s\\) used twice: a",
        ),
    ],
)
async def test_invalid_configs_are_refused_before_the_api_server(
    plane: Plane, name: str, changes: dict[str, Any], message: str
) -> None:
    cfg = WorkspaceConfig.model_validate({**CONFIG, **changes})
    before = len(plane.kube.app.requests)
    with pytest.raises(InvalidConfig, match=message):
        await plane.admin.apply(name, cfg, create=True)
    assert len(plane.kube.app.requests) == before  # nothing was sent
    assert plane.kube.store.items(WORKSPACES, NS) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"sources": [{"name": "app", "repo": "r"}]},  # no path
        {"sources": [{"name": "", "repo": "r", "path": "p"}]},
        {"sources": [{"name": "a", "repo": "r", "path": "p", "branch": "x"}]},
        {"providers": [{"name": "p"}]},  # no kind
        {"providers": [{"name": "p", "kind": "k", "credentials_ref": {"secret_name": "s"}}]},
        {"providers": [{"name": "p", "kind": "k", "api_key": "sk-..."}]},
        {"isolation": {"runtime_class": "gvisor", "sandbox": True}},
    ],
)
def test_the_config_models_forbid_unknown_keys_and_empty_names(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        WorkspaceConfig.model_validate({**CONFIG, **changes})


async def test_delete_is_idempotent(plane: Plane) -> None:
    await plane.admin.apply("app", config(), create=True)
    assert await plane.admin.delete("app") is True
    assert plane.cr("app") is None and await plane.admin.get("app") is None
    assert await plane.admin.delete("app") is False
    assert await plane.admin.views() == []


async def test_an_unreachable_api_server_is_fleet_unreachable(plane: Plane) -> None:
    await plane.kube.stop()
    with pytest.raises(FleetUnreachable):
        await plane.admin.views()
    with pytest.raises(FleetUnreachable):
        await plane.admin.apply("app", config(), create=True)
    plane.kube.app.requests.clear()


async def test_the_operator_reconciles_a_change_made_while_it_was_busy(tmp_path: Path) -> None:
    """The fake operator, like a controller's work queue, does not drop a spec change that
    lands while it is still stepping the Workspace (here: in its pause after writing Ready)."""
    kube = FakeKube(operator=True, step_delay=0.5)
    await kube.start()
    fleet = K8sFleet(NS, kube.write_kubeconfig(tmp_path))
    plane = Plane(kube, K8sWorkspaces.for_fleet(fleet))
    try:
        await plane.admin.apply("app", config(), create=True)
        await plane.ready("app", 1)  # the operator is now pausing after its Ready
        accepted = await plane.admin.apply("app", config(display_name="Renamed"), create=False)
        assert accepted.status.generation == 2
        await plane.ready("app", 2)
    finally:
        await fleet.close()
        await kube.stop()
