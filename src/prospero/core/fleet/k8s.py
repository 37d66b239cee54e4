"""K8sFleet: the FleetProvider for an in-cluster fleet of `CalibanTask` CRs (caliband-wire.md §8,
prospero-surface.md §5, issue 13).

One CalibanTask ⇒ one pod ⇒ one caliband ⇒ at most one agent. Prospero's agent id is the CR
name (`ct-<16 hex>`, `wire.k8s.task_name`); caliband's own id inside the pod is looked up on
demand and never leaves this module.

- `list_agents(ws)`: the CRs whose `spec.workspaceRef.name` is the workspace, each decoded on its
  own (a skewed CR is skipped and counted: `skipped_crs`, `skipped_total`), status from
  `status.phase` (§8.2), then overlaid with the pod's truth: one caliband `list` per distinct
  `calibandEndpoint` of a Running CR, bounded by `overlay_timeout` (750 ms), whose record
  supplies `status` and `interactive`; a failed dial keeps the CR-derived status, and a terminal
  status the pod reported stays settled for that CR incarnation.
- `spawn`: server-side apply (field manager `prospero`, forced) of the CR named from
  (workspace, prompt, label); returns at once with `created` telling whether the CR is new.
  `spec.task.driveProtocol` is always written (read back as `ndjson` when absent),
  `permissionPosture` when one is given, `interactive` only when true.
- `attach`: the CR must be Running with an endpoint; dial the pod caliband (TLS + token from
  files), `list`, spawn from the CR when the pod is empty, `attach` that agent → its Endpoint.
- `kill` / `remove` = delete the CR (the operator tears the pod down); `respawn` = delete, wait
  (bounded) until it is gone, re-apply the same name: the agent id does not change.

Library: lightkube. It is asyncio-native over httpx2 (httpx's successor: the same client model as
the httpx this project already uses), typed (`py.typed`), loads kubeconfig files and in-cluster
service-account config, handles CRDs as generic resources without generated code, and makes
server-side apply a first-class call (`PatchType.APPLY`, `field_manager`, `force`); it is
maintained (1.0, 2026). kubernetes_asyncio would bring aiohttp and a large generated OpenAPI
client for a handful of calls on two custom resources.

Every Kubernetes or connection error is translated here into Prospero's errors
(`_translate`); no lightkube or httpx exception crosses this module's boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, NoReturn

import httpx2
from lightkube import ApiError, AsyncClient, ConfigError, KubeConfig, LoadResourceError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

from prospero.core.aio import wait_for
from prospero.core.caliband_client import CalibandClient
from prospero.core.errors import (
    AgentNotFound,
    Conflict,
    InvalidConfig,
    InvalidState,
    NotFound,
    ProsperoError,
    ProtocolError,
    TransportError,
)
from prospero.core.transport import NetworkSecurity
from prospero.core.wire.control import AgentRecord, Endpoint, SpawnedReply, SpawnSpec, TcpEndpoint
from prospero.core.wire.k8s import (
    FIELD_MANAGER,
    GROUP,
    TASK_KIND,
    TASK_PLURAL,
    VERSION,
    CalibanTask,
    CalibanTaskSpec,
    ObjectMeta,
    TaskBody,
    WorkspaceRef,
    decode_items,
    phase_to_status,
    task_name,
)
from prospero.types.model import AgentStatus, Posture, RegisteredWorkspace

log = logging.getLogger(__name__)

CalibanTaskResource = create_namespaced_resource(GROUP, VERSION, TASK_KIND, TASK_PLURAL)

# An AgentRecord needs an endpoint; a CR's per-agent endpoint is only known once `attach` has
# asked the pod's caliband, so listings carry this placeholder (drivers resolve via `attach`).
UNRESOLVED = TcpEndpoint(addr="")


class K8sSpawned(SpawnedReply):
    """`spawned`, plus whether the CR is new (False: an identical spawn hit the existing CR)."""

    created: bool = True


def validate_endpoint(addr: str) -> None:
    """`status.calibandEndpoint` must be a bare `host:port`."""
    if not addr.strip():
        raise InvalidConfig("CalibanTask status.calibandEndpoint is empty")
    if "://" in addr:
        raise InvalidConfig(f"CalibanTask status.calibandEndpoint must be a bare host:port, not a URL: {addr!r}")
    if any(c.isspace() for c in addr):
        raise InvalidConfig(f"CalibanTask status.calibandEndpoint contains whitespace: {addr!r}")


def spec_from_task(task: CalibanTask) -> SpawnSpec:
    """The SpawnSpec a CR stands for (§8.3 step 2): what the pod's caliband is asked to run."""
    status = task.status
    provider = status.resolved_workspace.provider if status and status.resolved_workspace else None
    return SpawnSpec(
        label=task.name,
        initial_prompt=task.spec.task.prompt,
        provider=provider.kind if provider else None,
        model=provider.model if provider else None,
        tool_allowlist=task.spec.tools,
        isolation_worktree=False,
        inherit_hooks=True,
        interactive=bool(task.spec.task.interactive),
        drive_protocol=task.drive_protocol,
    )


def _incarnation(task: CalibanTask) -> str:
    """One run of a CR name: a re-applied CR (respawn) is a new object with a new uid."""
    return task.metadata.uid or task.metadata.creation_timestamp or ""


def record_from_task(task: CalibanTask) -> AgentRecord:
    return AgentRecord(
        id=task.name,
        name=task.name,
        status=phase_to_status(task.phase),
        started_at=task.metadata.creation_timestamp or "",
        session_dir="",
        endpoint=UNRESOLVED,
        spec=spec_from_task(task),
    )


def _translate(e: BaseException, what: str, name: str | None = None) -> NoReturn:
    """A lightkube/httpx failure as one of Prospero's errors (chained, never leaked)."""
    if isinstance(e, ApiError):
        code = e.status.code or 0
        msg = e.status.message or e.status.reason or str(e)
        if code == 404:
            if name is not None:
                raise AgentNotFound(name) from e
            raise NotFound(f"Kubernetes API: {msg} ({what})") from e
        if code in (409, 410):
            raise Conflict(f"Kubernetes API refused to {what}: {msg}") from e
        if code in (401, 403):
            raise TransportError(f"Kubernetes API denied {what} (HTTP {code}; check RBAC/credentials): {msg}") from e
        if 400 <= code < 500:
            raise ProtocolError(f"Kubernetes API rejected {what} (HTTP {code}): {msg}") from e
        raise TransportError(f"Kubernetes API failed to {what} (HTTP {code}): {msg}") from e
    if isinstance(e, ConfigError | LoadResourceError):
        raise InvalidConfig(f"Kubernetes client configuration: {e}") from e
    if isinstance(e, httpx2.HTTPError | OSError | TimeoutError):
        raise TransportError(f"Kubernetes API unreachable ({what}): {e or type(e).__name__}") from e
    raise ProtocolError(f"Kubernetes client failed to {what}: {e!r}") from e


@contextlib.contextmanager
def _kube_errors(what: str, name: str | None = None) -> Iterator[None]:
    try:
        yield
    except ProsperoError:
        raise
    except (ApiError, ConfigError, LoadResourceError, httpx2.HTTPError, OSError, TimeoutError, ValueError) as e:
        _translate(e, what, name)


class K8sFleet:
    name = "k8s"

    def __init__(
        self,
        namespace: str = "default",
        kubeconfig: str | Path | None = None,
        *,
        in_cluster: bool = False,
        context: str | None = None,
        caliband_ca_file: str | Path | None = None,
        caliband_token_file: str | Path | None = None,
        caliband_server_name: str = "caliband",
        caliband_security: NetworkSecurity | None = None,
        request_timeout: float = 10.0,
        overlay_timeout: float = 0.75,
        restart_timeout: float = 30.0,
        poll_interval: float = 0.25,
    ) -> None:
        """`kubeconfig` (a file) or `in_cluster` (the pod's service account); neither: the
        environment's default (`KUBECONFIG`, `~/.kube/config`, then in-cluster). The pod
        calibands are dialled with the CA and token files (both unset: plaintext, fakes only)."""
        self.namespace = namespace
        try:
            if kubeconfig is not None:
                self._config = KubeConfig.from_file(kubeconfig)
            elif in_cluster:
                self._config = KubeConfig.from_service_account()
            else:
                self._config = KubeConfig.from_env()
        except (ConfigError, OSError, ValueError) as e:
            raise InvalidConfig(f"cannot load Kubernetes configuration: {e}") from e
        self._context = context
        if caliband_security is None and (caliband_ca_file or caliband_token_file):
            try:
                caliband_security = NetworkSecurity.from_files(
                    caliband_ca_file, caliband_token_file, caliband_server_name
                )
            except OSError as e:
                raise InvalidConfig(f"cannot read the pod caliband TLS/token files: {e}") from e
        self._security = caliband_security
        self.request_timeout = request_timeout
        self.overlay_timeout = overlay_timeout
        self.restart_timeout = restart_timeout
        self.poll_interval = poll_interval
        self._client: AsyncClient | None = None
        self._attach_locks: dict[str, asyncio.Lock] = {}
        # CR name -> (incarnation, terminal status its pod reported): see `_overlay`
        self._settled: dict[str, tuple[str, AgentStatus]] = {}
        self._all_names: set[str] = set()
        # CRs that do not decode (schema skew): skipped by the last listing, and ever
        self.skipped_crs = 0
        self.skipped_total = 0

    # --- plumbing -------------------------------------------------------------------------

    def _api(self) -> AsyncClient:
        if self._client is None:
            with _kube_errors("configure the client"):
                config = self._config.get(context_name=self._context)
                self._client = AsyncClient(
                    config,
                    namespace=self.namespace,
                    timeout=httpx2.Timeout(self.request_timeout),
                    field_manager=FIELD_MANAGER,
                )
        return self._client

    def security(self, ws: RegisteredWorkspace) -> NetworkSecurity | None:
        return self._security

    async def _list_tasks(self) -> list[CalibanTask]:
        raw: list[dict[str, Any]] = []
        with _kube_errors("list CalibanTasks"):
            async for obj in self._api().list(CalibanTaskResource, namespace=self.namespace):
                raw.append(obj.to_dict())  # type: ignore[no-untyped-call]
        tasks, skipped = decode_items(CalibanTask, raw)
        self.skipped_crs = skipped
        self.skipped_total += skipped
        return tasks

    async def _get_task(self, name: str) -> CalibanTask | None:
        try:
            with _kube_errors(f"get CalibanTask {name}", name):
                obj = await self._api().get(CalibanTaskResource, name, namespace=self.namespace)
        except AgentNotFound:
            return None
        tasks, skipped = decode_items(CalibanTask, [obj.to_dict()])  # type: ignore[no-untyped-call]
        if not tasks:
            self.skipped_total += skipped
            raise ProtocolError(f"CalibanTask {name} does not match this Prospero's CRD mirror")
        return tasks[0]

    async def _task_of(self, ws: RegisteredWorkspace, agent_id: str) -> CalibanTask:
        task = await self._get_task(agent_id)
        if task is None or task.spec.workspace_ref.name != ws.name:
            raise AgentNotFound(agent_id)
        return task

    async def _apply(self, task: CalibanTask) -> None:
        with _kube_errors(f"apply CalibanTask {task.name}"):
            await self._api().patch(
                CalibanTaskResource,
                task.name,
                task.apply_body(),
                namespace=self.namespace,
                patch_type=PatchType.APPLY,
                field_manager=FIELD_MANAGER,
                force=True,
            )

    async def _delete(self, agent_id: str) -> None:
        """Idempotent: a CR already gone (deleted meanwhile) is not an error. Callers check that
        the agent exists first (`_task_of`), so an unknown id is still AgentNotFound."""
        with contextlib.suppress(AgentNotFound), _kube_errors(f"delete CalibanTask {agent_id}", agent_id):
            await self._api().delete(CalibanTaskResource, agent_id, namespace=self.namespace)

    def _pod(self, task: CalibanTask, timeout: float | None = None) -> CalibandClient:
        addr = task.status.caliband_endpoint if task.status else None
        if task.phase != "Running" or not addr:
            raise InvalidState(
                "attach",
                task.name,
                phase_to_status(task.phase).value,
                "its CalibanTask is not Running with a calibandEndpoint yet",
            )
        validate_endpoint(addr)
        return CalibandClient(
            TcpEndpoint(addr=addr), self._security, timeout=timeout or self.request_timeout
        )

    # --- FleetProvider ----------------------------------------------------------------------

    async def list_agents(self, ws: RegisteredWorkspace) -> list[AgentRecord]:
        every = await self._list_tasks()
        self._all_names = {t.name for t in every}
        tasks = [t for t in every if t.spec.workspace_ref.name == ws.name]
        records = [record_from_task(t) for t in tasks]
        await self._overlay(tasks, records)
        return records

    async def _overlay(self, tasks: list[CalibanTask], records: list[AgentRecord]) -> None:
        """Pod truth over the CR's perpetual `Running` (§8.2): one bounded `list` per endpoint.

        A terminal status the pod reported is kept for that CR incarnation (its uid): the CR's
        `Running` must not un-settle it once the pod is gone or unreachable."""
        by_endpoint: dict[str, list[int]] = {}
        for i, t in enumerate(tasks):
            settled = self._settled.get(t.name)
            if settled is not None and settled[0] == _incarnation(t):
                records[i].status = settled[1]
                continue
            addr = t.status.caliband_endpoint if t.status else None
            if t.phase == "Running" and addr:
                by_endpoint.setdefault(addr, []).append(i)
        for gone in [n for n in self._settled if n not in self._all_names]:
            del self._settled[gone]  # its CR was deleted
        if not by_endpoint:
            return

        async def pod_list(addr: str) -> list[AgentRecord] | None:
            try:
                validate_endpoint(addr)
                client = CalibandClient(TcpEndpoint(addr=addr), self._security, timeout=self.overlay_timeout)
                return await wait_for(client.list(), self.overlay_timeout)
            except (ProsperoError, TimeoutError) as e:
                log.debug("pod caliband at %s not listed: %s", addr, e)
                return None

        addrs = list(by_endpoint)
        listings = await asyncio.gather(*(pod_list(a) for a in addrs))
        for addr, pod in zip(addrs, listings, strict=True):
            if not pod:
                continue
            for i in by_endpoint[addr]:
                mine = next((r for r in pod if r.name == tasks[i].name), pod[0])
                rec = records[i]
                rec.status = mine.status
                rec.spec.interactive = mine.spec.interactive
                if mine.status.terminal:
                    self._settled[tasks[i].name] = (_incarnation(tasks[i]), mine.status)

    async def spawn(
        self, ws: RegisteredWorkspace, spec: SpawnSpec, *, posture: Posture | None = None
    ) -> K8sSpawned:
        name = task_name(ws.name, spec.initial_prompt, spec.label)
        existed = await self._get_task(name) is not None
        task = CalibanTask(
            metadata=ObjectMeta(name=name, namespace=self.namespace),
            spec=CalibanTaskSpec(
                workspace_ref=WorkspaceRef(name=ws.name),
                task=TaskBody(
                    prompt=spec.initial_prompt,
                    interactive=True if spec.interactive else None,
                    drive_protocol=spec.drive_protocol,
                    permission_posture=posture,
                ),
                tools=spec.tool_allowlist,
            ),
        )
        await self._apply(task)
        return K8sSpawned(id=name, endpoint=UNRESOLVED, created=not existed)

    async def attach(self, ws: RegisteredWorkspace, agent_id: str) -> Endpoint:
        task = await self._task_of(ws, agent_id)
        client = self._pod(task)
        lock = self._attach_locks.setdefault(agent_id, asyncio.Lock())
        async with lock:  # two attaches must not both find the pod empty and both spawn
            records = await client.list()
            live = [r for r in records if not r.status.terminal]
            if live:
                pod_id = live[0].id
            elif records:
                raise InvalidState(
                    "attach", agent_id, records[0].status.value, "the pod's agent has ended"
                )
            else:
                pod_id = (await client.spawn(spec_from_task(task))).id
        return await client.attach(pod_id)

    async def kill(self, ws: RegisteredWorkspace, agent_id: str) -> None:
        await self._task_of(ws, agent_id)
        await self._delete(agent_id)

    async def remove(self, ws: RegisteredWorkspace, agent_id: str, force: bool = False) -> None:
        """Delete the CR whatever its phase: there is no record to keep once it is gone."""
        await self._task_of(ws, agent_id)
        await self._delete(agent_id)

    async def respawn(self, ws: RegisteredWorkspace, agent_id: str) -> str:
        """§8.3 restart: delete, wait until the CR is gone, re-apply the same name (empty status)."""
        task = await self._task_of(ws, agent_id)
        await self._delete(agent_id)
        async for _ in self._polls(self.restart_timeout):
            if await self._get_task(agent_id) is None:
                break
        else:
            raise Conflict(
                f"CalibanTask {agent_id} still exists {self.restart_timeout:g}s after its deletion"
            )
        fresh = CalibanTask(
            metadata=ObjectMeta(name=agent_id, namespace=self.namespace), spec=task.spec
        )
        await self._apply(fresh)
        return agent_id

    async def _polls(self, timeout: float) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            yield
            if loop.time() >= deadline:
                return
            await asyncio.sleep(self.poll_interval)

    async def restart(self, ws: RegisteredWorkspace) -> None:
        """Nothing to do: the operator reconciles a changed Workspace CR itself."""

    async def forget(self, ws_name: str) -> None:
        """Nothing cached per workspace."""

    async def get_task(self, ws: RegisteredWorkspace, agent_id: str) -> CalibanTask:
        """The agent's CR as this mirror reads it: where the drive protocol
        (`task.drive_protocol`, absent ⇒ ndjson) and posture are read back from."""
        return await self._task_of(ws, agent_id)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
