"""The API-server side of K8sFleet: Kubernetes errors translated into Prospero's, and the
namespace's CalibanTasks kept by one list + watch loop (`TaskCache`).

Every Kubernetes or connection error is translated here (`translate_kube_error`,
`kube_errors`); no lightkube or httpx exception crosses K8sFleet's (nor K8sWorkspaces')
boundary. An API server that cannot be reached, fails (5xx) or denies the request (401/403:
RBAC, credentials) is `FleetUnreachable`, the seam's "this workspace's backend cannot be
reached".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Iterable, Iterator
from typing import NoReturn

import httpx2
import orjson
from lightkube import ApiError, AsyncClient, ConfigError, LoadResourceError
from lightkube.core.exceptions import NotReadyError
from lightkube.generic_resource import create_namespaced_resource

from prospero.core.aio import wait_for
from prospero.core.errors import (
    AgentNotFound,
    Conflict,
    FleetUnreachable,
    InvalidConfig,
    NotFound,
    ProsperoError,
    ProtocolError,
)
from prospero.core.wire.k8s import GROUP, TASK_KIND, TASK_PLURAL, VERSION, CalibanTask, decode_items

log = logging.getLogger("prospero.core.fleet.k8s")  # as before the split

CalibanTaskResource = create_namespaced_resource(GROUP, VERSION, TASK_KIND, TASK_PLURAL)


def translate_kube_error(e: BaseException, what: str, name: str | None = None) -> NoReturn:
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
            raise FleetUnreachable(
                f"Kubernetes API denied {what} (HTTP {code}; check RBAC/credentials): {msg}"
            ) from e
        if 400 <= code < 500:
            raise ProtocolError(f"Kubernetes API rejected {what} (HTTP {code}): {msg}") from e
        raise FleetUnreachable(f"Kubernetes API failed to {what} (HTTP {code}): {msg}") from e
    if isinstance(e, ConfigError | LoadResourceError):
        raise InvalidConfig(f"Kubernetes client configuration: {e}") from e
    if isinstance(e, httpx2.HTTPError | OSError | TimeoutError):
        raise FleetUnreachable(
            f"Kubernetes API unreachable ({what}): {e or type(e).__name__}"
        ) from e
    raise ProtocolError(f"Kubernetes client failed to {what}: {e!r}") from e


@contextlib.contextmanager
def kube_errors(what: str, name: str | None = None) -> Iterator[None]:
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
        translate_kube_error(e, what, name)


class _Gone(Exception):
    """The watch's resourceVersion is older than the server's history (410 Gone): relist."""


def _rv_int(rv: str | None) -> int | None:
    """resourceVersions are opaque to clients, but an apiserver's are etcd revisions (decimal
    integers); only used to tell when the cache has seen this provider's own writes."""
    try:
        return int(rv) if rv else None
    except ValueError:
        return None


def _rv_of(task: CalibanTask | None) -> str | None:
    return task.metadata.resource_version if task is not None else None


def _workspace_of(obj: dict[str, object]) -> str | None:
    """The workspace a raw CalibanTask names (also one that does not decode)."""
    spec = obj.get("spec")
    ref = spec.get("workspaceRef") if isinstance(spec, dict) else None
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) else None


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
    `expect_gone` (a delete) make `caught_up()` false until the watch has delivered them.

    `listener` (set by `K8sFleet.on_changed`) is called with the workspace of every CR an
    event added, changed or deleted (both workspaces if a change moved it), and with those of
    the CRs a relist found changed, after the cache holds the change: a listing it prompts
    reads it."""

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
        # called with each workspace whose CRs an event or a relist changed (`K8sFleet.on_changed`)
        self.listener: Callable[[str], None] | None = None
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

    def _notify(self, changed: bool, workspaces: Iterable[str | None] = ()) -> None:
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()
        if changed:
            self.changed.set()
        listener = self.listener
        if listener is None:
            return
        for name in {w for w in workspaces if w}:
            try:
                listener(name)
            except Exception:  # a listener's bug must not end the watch
                log.exception("CalibanTask change listener failed for workspace %s", name)

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
                    translate_kube_error(e, "watch CalibanTasks")
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
        before = self.tasks
        self.tasks, self.skewed, self.resource_version = tasks, skewed, rv
        self.synced, self.error = True, None
        self.lists += 1
        moved: list[str] = []  # the workspaces of the CRs this listing changed
        for n in before.keys() | tasks.keys():
            was, now = before.get(n), tasks.get(n)
            if _rv_of(was) != _rv_of(now):
                moved += [t.spec.workspace_ref.name for t in (was, now) if t is not None]
        self._notify(True, moved)

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
            raise FleetUnreachable(
                f"Kubernetes API ended the CalibanTask watch (code {code}): {msg}"
            )
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        self._failures = 0
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = str(rv)
            self.bookmarks += 1
            self._notify(False)
            return
        name = str(meta.get("name", "?")) if isinstance(meta, dict) else "?"
        before = self.tasks.get(name)
        touched = [_workspace_of(obj), before.spec.workspace_ref.name if before else None]
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
        self._notify(True, touched)
