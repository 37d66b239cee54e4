"""K8sFleet: the FleetProvider for an in-cluster fleet of `CalibanTask` CRs (caliband-wire.md §8,
prospero-surface.md §5, issue 13).

One CalibanTask ⇒ one pod ⇒ one caliband ⇒ at most one agent. Prospero's agent id is the CR
name (`ct-<16 hex>`, `wire.k8s.task_name`); caliband's own id inside the pod is looked up on
demand and never leaves this module.

- `list_agents(ws)`: the CRs whose `spec.workspaceRef.name` is the workspace, read from the
  namespace's `TaskCache` (one list + watch loop, started by the first listing, stopped by
  `close`; a direct LIST only until it has listed, while its watch fails, or when it has not
  echoed this provider's own write within `sync_wait`), each decoded on its
  own (a skewed CR is skipped and counted: `skipped_crs`, `skipped_total`), status from
  `status.phase` (§8.2), then overlaid with the pod's truth: one caliband `list` per distinct
  `calibandEndpoint` of a Running CR, bounded by `overlay_timeout` (750 ms), whose record
  supplies `status` and `interactive`; a failed dial keeps the CR-derived status, and a terminal
  status the pod reported stays settled for that CR incarnation.
- `spawn`: create (POST) the CR named from (workspace, prompt, label), then server-side
  apply it (field manager `prospero`, forced); returns at once with `created`: the POST made
  it (a 409 AlreadyExists: it existed), so of concurrent identical spawns exactly one says so.
  `spec.task.driveProtocol` is always written (read back as `ndjson` when absent),
  `permissionPosture` when the spec has a posture, `interactive` only when true.
- `attach`: the CR must be Running with an endpoint; dial the pod caliband (TLS + token from
  files), `list`, spawn from the CR when the pod is empty, `attach` that agent → its address.
- `kill` / `remove` = delete the CR (the operator tears the pod down); `respawn` = delete, wait
  (bounded) until it is gone, re-apply the same name: the agent id does not change.

Library: lightkube. It is asyncio-native over httpx2 (httpx's successor: the same client model as
the httpx this project already uses), typed (`py.typed`), loads kubeconfig files and in-cluster
service-account config, handles CRDs as generic resources without generated code, and makes
server-side apply a first-class call (`PatchType.APPLY`, `field_manager`, `force`); it is
maintained (1.0, 2026). kubernetes_asyncio would bring aiohttp and a large generated OpenAPI
client for a handful of calls on two custom resources.

The seam's types are built straight from the CRs (`k8s_records.py`: a CR lists as a
`ListedAgent` with no address yet; the pod's caliband listing is translated there too), and
every Kubernetes or connection error is translated into Prospero's errors (`k8s_tasks.py`:
`translate_kube_error`; the API server or a pod caliband out of reach: `FleetUnreachable`); no
lightkube, httpx or caliband wire type crosses this module's boundary. The list + watch cache
is `k8s_tasks.TaskCache`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import yaml  # lightkube's own dependency: a malformed kubeconfig raises its errors
from lightkube import ApiError, AsyncClient, ConfigError, KubeConfig
from lightkube.types import PatchType

from prospero.core.aio import wait_for
from prospero.core.caliband_client import CalibandClient
from prospero.core.errors import (
    AgentNotFound,
    Conflict,
    FleetUnreachable,
    InvalidConfig,
    InvalidState,
    ProsperoError,
    ProtocolError,
    TransportError,
)
from prospero.core.fleet.k8s_records import (
    incarnation,
    listed_from_task,
    pod_spawn_spec,
    task_for_spawn,
    validate_endpoint,
    with_pod_truth,
)
from prospero.core.fleet.k8s_tasks import CalibanTaskResource, TaskCache, kube_errors
from prospero.core.fleet.provider import ChangeListener
from prospero.core.fleet.records import AgentSpec, ListedAgent, SpawnOutcome
from prospero.core.transport import Address, NetworkSecurity, address_of
from prospero.core.wire.control import AgentRecord, TcpEndpoint
from prospero.core.wire.k8s import (
    FIELD_MANAGER,
    CalibanTask,
    ObjectMeta,
    decode_items,
    phase_to_status,
)
from prospero.types.model import AgentStatus, RegisteredWorkspace

__all__ = ["K8sFleet", "TaskCache"]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _reaching_pod() -> Iterator[None]:
    """A pod caliband out of reach (`CalibandUnreachable`, any TransportError) as the seam's
    error: that caliband is the agent's backend."""
    try:
        yield
    except TransportError as e:
        raise FleetUnreachable(str(e)) from e


class K8sFleet:
    name = "k8s"
    _cache: TaskCache | None = None

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
        environment's default as lightkube resolves it (the in-cluster service account when
        running in a pod, else `KUBECONFIG`, else `~/.kube/config`). The pod
        calibands are dialled with the CA and token files (both unset: plaintext, fakes only)."""
        self.namespace = namespace
        try:
            if kubeconfig is not None:
                self._config = KubeConfig.from_file(kubeconfig)
            elif in_cluster:
                self._config = KubeConfig.from_service_account()
            else:
                self._config = KubeConfig.from_env()
        except (
            ConfigError,
            OSError,
            ValueError,
            yaml.YAMLError,
            AttributeError,
            TypeError,
            KeyError,
        ) as e:
            # (a malformed kubeconfig surfaces from the YAML parser or as a wrong shape)
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
            with kube_errors("configure the client"):
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

    @property
    def cache(self) -> TaskCache:
        """The namespace's CalibanTasks as the list + watch loop keeps them (started by the
        first listing); `cache.changed` is set whenever they change."""
        if self._cache is None:
            self._cache = TaskCache(self._api, self.namespace, self.request_timeout)
        return self._cache

    async def _list_direct(self) -> tuple[list[CalibanTask], int]:
        raw: list[dict[str, Any]] = []
        with kube_errors("list CalibanTasks"):
            async for obj in self._api().list(CalibanTaskResource, namespace=self.namespace):
                raw.append(obj.to_dict())  # type: ignore[no-untyped-call]
        return decode_items(CalibanTask, raw)

    async def _list_tasks(self) -> list[CalibanTask]:
        """The namespace's CRs: from the cache when the watch is live and has seen this
        provider's own writes; else (first listing still in flight past `sync_wait`, the watch
        failing, a write not echoed in time) one direct LIST, whose errors are translated."""
        cache = self.cache
        cache.start()
        if not cache.synced and cache.error is None:  # the first list: wait for it, briefly
            await cache.wait_until(lambda: cache.synced or cache.error is not None, cache.sync_wait)
        if cache.ready and await cache.wait_until(cache.caught_up, cache.sync_wait):
            tasks, skipped = cache.snapshot()
        else:
            cache.forget_expectations()  # this listing is newer than them
            tasks, skipped = await self._list_direct()
            if cache.error is not None:
                cache.wake()  # the API server answers: reconnect now
        self.skipped_crs = skipped
        self.skipped_total += skipped
        return tasks

    async def _get_task(self, name: str) -> CalibanTask | None:
        try:
            with kube_errors(f"get CalibanTask {name}", name):
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
        with kube_errors(f"apply CalibanTask {task.name}"):
            applied = await self._api().patch(
                CalibanTaskResource,
                task.name,
                task.apply_body(),
                namespace=self.namespace,
                patch_type=PatchType.APPLY,
                field_manager=FIELD_MANAGER,
                force=True,
            )
        if self._cache is not None:  # the next listing waits until the watch has seen it
            self._cache.expect_rv(applied.metadata.resourceVersion if applied.metadata else None)

    async def _create(self, task: CalibanTask) -> bool:
        """POST the CR: False when it already exists (409 AlreadyExists). The API server
        decides, so of concurrent identical spawns, from any number of replicas, exactly one
        creates it (a get before an apply would let several think they had)."""
        obj = CalibanTaskResource.from_dict(task.apply_body())
        with kube_errors(f"create CalibanTask {task.name}"):
            try:
                await self._api().create(obj)  # its namespace: the body's metadata
            except ApiError as e:
                if e.status.code == 409 and e.status.reason == "AlreadyExists":
                    return False
                raise
        return True

    async def _delete(self, agent_id: str, uid: str | None = None) -> None:
        """Idempotent: a CR already gone (deleted meanwhile) is not an error. Callers check that
        the agent exists first (`_task_of`), so an unknown id is still AgentNotFound."""
        with (
            contextlib.suppress(AgentNotFound),
            kube_errors(f"delete CalibanTask {agent_id}", agent_id),
        ):
            await self._api().delete(CalibanTaskResource, agent_id, namespace=self.namespace)
        if self._cache is not None:  # the next listing waits until the watch has seen it
            self._cache.expect_gone(agent_id, uid)

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

    async def list_agents(self, ws: RegisteredWorkspace) -> list[ListedAgent]:
        every = await self._list_tasks()
        self._all_names = {t.name for t in every}
        tasks = [t for t in every if t.spec.workspace_ref.name == ws.name]
        return await self._overlay(tasks, [listed_from_task(t) for t in tasks])

    async def _overlay(
        self, tasks: list[CalibanTask], records: list[ListedAgent]
    ) -> list[ListedAgent]:
        """Pod truth over the CR's perpetual `Running` (§8.2): one bounded `list` per endpoint.

        A terminal status the pod reported is kept for that CR incarnation (its uid): the CR's
        `Running` must not un-settle it once the pod is gone or unreachable."""
        by_endpoint: dict[str, list[int]] = {}
        for i, t in enumerate(tasks):
            settled = self._settled.get(t.name)
            if settled is not None and settled[0] == incarnation(t):
                records[i] = dataclasses.replace(records[i], status=settled[1])
                continue
            addr = t.status.caliband_endpoint if t.status else None
            if t.phase == "Running" and addr:
                by_endpoint.setdefault(addr, []).append(i)
        for gone in [n for n in self._settled if n not in self._all_names]:
            del self._settled[gone]  # its CR was deleted
        if not by_endpoint:
            return records

        async def pod_list(addr: str) -> list[AgentRecord] | None:
            try:
                validate_endpoint(addr)
                client = CalibandClient(
                    TcpEndpoint(addr=addr), self._security, timeout=self.overlay_timeout
                )
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
                records[i] = with_pod_truth(records[i], mine)
                if mine.status.terminal:
                    self._settled[tasks[i].name] = (incarnation(tasks[i]), mine.status)
        return records

    async def spawn(self, ws: RegisteredWorkspace, spec: AgentSpec) -> SpawnOutcome:
        """Create, then apply, the CR for `spec` (its posture included); no address yet."""
        task = task_for_spawn(self.namespace, ws.name, spec)
        created = await self._create(task)
        await self._apply(task)  # converge (an existing CR), and own the fields as an applier
        return SpawnOutcome(id=task.name, address=None, created=created)

    async def attach(self, ws: RegisteredWorkspace, agent_id: str) -> Address:
        task = await self._task_of(ws, agent_id)
        client = self._pod(task)
        lock = self._attach_locks.setdefault(agent_id, asyncio.Lock())
        with _reaching_pod():
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
                    # The worker runs from this moment on, and a remote agent has no
                    # transcript here: its lines are only in its replay, and only until it
                    # exits (~100 ms after its RunEnd). So the driver dials the endpoint the
                    # `spawned` reply carries (§4.1) at once, without another round trip.
                    spawned = await client.spawn(pod_spawn_spec(task))
                    return address_of(spawned.endpoint)
            return address_of(await client.attach(pod_id))

    async def kill(self, ws: RegisteredWorkspace, agent_id: str) -> None:
        task = await self._task_of(ws, agent_id)
        await self._delete(agent_id, task.metadata.uid)

    async def remove(self, ws: RegisteredWorkspace, agent_id: str, force: bool = False) -> None:
        """Delete the CR whatever its phase: there is no record to keep once it is gone."""
        task = await self._task_of(ws, agent_id)
        await self._delete(agent_id, task.metadata.uid)

    async def respawn(self, ws: RegisteredWorkspace, agent_id: str) -> str:
        """§8.3 restart: delete, wait until the CR is gone, re-apply the same name (empty status)."""
        task = await self._task_of(ws, agent_id)
        await self._delete(agent_id, task.metadata.uid)
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

    def on_changed(self, listener: ChangeListener | None) -> None:
        """The watch's push: `listener(workspace)` whenever an event (or a relist) changes one
        of the workspace's CRs (`TaskCache.listener`; the watch starts with the first listing)."""
        self.cache.listener = listener

    async def forget(self, ws_name: str) -> None:
        """Nothing cached per workspace."""

    async def get_task(self, ws: RegisteredWorkspace, agent_id: str) -> CalibanTask:
        """The agent's CR as this mirror reads it: where the drive protocol
        (`task.drive_protocol`, absent ⇒ ndjson) and posture are read back from."""
        return await self._task_of(ws, agent_id)

    async def close(self) -> None:
        if self._cache is not None:
            await self._cache.stop()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
