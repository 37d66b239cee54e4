"""deploy/: the kustomize overlays rendered by the real `kubectl kustomize` and dry-run applied
against the fake API server (built-in kinds, `dryRun=All`), the Role against the calls
K8sFleet really makes, the Deployment's flags against prosperod's own configuration loader, and
the Dockerfile's install steps (its two scripts) run here the way the image build runs them.
Docker is not on these machines; kubectl, uv and python3 must be (missing: the tests fail)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from prospero.core.fleet.k8s import K8sFleet
from prospero.core.fleet.k8s_workspaces import K8sWorkspaces
from prospero.core.fleet.records import AgentSpec
from prospero.daemon.config import load_config
from prospero.testkit.certs import make_certs
from prospero.testkit.fake_kube import FakeKube
from prospero.types.k8s import WorkspaceConfig
from prospero.types.model import RegisteredWorkspace
from prospero.types.tokens import Scope, add_token
from tests.kubectl import Kubectl
from tests.support import wait_until

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = ["standalone", "clustered"]
NS = "prospero"
KINDS = "deployments,services,serviceaccounts,roles,rolebindings,persistentvolumeclaims"
GROUP = "caliban.caliban-ai.dev"

# What Prospero does in its namespace, and so what the Role grants, per resource:
# - calibantasks, K8sFleet (core/fleet/k8s.py): get (one CR), list + watch (the cache), create
#   (a spawn creates the CR), patch (server-side apply: respawn; an apply that creates is
#   authorised as create too), delete (kill, rm, respawn);
# - workspaces, K8sWorkspaces (core/fleet/k8s_workspaces.py): get, list, create + patch (the
#   server-side apply of POST /api/workspaces and PUT .../config), delete. No watch.
# Nothing else: no update, no deletecollection, no status subresource, no other resource.
EXPECTED_VERBS = {
    "calibantasks": {"get", "list", "watch", "create", "patch", "delete"},
    "workspaces": {"get", "list", "create", "patch", "delete"},
}


WORKSPACE = WorkspaceConfig.model_validate(
    {
        "display_name": "The app",
        "sources": [{"name": "app", "repo": "https://git.example/app.git", "path": "/src/app"}],
        "providers": [
            {
                "name": "claude",
                "kind": "anthropic",
                "model": "claude-sonnet",
                "credentials_ref": {"secret_name": "anthropic-key", "key": "api-key"},
            }
        ],
        "default_provider": "claude",
    }
)


def tool(name: str, install: str) -> str:
    path = shutil.which(name)
    assert path is not None, f"{name} is missing: {install}"
    return path


async def render(tmp: Path, overlay: str) -> tuple[str, list[dict[str, Any]]]:
    out = await Kubectl(tmp)("kustomize", str(DEPLOY / "overlays" / overlay))
    assert out[0] == 0, f"kubectl kustomize {overlay}: {out[2]}"
    return out[1], [d for d in yaml.safe_load_all(out[1]) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[tuple[FakeKube, Kubectl]]:
    async with FakeKube() as fake:
        kubectl = Kubectl(tmp_path, fake.write_kubeconfig(tmp_path))
        # kubectl's `create namespace` sends protobuf; a manifest goes as JSON
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
        await kubectl.ok("apply", "-f", "-", stdin=json.dumps(ns).encode())
        yield fake, kubectl


def stored(fake: FakeKube) -> list[str]:
    """Every object the fake holds in the namespace (any kind)."""
    return sorted(f"{k[0][1]}/{k[2]}" for k in fake.store.objects if k[1] == NS)


# the overlays against the API server -------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
async def test_overlay_dry_run_stores_nothing_then_applies(
    overlay: str, tmp_path: Path, kube: tuple[FakeKube, Kubectl]
) -> None:
    fake, kubectl = kube
    manifest, docs = await render(tmp_path, overlay)
    names = {f"{d['kind']}/{d['metadata']['name']}" for d in docs}
    expected = {
        "ServiceAccount/prosperod",
        "Role/prosperod",
        "RoleBinding/prosperod",
        "Service/prosperod",
        "Deployment/prosperod",
    } | ({"PersistentVolumeClaim/prosperod-data"} if overlay == "standalone" else set())
    assert names == expected
    assert {d["metadata"]["namespace"] for d in docs} == {NS}

    rv = fake.store.rv
    out = await kubectl.ok("apply", "--dry-run=server", "-f", "-", stdin=manifest.encode())
    lines = out.strip().splitlines()
    assert len(lines) == len(docs) and all(
        line.endswith(" created (server dry run)") for line in lines
    ), out
    # nothing stored: no revision taken, no object, and kubectl finds none
    assert fake.store.rv == rv and stored(fake) == []
    rc, out, err = await kubectl("get", KINDS, "-n", NS, "-o", "name")
    assert rc == 0 and out == "", err

    out = await kubectl.ok("apply", "-f", "-", stdin=manifest.encode())
    assert all(line.endswith(" created") for line in out.strip().splitlines()), out
    out = await kubectl.ok("get", KINDS, "-n", NS, "-o", "name")
    assert len(out.split()) == len(docs)
    out = await kubectl.ok("apply", "-f", "-", stdin=manifest.encode())
    assert all(line.endswith(" unchanged") for line in out.strip().splitlines()), out

    deploy = json.loads(await kubectl.ok("get", "deploy", "prosperod", "-n", NS, "-o", "json"))
    assert deploy["metadata"]["generation"] == 1 and deploy["status"] == {}
    want = one(docs, "Deployment")["spec"]
    assert deploy["spec"]["replicas"] == want["replicas"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["args"] == want["template"]["spec"]["containers"][0]["args"]
    assert container["imagePullPolicy"] == "IfNotPresent"  # the apiserver's default, tag 0.1.0
    svc = json.loads(await kubectl.ok("get", "svc", "prosperod", "-n", NS, "-o", "json"))
    assert svc["spec"]["clusterIP"] and svc["spec"]["ports"][0]["targetPort"] == "http"


async def test_dry_run_patch_and_server_side_apply_change_nothing(
    tmp_path: Path, kube: tuple[FakeKube, Kubectl]
) -> None:
    fake, kubectl = kube
    manifest, docs = await render(tmp_path, "clustered")
    await kubectl.ok("apply", "-f", "-", stdin=manifest.encode())
    before = json.loads(await kubectl.ok("get", "deploy", "prosperod", "-n", NS, "-o", "json"))
    rv = fake.store.rv

    out = await kubectl.ok(
        "patch", "deploy", "prosperod", "-n", NS, "--dry-run=server", "--type=merge",
        "-p", '{"spec":{"replicas":7}}', "-o", "json",
    )  # fmt: skip
    answered = json.loads(out)
    # the object as it would be stored: the new replicas, the current resourceVersion
    assert answered["spec"]["replicas"] == 7 and answered["metadata"]["generation"] == 2
    assert answered["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]

    changed = one(docs, "Deployment")
    changed["spec"]["replicas"] = 5
    out = await kubectl.ok(
        "apply", "--server-side", "--force-conflicts", "--dry-run=server", "-f", "-",
        stdin=json.dumps(changed).encode(),
    )  # fmt: skip
    assert out.strip() == "deployment.apps/prosperod serverside-applied (server dry run)"
    out = await kubectl.ok("delete", "deploy", "prosperod", "-n", NS, "--dry-run=server")
    assert out.strip() == 'deployment.apps "prosperod" deleted (server dry run)'

    assert fake.store.rv == rv
    after = json.loads(await kubectl.ok("get", "deploy", "prosperod", "-n", NS, "-o", "json"))
    assert after == before


async def test_dry_run_refuses_what_the_apiserver_refuses(
    tmp_path: Path, kube: tuple[FakeKube, Kubectl]
) -> None:
    fake, kubectl = kube
    _, docs = await render(tmp_path, "standalone")
    deploy = one(docs, "Deployment")

    typo = json.loads(json.dumps(deploy))
    typo["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    rc, _, err = await kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(typo).encode())
    assert rc == 1
    assert (
        'strict decoding error: unknown field "spec.template.spec.containers[0].livenesProbe"'
        in err
    )

    stray = json.loads(json.dumps(deploy))
    stray["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    stray["spec"]["template"]["spec"]["containers"][0]["volumeMounts"].append(
        {"name": "nope", "mountPath": "/nope"}
    )
    rc, _, err = await kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(stray).encode())
    assert rc == 1
    assert 'The Deployment "prosperod" is invalid' in err
    assert "spec.template.metadata.labels: Invalid value" in err
    assert "`selector` does not match template `labels`" in err
    assert 'containers[0].volumeMounts[4].name: Not found: "nope"' in err

    binding = json.loads(json.dumps(one(docs, "RoleBinding")))
    binding["roleRef"]["kind"] = "Secret"
    rc, _, err = await kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(binding).encode())
    assert rc == 1 and 'roleRef.kind: Unsupported value: "Secret"' in err
    assert stored(fake) == []


# RBAC --------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
async def test_the_role_grants_exactly_the_verbs_k8sfleet_uses(overlay: str, tmp_path: Path) -> None:
    _, docs = await render(tmp_path, overlay)
    role = one(docs, "Role")
    granted: dict[str, set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}  # no resourceNames, no URLs
        assert rule["apiGroups"] == [GROUP]
        assert len(set(rule["verbs"])) == len(rule["verbs"])
        for res in rule["resources"]:
            assert res not in granted, f"{res} granted twice"
            granted[res] = set(rule["verbs"])
    assert granted == EXPECTED_VERBS
    # nothing on secrets (Prospero names them, the kubelet mounts them), nothing cluster-wide
    assert "secrets" not in json.dumps(role["rules"])
    assert not {d["kind"] for d in docs} & {"ClusterRole", "ClusterRoleBinding"}
    binding = one(docs, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "prosperod"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "prosperod", "namespace": NS}]
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "prosperod"


def _verbs(requests: list[tuple[str, str]]) -> dict[str, set[str]]:
    """The RBAC verbs of the requests, per resource (an apply is patch and, when it creates,
    create: the first apply of each name here creates)."""
    verbs: dict[str, set[str]] = {}
    for method, target in requests:
        path, _, query = target.partition("?")
        parts = path.strip("/").split("/")
        if "namespaces" not in parts:
            assert method == "GET" and len(parts) <= 3, target  # discovery, never a write
            continue
        assert path.startswith(f"/apis/{GROUP}/v1alpha1/namespaces/default/"), target
        rest = parts[5:]  # [resource, name?, subresource?]
        assert len(rest) <= 2, f"a subresource: {target}"
        got = verbs.setdefault(rest[0], set())
        item = len(rest) == 2
        if method == "GET":
            got.add("get" if item else ("watch" if "watch=" in query else "list"))
        elif method == "PATCH":
            got |= {"patch", "create"}
        else:
            got.add({"DELETE": "delete" if item else "deletecollection", "PUT": "update", "POST": "create"}[method])
    return verbs


async def test_prospero_calls_exactly_what_the_role_grants(tmp_path: Path) -> None:
    """Drive every K8sFleet and K8sWorkspaces operation that reaches the API server and read
    the verbs back from the requests the fake served."""
    ws = RegisteredWorkspace(name="app", root="")
    async with FakeKube(operator=True) as fake:
        fleet = K8sFleet("default", fake.write_kubeconfig(tmp_path), poll_interval=0.02, restart_timeout=5)
        try:
            spec = AgentSpec(prompt="long task")
            spawned = await fleet.spawn(ws, spec)
            await wait_until(
                lambda: _listed(fleet, ws, spawned.id), 5.0, interval=0.02, what="the CR listed"
            )
            await wait_until(lambda: fleet.cache.ready, 5.0, interval=0.02, what="the watch")
            await fleet.get_task(ws, spawned.id)
            await fleet.respawn(ws, spawned.id)
            await fleet.kill(ws, spawned.id)
            other = await fleet.spawn(ws, AgentSpec(prompt="other"))
            await fleet.remove(ws, other.id, force=True)
            workspaces = K8sWorkspaces.for_fleet(fleet)
            await workspaces.apply("app", WORKSPACE, create=True)
            await workspaces.apply("app", WORKSPACE.model_copy(update={"display_name": "x"}), create=False)
            assert [w.name for w in await workspaces.list_workspaces()] == ["app"]
            await workspaces.views()
            assert await workspaces.get("app") is not None
            assert await workspaces.delete("app") is True
        finally:
            await fleet.close()
        assert _verbs(fake.app.requests) == EXPECTED_VERBS


async def _listed(fleet: K8sFleet, ws: RegisteredWorkspace, agent_id: str) -> bool:
    return agent_id in {r.id for r in await fleet.list_agents(ws)}


# the Deployment's flags, read by prosperod's own loader --------------------------------------


def _container_config(doc: dict[str, Any], tmp: Path) -> tuple[list[str], dict[str, str]]:
    """The container's args and environment as the kubelet would give them, with each volume
    mount moved under tmp and the Secrets' files written there."""
    pod = doc["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    mounts = {m["mountPath"]: tmp / "mnt" / m["name"] for m in c["volumeMounts"]}

    def moved(value: str) -> str:
        for path in sorted(mounts, key=len, reverse=True):
            if value == path or value.startswith(path + "/"):
                return str(mounts[path]) + value[len(path):]
        return value

    for d in mounts.values():
        d.mkdir(parents=True, exist_ok=True)
    add_token(mounts["/etc/prospero/api"] / "api-tokens", "ops", Scope.admin)
    certs = make_certs()
    (mounts["/etc/prospero/caliband"] / "ca.crt").write_bytes(certs.ca_pem)
    (mounts["/etc/prospero/caliband"] / "token").write_text("pod-token\n")
    fields = {"metadata.namespace": NS, "metadata.name": "prosperod-5d9c7b9f4-x2x7q"}
    secrets = {("prosperod-database", "url"): "postgresql://prospero:pw@db:5432/prospero"}
    env: dict[str, str] = {"HOME": str(tmp)}
    for e in c.get("env") or []:
        if "value" in e:
            value = e["value"]
            for k, v in env.items():
                value = value.replace(f"$({k})", v)
            env[e["name"]] = value
        elif "fieldRef" in e["valueFrom"]:
            env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = secrets[(ref["name"], ref["key"])]
    args = [moved(a.split("=", 1)[0]) + "=" + moved(a.split("=", 1)[1]) if "=" in a else a for a in c["args"]]
    return args, env


@pytest.mark.parametrize("overlay", OVERLAYS)
async def test_prosperod_accepts_the_deployments_flags(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, docs = await render(tmp_path, overlay)
    deploy = one(docs, "Deployment")
    async with FakeKube() as fake:
        kubeconfig = fake.write_kubeconfig(tmp_path)
        args, env = _container_config(deploy, tmp_path)
        # lightkube reads its default configuration from the process environment (in the pod:
        # the service account; here: the fake's kubeconfig)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        cfg = load_config(args, env)
    assert cfg.fleet_backend == "k8s" and cfg.k8s.namespace == NS
    assert cfg.bind_host == "0.0.0.0" and cfg.k8s.caliband_security is not None
    assert f"prosperod.{NS}.svc" in cfg.allowed_hosts
    pod = deploy["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    probes = pod["containers"][0]
    assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
    volumes = {v["name"]: v for v in pod["volumes"]}
    if overlay == "standalone":
        assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"] == {"type": "Recreate"}
        assert volumes["data"] == {"name": "data", "persistentVolumeClaim": {"claimName": "prosperod-data"}}
        assert cfg.database_url is None
    else:
        assert deploy["spec"]["replicas"] > 1
        assert cfg.database_url == "postgresql://prospero:pw@db:5432/prospero"
        assert cfg.replica_id == "prosperod-5d9c7b9f4-x2x7q"
        assert volumes["session-key"]["secret"]["secretName"] == "prosperod-session-key"


# the Dockerfile's install steps --------------------------------------------------------------


def test_the_dockerfile_install_steps_give_working_commands(tmp_path: Path) -> None:
    """deploy/Dockerfile runs deploy/docker/build-wheel.sh in its build stage and
    install-venv.sh in its runtime stage; run both here (machine's uv and python3)."""
    tool("uv", "see README: uv is how the project is built")
    tool("python3", "a Python >= 3.11 on PATH")
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "RUN build-wheel.sh /src /dist" in dockerfile
    assert "RUN --mount=from=uv,source=/uv,target=/usr/local/bin/uv \\\n    install-venv.sh /tmp/dist /opt/prospero" in dockerfile
    assert "USER 10001:10001" in dockerfile and 'ENTRYPOINT ["prosperod"]' in dockerfile
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)
    dist, venv = tmp_path / "dist", tmp_path / "venv"
    for script, args in (("build-wheel.sh", [REPO, dist]), ("install-venv.sh", [dist, venv])):
        done = subprocess.run(
            ["sh", str(DEPLOY / "docker" / script), *map(str, args)],
            capture_output=True, text=True, env=env, timeout=240, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{script}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    wheels = [p.name for p in dist.glob("*.whl")]
    assert wheels == ["prospero_fleet-0.1.0-py3-none-any.whl"]
    for cmd, first in (("prosperod", "usage: prosperod"), ("prospero", "Usage: prospero")):
        done = subprocess.run(
            [str(venv / "bin" / cmd), "--help"], capture_output=True, text=True,
            env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "100"},
            timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert first in done.stdout
        assert cmd == "prospero" or "--fleet-backend" in done.stdout
    # the venv runs the installed wheel, not this checkout
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import prospero; print(prospero.__file__)"],
        capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path,
    )  # fmt: skip
    assert where.stdout.strip().startswith(str(venv)), where.stdout
    assert sys.prefix != str(venv)
