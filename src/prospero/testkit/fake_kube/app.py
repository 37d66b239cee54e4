"""The HTTP face of the fake apiserver (an ASGI app): URL routing, discovery, verbs, watch.

Paths: `/version`, `/healthz`, `/livez`, `/readyz`, `/api`, `/api/v1`, `/apis`, `/apis/<g>`,
`/apis/<g>/<v>`, and `/api/v1/...` or `/apis/<g>/<v>/...` followed by
`[namespaces/<ns>/]<plural>[/<name>[/status]]`. Bodies are compact JSON; a custom resource's
keys come out sorted (the apiserver serves them unstructured, and Go sorts map keys).
`/openapi/v3` serves what kubectl reads before writing (`openapi.py`); `/openapi/v2` is 404.

Watch (`?watch=1`): `200`, `Transfer-Encoding: chunked`, one `{"type":..,"object":..}` JSON
line per event. No `resourceVersion` (or `0`): synthetic ADDED events for the current state,
then changes. `resourceVersion=N`: the changes after N, or a single ERROR event carrying a 410
`Expired` Status when N is older than the log (`Store.compact`), then the end of the stream —
in-stream, as the apiserver's watch cache does. `sendInitialEvents=true` (with
`resourceVersionMatch=NotOlderThan`) ends the initial ADDED events with a BOOKMARK annotated
`k8s.io/initial-events-end: "true"`. `allowWatchBookmarks=true`: a BOOKMARK
(`{kind, apiVersion, metadata: {resourceVersion}}`) every `bookmark_interval` seconds while
idle, and whenever `FakeKube.bookmark()` asks. `timeoutSeconds` ends the stream cleanly.
Label selectors turn a MODIFIED that leaves (enters) the selection into DELETED (ADDED).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from prospero.core.aio import wait_for
from prospero.testkit.fake_kube import errors, openapi
from prospero.testkit.fake_kube.errors import KubeError
from prospero.testkit.fake_kube.resources import ResourceType
from prospero.testkit.fake_kube.selectors import field_matcher, label_matcher
from prospero.testkit.fake_kube.store import Event
from prospero.testkit.fake_kube.verbs import Kube, Params

VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-12-11T17:58:31Z",
    "goVersion": "go1.23.3",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_META_ORDER = [
    "name", "generateName", "namespace", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels",
    "annotations", "ownerReferences", "finalizers", "managedFields",
]


def render(rt: ResourceType | None, obj: Any) -> Any:
    """A typed object's field order (kind, apiVersion, metadata, ...), or sorted keys for an
    unstructured custom resource (the caller dumps those with sort_keys)."""
    if rt is None or rt.custom or not isinstance(obj, dict):
        return obj
    out: dict[str, Any] = {}
    for k in ("kind", "apiVersion"):
        if k in obj:
            out[k] = obj[k]
    if isinstance(obj.get("metadata"), dict):
        meta = obj["metadata"]
        out["metadata"] = {k: meta[k] for k in _META_ORDER if k in meta} | meta
    if "items" in obj:
        out["items"] = [render(rt, i) for i in obj["items"]]
    for k, v in obj.items():
        out.setdefault(k, v)
    return out


def dumps(rt: ResourceType | None, obj: Any) -> bytes:
    sort = rt is not None and rt.custom
    return json.dumps(render(rt, obj), separators=(",", ":"), sort_keys=sort, ensure_ascii=False).encode()


def _json(status: int, rt: ResourceType | None, obj: Any, warnings: list[str] | None = None) -> Response:
    headers = {}
    if warnings:
        headers["Warning"] = ", ".join(f'299 - "{w}"' for w in warnings)
    return Response(dumps(rt, obj), status_code=status, media_type="application/json", headers=headers)


def _error(e: KubeError) -> Response:
    return _json(e.code, None, e.status())


class Route:
    def __init__(self, rt: ResourceType, namespace: str | None, name: str | None, sub: str) -> None:
        self.rt, self.namespace, self.name, self.sub = rt, namespace, name, sub


class FakeKubeApp:
    """ASGI app over a `Kube`. `server_address` goes into `/api`'s serverAddressByClientCIDRs."""

    def __init__(self, kube: Kube, *, bookmark_interval: float = 60.0, server_address: str = "") -> None:
        self.kube = kube
        self.bookmark_interval = bookmark_interval
        self.server_address = server_address
        self.requests: list[tuple[str, str]] = []  # (method, path?query), for tests

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        qs = scope.get("query_string", b"").decode()
        self.requests.append((request.method, scope["path"] + (f"?{qs}" if qs else "")))
        try:
            response = await self.dispatch(request)
        except KubeError as e:
            response = _error(e)
        await response(scope, receive, send)

    async def dispatch(self, request: Request) -> Response:
        path = request.url.path
        segs = [s for s in path.split("/") if s]
        if path in ("/healthz", "/livez", "/readyz"):
            return Response(b"ok", media_type="text/plain")
        if segs == ["version"]:
            return _json(200, None, VERSION)
        reg = self.kube.registry
        if segs[:2] == ["openapi", "v3"]:
            if len(segs) == 2:
                return _json(200, None, openapi.root(reg))
            doc = openapi.documents(reg).get("/".join(segs[2:]))
            if doc is None:
                raise errors.not_found_path()
            return _json(200, None, doc)
        if segs == ["api"]:
            return _json(200, None, reg.core_versions(self.server_address))
        if segs == ["apis"]:
            return _json(200, None, reg.group_list())
        if len(segs) >= 2 and segs[0] == "api":
            group, version, rest = "", segs[1], segs[2:]
        elif len(segs) >= 2 and segs[0] == "apis":
            if len(segs) == 2:
                if segs[1] not in reg.groups():
                    raise errors.not_found_path()
                return _json(200, None, reg.group_doc(segs[1]))
            group, version, rest = segs[1], segs[2], segs[3:]
        else:
            raise errors.not_found_path()
        if not rest:
            doc = reg.resource_list(group, version)
            if doc is None:
                raise errors.not_found_path()
            return _json(200, None, doc)
        route = self._route(group, version, rest)
        self.kube.warnings = []
        return await self._verb(request, route)

    def _route(self, group: str, version: str, rest: list[str]) -> Route:
        reg = self.kube.registry
        ns: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            rt = reg.lookup(group, version, rest[2])
            if rt is not None and rt.namespaced:
                ns, rest = rest[1], rest[2:]
        rt = reg.lookup(group, version, rest[0])
        if rt is None or len(rest) > 3:
            raise errors.not_found_path()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        if sub and not (sub == "status" and rt.status_subresource):
            raise errors.not_found_path()
        if name is not None and rt.namespaced and ns is None:
            raise errors.not_found_path()
        return Route(rt, ns, name, sub)

    async def _verb(self, request: Request, r: Route) -> Response:
        params = Params(dict(request.query_params))
        ua = request.headers.get("user-agent", "")
        kube, rt, ns = self.kube, r.rt, r.namespace or ""
        m = request.method
        if m == "GET" and r.name is None:
            if params.flag("watch"):
                return await self._watch(rt, r.namespace, params)
            return _json(200, rt, kube.list(rt, r.namespace, params))
        if m == "GET":
            return _json(200, rt, kube.get(rt, ns, r.name or ""))
        if m == "POST" and r.name is None:
            obj = kube.create(rt, ns, self._body(await request.body()), params, ua, r.sub)
            return _json(201, rt, obj, kube.warnings)
        if m == "PUT" and r.name is not None:
            obj = kube.update(rt, ns, r.name, self._body(await request.body()), params, ua, r.sub)
            return _json(200, rt, obj, kube.warnings)
        if m == "PATCH" and r.name is not None:
            ctype = request.headers.get("content-type", "")
            obj, created = kube.patch(rt, ns, r.name, ctype, await request.body(), params, ua, r.sub)
            return _json(201 if created else 200, rt, obj, kube.warnings)
        if m == "DELETE" and r.name is not None and not r.sub:
            raw = await request.body()
            options = self._body(raw) if raw.strip() else {}
            gone = kube.delete(rt, ns, r.name, options if isinstance(options, dict) else {}, params)
            if rt.custom or rt.plural in ("namespaces", "customresourcedefinitions"):
                return _json(200, rt, gone)
            return _json(200, None, {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": r.name, "kind": rt.plural, "uid": gone["metadata"].get("uid", "")},
            })
        if m == "DELETE" and r.name is None:
            return _json(200, rt, kube.delete_collection(rt, r.namespace, params))
        raise KubeError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {})

    @staticmethod
    def _body(raw: bytes) -> Any:
        try:
            return json.loads(raw)
        except ValueError:
            import yaml

            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError as e:
                raise errors.bad_request(f"the object provided is unrecognized: {e}") from e

    # watch ---------------------------------------------------------------------------------

    async def _watch(self, rt: ResourceType, namespace: str | None, params: Params) -> Response:
        lm = label_matcher(params.get("labelSelector"))
        fm = field_matcher(params.get("fieldSelector"), f"{rt.api_version}, Resource={rt.plural}", params.get("labelSelector"))
        rv = params.get("resourceVersion")
        initial_events = params.flag("sendInitialEvents")
        bookmarks = params.flag("allowWatchBookmarks")
        timeout = float(params.get("timeoutSeconds") or 0) or 1800.0
        store = self.kube.store
        if initial_events and params.get("resourceVersionMatch") != "NotOlderThan":
            raise errors.invalid("ListOptions", "meta.k8s.io", "", [{"reason": "FieldValueInvalid", "field": "resourceVersionMatch", "message": "Invalid value: \"\": sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"}])
        initial: list[dict[str, Any]] = []
        error: KubeError | None = None
        watcher = None
        start_rv = store.rv
        try:
            if rv in ("", "0") or initial_events:
                initial = [o for o in store.items(rt.key, namespace) if lm(o) and fm(o)]
                _, watcher = store.subscribe(rt.key, namespace, None)
                backlog: list[Event] = []
            else:
                backlog, watcher = store.subscribe(rt.key, namespace, Kube._rv(rv))
        except KubeError as e:
            error = e

        def line(kind: str, obj: Any) -> bytes:
            return b'{"type":"' + kind.encode() + b'","object":' + dumps(rt if kind != "ERROR" else None, obj) + b"}\n"

        def bookmark(at: int, initial_end: bool = False) -> bytes:
            meta: dict[str, Any] = {"resourceVersion": str(at)}
            if initial_end:
                meta["annotations"] = {"k8s.io/initial-events-end": "true"}
            return line("BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta})

        def translate(ev: Event) -> bytes | None:
            now_in = lm(ev.obj) and fm(ev.obj)
            was_in = ev.prev is not None and lm(ev.prev) and fm(ev.prev)
            if ev.type == "ADDED":
                return line("ADDED", ev.obj) if now_in else None
            if ev.type == "DELETED":
                return line("DELETED", ev.obj) if was_in else None
            if now_in and was_in:
                return line("MODIFIED", ev.obj)
            if now_in:
                return line("ADDED", ev.obj)
            if was_in:
                return line("DELETED", ev.obj)
            return None

        async def stream() -> AsyncIterator[bytes]:
            if error is not None:
                yield line("ERROR", error.status())
                return
            assert watcher is not None
            deadline = time.monotonic() + timeout
            try:
                for o in initial:
                    yield line("ADDED", o)
                if initial_events:
                    yield bookmark(start_rv, initial_end=True)
                for ev in backlog:
                    out = translate(ev)
                    if out:
                        yield out
                last_bookmark = time.monotonic()
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    wait = left
                    if bookmarks:
                        wait = min(wait, max(0.0, last_bookmark + self.bookmark_interval - time.monotonic()))
                    item: Event | int | None
                    try:
                        item = await wait_for(watcher.queue.get(), wait)
                    except TimeoutError:
                        if bookmarks and watcher.queue.empty() and time.monotonic() >= last_bookmark + self.bookmark_interval:
                            last_bookmark = time.monotonic()
                            yield bookmark(store.rv)
                        continue
                    if item is None:
                        return
                    if isinstance(item, int):
                        if bookmarks:
                            last_bookmark = time.monotonic()
                            yield bookmark(item)
                        continue
                    out = translate(item)
                    if out:
                        yield out
            finally:
                store.unsubscribe(watcher)

        return StreamingResponse(stream(), status_code=200, media_type="application/json")
