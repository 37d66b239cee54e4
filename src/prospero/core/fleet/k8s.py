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
import random
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import httpx2
import orjson
import yaml  # lightkube's own dependency: a malformed kubeconfig raises its errors
from lightkube import ApiError, AsyncClient, ConfigError, KubeConfig, LoadResourceError
from lightkube.core.exceptions import NotReadyError
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
from prospero.core.fleet.provider import SpawnOutcome
from prospero.core.transport import NetworkSecurity
from prospero.core.wire.control import AgentRecord, Endpoint, SpawnSpec, TcpEndpoint
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


def validate_endpoint(addr: str) -> None:
    """`status.calibandEndpoint` must be a bare `host:port`."""
    if not addr.strip():
        raise InvalidConfig("CalibanTask status.calibandEndpoint is empty")
    if "://" in addr:
        raise InvalidConfig(
            f"CalibanTask status.calibandEndpoint must be a bare host:port, not a URL: {addr!r}"
        )
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
            raise TransportError(
                f"Kubernetes API denied {what} (HTTP {code}; check RBAC/credentials): {msg}"
            ) from e
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
    except (
        ApiError,
        ConfigError,
        LoadResourceError,
        httpx2.HTTPError,
        OSError,
        TimeoutError,
        ValueError,
    ) as e:
        _translate(e, what, name)


class _Gone(Exception):
    """The watch's resourceVersion is older than the server's history (410 Gone): relist."""


def _rv_int(rv: str | None) -> int | None:
    """resourceVersions are opaque to clients, but an apiserver's are etcd revisions (decimal
    integers); only used to tell when the cache has seen this provider's own writes."""
    try:
        return int(rv) if rv else None
    except ValueError:
        return None


class TaskCache:
    """The namespace's CalibanTasks, kept by one list + watch loop (client-go's reflector, small).

    LIST (its `metadata.resourceVersion`), then WATCH from it (`allowWatchBookmarks`,
    `timeoutSeconds`), applying ADDED/MODIFIED/DELETED to `tasks`, each object decoded on its own
    (one that does not match the mirror is dropped into `skewed` and counted in
    `skipped_events`). A BOOKMARK only advances `resource_version`. A stream that ends cleanly
    (its timeout, a server restart) is re-watched from `resource_version`; a 410 Gone (an HTTP
    410 or an in-stream ERROR event with code 410) relists (`expired`); anything else (connection
    refused, a 5xx, an undecodable line) sets `error` and backs off exponentially
    (`backoff_initial` doubling up to `backoff_max`, jittered) before resuming from the last
    resourceVersion. `ready` = listed and not failing since: only then is the cache served.

    The WATCH is sent through lightkube's request layer (`GenericAsyncClient.prepare_request`,
    `send`): `AsyncClient.watch` takes no `allowWatchBookmarks`, and re-watches on its own after
    a clean end, hiding what this loop has to see.

    The provider's own writes are read back: `expect_rv` (an apply's resourceVersion) and
    `expect_gone` (a delete) make `caught_up()` false until the watch has delivered them."""

    backoff_initial = 0.1
    backoff_max = 10.0
    watch_timeout = 300  # seconds: each WATCH's `timeoutSeconds`
    sync_wait = 2.0  # how long a listing waits for the loop before listing directly

    def __init__(
        self, api: Callable[[], AsyncClient], namespace: str, request_timeout: float
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.request_timeout = request_timeout
        self.tasks: dict[str, CalibanTask] = {}
        self.skewed: set[str] = set()  # names of CRs present that do not decode
        self.resource_version: str | None = None
        self.synced = False
        self.error: ProsperoError | None = None
        # set whenever the cache changes; never cleared here (a consumer clears it)
        self.changed = asyncio.Event()
        self.lists = 0  # LISTs done by the loop
        self.expired = 0  # 410 Gone: relists forced
        self.bookmarks = 0
        self.skipped_events = 0  # watch events whose object did not decode
        self._failures = 0
        self._want_rv = 0
        self._gone: dict[str, str | None] = {}  # deleted by this provider: name -> uid
        self._tick = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def ready(self) -> bool:
        return self.synced and self.error is None and self.running

    def start(self) -> None:
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"k8s-watch-{self.namespace}"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.synced = False
        self.resource_version = None

    def wake(self) -> None:
        """Cut a backoff short (the API server answered someone else)."""
        self._wake.set()

    # --- reads --------------------------------------------------------------------------------

    def snapshot(self) -> tuple[list[CalibanTask], int]:
        return [self.tasks[n] for n in sorted(self.tasks)], len(self.skewed)

    def expect_rv(self, rv: str | None) -> None:
        n = _rv_int(rv)
        if n is not None and self.running:
            self._want_rv = max(self._want_rv, n)

    def expect_gone(self, name: str, uid: str | None) -> None:
        if self.running:
            self._gone[name] = uid

    def forget_expectations(self) -> None:
        self._want_rv = 0
        self._gone.clear()

    def caught_up(self) -> bool:
        if self._want_rv and (_rv_int(self.resource_version) or 0) < self._want_rv:
            return False
        for name, uid in list(self._gone.items()):
            t = self.tasks.get(name)
            if t is None or (uid and t.metadata.uid != uid) or t.metadata.deletion_timestamp:
                del self._gone[name]
            else:
                return False
        self._want_rv = 0
        return True

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            left = deadline - loop.time()
            if left <= 0:
                return False
            tick = self._tick
            with contextlib.suppress(TimeoutError):
                await wait_for(tick.wait(), left)
        return True

    def _notify(self, changed: bool) -> None:
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()
        if changed:
            self.changed.set()

    # --- the loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            immediate = False
            try:
                if self.resource_version is None:
                    await self._list()
                # progress resets the failures; a stream that ends at once with nothing does not
                self._failures = 0 if await self._watch() else self._failures + 1
            except _Gone as e:
                log.info("CalibanTask watch in %s expired (%s): relisting", self.namespace, e)
                self.expired += 1
                self.synced = False
                self.resource_version = None
                immediate = self._failures == 0  # at once, unless expiring again without progress
                self._failures += 1
                self._notify(False)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._failures += 1
                try:
                    _translate(e, "watch CalibanTasks")
                except ProsperoError as err:
                    self.error = err
                log.log(
                    logging.WARNING if self._failures == 1 else logging.DEBUG,
                    "CalibanTask watch in %s failed (%d in a row): %s",
                    self.namespace,
                    self._failures,
                    self.error,
                    exc_info=not isinstance(
                        e, ApiError | httpx2.HTTPError | OSError | ProsperoError
                    ),
                )
                self._notify(False)
            if self._failures and not immediate:
                delay = min(self.backoff_max, self.backoff_initial * 2 ** (self._failures - 1))
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._wake.wait(), delay * random.uniform(0.5, 1.0))

    async def _list(self) -> None:
        listing = self._api().list(CalibanTaskResource, namespace=self.namespace)
        raw = [obj.to_dict() async for obj in listing]  # type: ignore[no-untyped-call]
        try:
            rv = listing.resourceVersion
        except NotReadyError as e:
            raise ProtocolError("the CalibanTask list carries no resourceVersion") from e
        tasks: dict[str, CalibanTask] = {}
        skewed: set[str] = set()
        for item in raw:
            decoded, _ = decode_items(CalibanTask, [item])
            if decoded:
                tasks[decoded[0].name] = decoded[0]
            else:
                skewed.add(str((item.get("metadata") or {}).get("name", "?")))
        self.tasks, self.skewed, self.resource_version = tasks, skewed, rv
        self.synced, self.error = True, None
        self.lists += 1
        self._notify(True)

    async def _watch(self) -> bool:
        """One WATCH request from `resource_version`, to its end. True if it made progress (a
        line, or it lasted): a stream that ends at once with nothing counts as a failure."""
        gc = self._api()._client  # lightkube's request layer (see the class docstring)
        br = gc.prepare_request(
            "list",
            res=CalibanTaskResource,
            namespace=self.namespace,
            watch=True,
            params={
                "allowWatchBookmarks": "true",
                "timeoutSeconds": self.watch_timeout,
                "resourceVersion": self.resource_version,
            },
        )
        # the server ends the stream after timeoutSeconds; a silent dead connection is noticed
        # request_timeout later
        br.timeout = httpx2.Timeout(
            self.request_timeout, read=self.watch_timeout + self.request_timeout
        )
        loop = asyncio.get_running_loop()
        started = loop.time()
        resp = await gc.send(gc.build_adapter_request(br), stream=True)  # type: ignore[no-untyped-call]
        lines = 0
        try:
            if resp.status_code >= 400:
                await resp.aread()
                if resp.status_code == 410:
                    raise _Gone(f"HTTP 410: {resp.text[:200]}")
                gc.raise_for_status(resp)  # type: ignore[no-untyped-call]
            self.error = None
            async for line in resp.aiter_lines():
                if line.strip():
                    lines += 1
                    self._event(line)
        finally:
            await resp.aclose()
        return lines > 0 or loop.time() - started >= 1.0

    def _event(self, line: str) -> None:
        try:
            ev = orjson.loads(line)
            kind, obj = ev["type"], ev["object"]
            if not isinstance(kind, str) or not isinstance(obj, dict):
                raise TypeError("type or object malformed")
            meta = obj.get("metadata") or {}
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ProtocolError(f"undecodable CalibanTask watch event: {line[:200]!r}") from e
        if kind == "ERROR":
            code, msg = obj.get("code"), obj.get("message") or obj.get("reason") or ""
            if code == 410:
                raise _Gone(msg)
            raise TransportError(f"Kubernetes API ended the CalibanTask watch (code {code}): {msg}")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        self._failures = 0
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = str(rv)
            self.bookmarks += 1
            self._notify(False)
            return
        name = str(meta.get("name", "?")) if isinstance(meta, dict) else "?"
        if kind in ("ADDED", "MODIFIED"):
            decoded, _ = decode_items(CalibanTask, [obj])
            if decoded:
                self.tasks[name] = decoded[0]
                self.skewed.discard(name)
            else:
                self.tasks.pop(name, None)
                self.skewed.add(name)
                self.skipped_events += 1
        elif kind == "DELETED":
            self.tasks.pop(name, None)
            self.skewed.discard(name)
        else:
            log.debug("ignoring CalibanTask watch event of type %r", kind)
        if rv:
            self.resource_version = str(rv)
        self._notify(True)


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

    @property
    def cache(self) -> TaskCache:
        """The namespace's CalibanTasks as the list + watch loop keeps them (started by the
        first listing); `cache.changed` is set whenever they change."""
        if self._cache is None:
            self._cache = TaskCache(self._api, self.namespace, self.request_timeout)
        return self._cache

    async def _list_direct(self) -> tuple[list[CalibanTask], int]:
        raw: list[dict[str, Any]] = []
        with _kube_errors("list CalibanTasks"):
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
        with _kube_errors(f"create CalibanTask {task.name}"):
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
            _kube_errors(f"delete CalibanTask {agent_id}", agent_id),
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
                rec = records[i]
                rec.status = mine.status
                rec.spec.interactive = mine.spec.interactive
                if mine.status.terminal:
                    self._settled[tasks[i].name] = (_incarnation(tasks[i]), mine.status)

    async def spawn(
        self, ws: RegisteredWorkspace, spec: SpawnSpec, *, posture: Posture | None = None
    ) -> SpawnOutcome:
        name = task_name(ws.name, spec.initial_prompt, spec.label)
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
        created = await self._create(task)
        await self._apply(task)  # converge (an existing CR), and own the fields as an applier
        return SpawnOutcome(id=name, endpoint=UNRESOLVED, created=created)

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
