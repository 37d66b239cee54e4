"""A fake caliban operator: what the real one does to the CRs, minus pods.

For each `CalibanTask` without a settled phase it writes, through the `status` subresource
(server-side apply, field manager `caliban-operator`, forced — so `managedFields` shows an
`Apply` entry with `subresource: status`), one step at a time `step_delay` apart:

    Pending → Provisioning (status.resolvedWorkspace pinned from the Workspace CR)
            → Running      (status.calibandEndpoint = endpoint(task), when it returns one)

`endpoint` is the test's hook: called with the task object, it returns the bare `host:port`
of the caliband "pod" that serves it (e.g. a `FakeCaliband` TCP listener), or None to leave
the task Provisioning until `retry()`. The real operator leaves `Running` for good; a test
ends a run with `finish(ns, name, "Completed" | "Failed")`. A `Workspace` whose generation the
status has not observed goes Reconciling → Ready with the `observedGeneration` it reconciled
(a spec changed meanwhile is reconciled again). The fake never fails a Workspace and reads no
Secret: a `credentialsRef` is only a name to it, as it is to Prospero.

The spec's phases are `Pending, Provisioning, Running, Draining, Completed, Failed`
(caliband-wire.md §8.1): there is no `Succeeded`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from prospero.testkit.fake_kube import patches
from prospero.testkit.fake_kube.errors import KubeError
from prospero.testkit.fake_kube.store import Event, Watcher
from prospero.testkit.fake_kube.verbs import Kube, Params

log = logging.getLogger(__name__)

GROUP = "caliban.caliban-ai.dev"
API_VERSION = f"{GROUP}/v1alpha1"
TASKS = (GROUP, "calibantasks")
WORKSPACES = (GROUP, "workspaces")
SETTLED = ("Running", "Draining", "Completed", "Failed")

EndpointFn = Callable[[dict[str, Any]], "str | Awaitable[str | None] | None"]


class FakeOperator:
    def __init__(
        self,
        kube: Kube,
        *,
        endpoint: EndpointFn | None = None,
        step_delay: float = 0.0,
        manager: str = "caliban-operator",
    ) -> None:
        self.kube = kube
        self.endpoint = endpoint
        self.step_delay = step_delay
        self.manager = manager
        self._task: asyncio.Task[None] | None = None
        self._watchers: list[Watcher] = []
        self._busy: dict[tuple[str, str, str], asyncio.Task[None]] = {}

    async def start(self) -> None:
        store = self.kube.store
        pending: list[tuple[tuple[str, str], dict[str, Any]]] = []
        for rkey in (TASKS, WORKSPACES):
            pending += [(rkey, o) for o in store.items(rkey, None)]
            _, w = store.subscribe(rkey, None, None)
            self._watchers.append(w)
        self._task = asyncio.create_task(self._run(pending), name="fake-kube-operator")

    async def stop(self) -> None:
        for w in self._watchers:
            self.kube.store.unsubscribe(w)
            w.queue.put_nowait(None)
        tasks = [t for t in (self._task, *self._busy.values()) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._busy.clear()

    async def _run(self, pending: list[tuple[tuple[str, str], dict[str, Any]]]) -> None:
        for rkey, obj in pending:
            self._kick(rkey, obj)
        queue: asyncio.Queue[Event | int | None] = asyncio.Queue()

        async def pump(w: Watcher) -> None:
            while (item := await w.queue.get()) is not None:
                await queue.put(item)
            await queue.put(None)

        pumps = [asyncio.create_task(pump(w)) for w in self._watchers]
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, Event) and item.type != "DELETED":
                    self._kick(item.rkey, item.obj)
        finally:
            for p in pumps:
                p.cancel()

    def retry(self) -> None:
        """Look at every task again (e.g. after the endpoint hook learnt an address)."""
        for rkey in (TASKS, WORKSPACES):
            for o in self.kube.store.items(rkey, None):
                self._kick(rkey, o)

    def _kick(self, rkey: tuple[str, str], obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = (rkey[1], meta.get("namespace", ""), meta["name"])
        if meta.get("deletionTimestamp") or (key in self._busy and not self._busy[key].done()):
            return
        status = obj.get("status") or {}
        if rkey == TASKS and status.get("phase") in SETTLED:
            return
        if rkey == WORKSPACES and status.get("phase") == "Ready" and status.get("observedGeneration") == meta.get("generation"):
            return
        step = self._task_steps if rkey == TASKS else self._workspace_steps
        self._busy[key] = asyncio.create_task(step(key[1], key[2]))

    def _write_status(self, plural: str, kind: str, ns: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        rt = self.kube.registry.lookup(GROUP, "v1alpha1", plural)
        if rt is None:
            return None
        body = {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name, "namespace": ns}, "status": status}
        params = Params({"fieldManager": self.manager, "force": "true"})
        try:
            obj, _ = self.kube.patch(rt, ns, name, patches.APPLY, json.dumps(body).encode(), params, self.manager, "status")
        except KubeError as e:
            log.debug("operator: status of %s/%s not written: %s", ns, name, e.message)
            return None
        return obj

    async def _pause(self) -> None:
        await asyncio.sleep(self.step_delay)

    async def _task_steps(self, ns: str, name: str) -> None:
        while True:
            obj = self.kube.store.get(TASKS, ns, name)
            if obj is None or obj["metadata"].get("deletionTimestamp"):
                return
            status = dict(obj.get("status") or {})
            phase = status.get("phase", "")
            if phase == "":
                status["phase"] = "Pending"
            elif phase == "Pending":
                status["phase"] = "Provisioning"
                resolved = self._resolve(ns, obj)
                if resolved is not None:
                    status["resolvedWorkspace"] = resolved
            elif phase == "Provisioning":
                endpoint = await self._endpoint(obj)
                if endpoint is None and self.endpoint is not None:
                    return  # stays Provisioning until retry()
                status["phase"] = "Running"
                if endpoint:
                    status["calibandEndpoint"] = endpoint
                    status["sandboxRef"] = {"name": f"{name}-sandbox"}
            else:
                return
            if self._write_status("calibantasks", "CalibanTask", ns, name, status) is None:
                return
            await self._pause()

    async def _endpoint(self, obj: dict[str, Any]) -> str | None:
        if self.endpoint is None:
            return None
        got = self.endpoint(obj)
        if inspect.isawaitable(got):
            got = await got
        return got if isinstance(got, str) else None

    def _resolve(self, ns: str, task: dict[str, Any]) -> dict[str, Any] | None:
        spec = task.get("spec") or {}
        ws = self.kube.store.get(WORKSPACES, ns, (spec.get("workspaceRef") or {}).get("name", ""))
        if ws is None:
            return None
        wspec = ws.get("spec") or {}
        providers = wspec.get("providers") or []
        wanted = spec.get("providerRef") or wspec.get("defaultProvider")
        chosen = next((p for p in providers if p.get("name") == wanted), None)
        if chosen is None and len(providers) == 1:
            chosen = providers[0]
        out: dict[str, Any] = {"sources": wspec.get("sources") or []}
        if chosen is not None:
            out["provider"] = chosen
        if wspec.get("env"):
            out["env"] = wspec["env"]
        if wspec.get("isolation"):
            out["isolation"] = wspec["isolation"]
        return out

    async def _workspace_steps(self, ns: str, name: str) -> None:
        """Reconciling, then Ready with the generation it reconciled; again while the spec
        moved on meanwhile (a change made while this ran is reconciled, not dropped)."""
        while True:
            obj = self.kube.store.get(WORKSPACES, ns, name)
            if obj is None or obj["metadata"].get("deletionTimestamp"):
                return
            generation = obj["metadata"].get("generation", 1)
            status = obj.get("status") or {}
            if status.get("phase") == "Ready" and status.get("observedGeneration") == generation:
                return
            for phase in ("Reconciling", "Ready"):
                step: dict[str, Any] = {"phase": phase}
                if phase == "Ready":
                    step["observedGeneration"] = generation
                if self._write_status("workspaces", "Workspace", ns, name, step) is None:
                    return
                await self._pause()

    def finish(self, ns: str, name: str, phase: str = "Completed") -> dict[str, Any] | None:
        """End a task's run the way the operator would report it (Completed or Failed)."""
        obj = self.kube.store.get(TASKS, ns, name)
        if obj is None:
            return None
        status = dict(obj.get("status") or {})
        status["phase"] = phase
        return self._write_status("calibantasks", "CalibanTask", ns, name, status)
