"""The API verbs over the store: what kube-apiserver does for get, list, create, update
(PUT), patch, delete and deletecollection, including the status subresource.

Semantics kept: server-set metadata (`uid`, `creationTimestamp`, `resourceVersion`,
`generation` — bumped when anything but metadata and status changes), `managedFields`
(`managed.py`), optimistic concurrency (a PUT needs `metadata.resourceVersion` on a custom
resource and gets 409 Conflict when it is stale), create-on-apply, status resets (the main
resource ignores `status`, `/status` ignores everything else), finalizers (delete sets
`deletionTimestamp` and the object goes when its finalizers are cleared), `dryRun=All`,
no-op writes (no new revision, no event), namespaces (`default`, `kube-system`, `kube-public`
and `kube-node-lease` exist from the start; a create, or an apply that creates, into a
namespace that does not exist is 404 `namespaces "X" not found`, as the NamespaceLifecycle
admission answers), and CRDs registering their resources. The built-in
workload kinds (Deployment, Service, ...) are decoded, defaulted and validated by
`builtin_kinds.py`.

`dryRun=All` on create, update, patch, apply and delete runs everything (decoding, defaulting,
validation, conflicts, managedFields) and answers with the object the write would have stored,
but stores nothing: no revision is taken, no event is sent, nothing is allocated. As on the
apiserver, a dry-run create's answer has a `uid` and `creationTimestamp` but no
`resourceVersion`; a dry-run update keeps the current one. Any other `dryRun` value is 422.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import random
import string
import uuid
from typing import Any

import yaml

from prospero.testkit.fake_kube import (
    builtin_kinds,
    errors,
    managed,
    patches,
    resources,
    schema,
    typed,
)
from prospero.testkit.fake_kube.errors import KubeError
from prospero.testkit.fake_kube.resources import ResourceType
from prospero.testkit.fake_kube.selectors import field_matcher, label_matcher
from prospero.testkit.fake_kube.store import Store

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Params:
    """The query parameters one request carries (first value of each)."""

    def __init__(self, q: dict[str, str]) -> None:
        self.q = q

    def get(self, k: str, default: str = "") -> str:
        return self.q.get(k, default)

    def flag(self, k: str) -> bool:
        return self.q.get(k, "").lower() in ("1", "true")


def manager_of(params: Params, user_agent: str) -> str:
    m = params.get("fieldManager")
    if m:
        return m
    return (user_agent.split("/", 1)[0] or "unknown")[:128]


class Kube:
    """The fake cluster's state and verbs (no HTTP here; `app.py` maps requests onto these)."""

    def __init__(self, store: Store | None = None) -> None:
        self.store = store or Store()
        self.registry = resources.Registry()
        self.warnings: list[str] = []  # per-request Warning headers (reset by the caller)
        self.ips = builtin_kinds.Allocator(self._cluster_ips)
        for ns in SYSTEM_NAMESPACES:
            self.create(resources.NAMESPACES, "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, Params({}), "kube-apiserver")

    # helpers -------------------------------------------------------------------------------

    def _nf(self, rt: ResourceType, name: str) -> KubeError:
        return errors.not_found(rt.plural, rt.group, name)

    def _require_namespace(self, rt: ResourceType, ns: str) -> None:
        if rt.namespaced and self.store.get(resources.NAMESPACES.key, "", ns) is None:
            raise errors.not_found("namespaces", "", ns)

    def _check_body(self, rt: ResourceType, ns: str, obj: Any, url_name: str | None) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise errors.bad_request("the object provided is unrecognized (must be of type map)")
        av, kind = obj.get("apiVersion"), obj.get("kind")
        if av != rt.api_version or kind != rt.kind:
            if not av or not kind:
                raise errors.bad_request(f"Object 'Kind' is missing in '{json.dumps(obj)[:200]}'")
            raise errors.bad_request(
                f"the API version in the data ({av}) does not match the expected API version ({rt.api_version})"
                if av != rt.api_version
                else f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})"
            )
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if url_name is not None and meta.get("name") and meta["name"] != url_name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({url_name})"
            )
        if url_name is not None:
            meta["name"] = url_name
        return obj

    def _cluster_ips(self) -> set[str]:
        out: set[str] = set()
        for svc in self.store.items(resources.SERVICES.key, None):
            out.update((svc.get("spec") or {}).get("clusterIPs") or [])
        return out

    def _unknown_fields(self, rt: ResourceType, unknown: list[str], params: Params) -> None:
        mode = params.get("fieldValidation", "Warn")
        if unknown and mode == "Strict":
            raise errors.bad_request(schema.unknown_field_message(rt.kind, rt.version, unknown))
        if unknown and mode == "Warn":
            self.warnings.extend(f'unknown field "{u}"' for u in unknown)

    def _validate(self, rt: ResourceType, obj: dict[str, Any], params: Params, old: dict[str, Any] | None = None) -> dict[str, Any]:
        meta = obj["metadata"]
        causes = schema.check_metadata(meta)
        if rt.custom:
            obj, outcome = schema.check_custom(rt.schema, obj)
            causes += outcome.causes
            self._unknown_fields(rt, outcome.unknown, params)
        elif rt.model is not None:
            unknown, more = builtin_kinds.check(rt, obj, old)
            self._unknown_fields(rt, unknown, params)
            causes += more
        elif rt is resources.CRDS:
            causes += self._crd_causes(obj)
        if causes:
            raise errors.invalid(rt.kind, rt.group, meta.get("name", ""), causes)
        return obj

    def _crd_causes(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        spec = obj.get("spec") or {}
        names = spec.get("names") or {}
        want = f"{names.get('plural', '')}.{spec.get('group', '')}"
        name = obj["metadata"].get("name", "")
        causes = []
        if name != want:
            causes.append({"reason": "FieldValueInvalid", "field": "metadata.name",
                           "message": f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group'})
        if not spec.get("versions"):
            causes.append({"reason": "FieldValueInvalid", "field": "spec.versions",
                           "message": "Invalid value: \"null\": must have exactly one version marked as storage version"})
        return causes

    def _prepare_new(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(k, None)
        if rt.custom or rt.generation or rt is resources.CRDS:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        if rt is resources.NAMESPACES:
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
        if rt is resources.SECRETS:
            self._secret(obj)
        if rt is resources.CRDS:
            self._crd_status(obj)
        if rt.model is not None:
            builtin_kinds.on_create(rt.kind, obj, self.ips)

    def _secret(self, obj: dict[str, Any]) -> None:
        string_data = obj.pop("stringData", None) or {}
        data = obj.setdefault("data", {})
        for k, v in string_data.items():
            data[k] = base64.b64encode(str(v).encode()).decode()
        obj.setdefault("type", "Opaque")

    def _crd_status(self, obj: dict[str, Any]) -> None:
        spec = obj.get("spec") or {}
        names = dict(spec.get("names") or {})
        names.setdefault("singular", names.get("kind", "").lower())
        names.setdefault("listKind", f"{names.get('kind', '')}List")
        t = now()
        obj["status"] = {
            "acceptedNames": names,
            "conditions": [
                {"lastTransitionTime": t, "message": "no conflicts found", "reason": "NoConflicts", "status": "True", "type": "NamesAccepted"},
                {"lastTransitionTime": t, "message": "the initial names have been accepted", "reason": "InitialNamesAccepted", "status": "True", "type": "Established"},
            ],
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
        }

    @staticmethod
    def _spec_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
        strip = ("metadata", "status", "apiVersion", "kind")
        return {k: v for k, v in old.items() if k not in strip} != {k: v for k, v in new.items() if k not in strip}

    @staticmethod
    def _same(old: dict[str, Any], new: dict[str, Any]) -> bool:
        def norm(o: dict[str, Any]) -> dict[str, Any]:
            o = copy.deepcopy(o)
            meta = o.get("metadata") or {}
            meta.pop("resourceVersion", None)
            for e in meta.get("managedFields") or []:
                e.pop("time", None)
            return o

        return norm(old) == norm(new)

    def _after_write(self, rt: ResourceType, obj: dict[str, Any] | None, name: str) -> None:
        if rt is not resources.CRDS:
            return
        if obj is None:
            for gone in self.registry.drop_crd(name):
                for item in self.store.items(gone.key, None):
                    m = item["metadata"]
                    self.store.remove(gone.key, m.get("namespace", ""), m["name"])
        else:
            self.registry.set_crd(name, resources.from_crd(obj))

    def _commit(self, rt: ResourceType, old: dict[str, Any] | None, new: dict[str, Any], params: Params) -> dict[str, Any]:
        if params.get("dryRun") == "All":
            if old is None:
                new["metadata"].pop("resourceVersion", None)
            return new
        if old is not None and self._same(old, new):
            return old
        if old is not None and old["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self.store.remove(rt.key, new["metadata"].get("namespace", ""), new["metadata"]["name"])
            self._after_write(rt, None, new["metadata"]["name"])
            new["metadata"]["resourceVersion"] = str(self.store.rv)
            return new
        stored = self.store.put(rt.key, new, "ADDED" if old is None else "MODIFIED")
        self._after_write(rt, stored, stored["metadata"]["name"])
        return stored

    # verbs ---------------------------------------------------------------------------------

    def get(self, rt: ResourceType, ns: str, name: str) -> dict[str, Any]:
        obj = self.store.get(rt.key, ns if rt.namespaced else "", name)
        if obj is None:
            raise self._nf(rt, name)
        return obj

    def list(self, rt: ResourceType, ns: str | None, params: Params) -> dict[str, Any]:
        lm = label_matcher(params.get("labelSelector"))
        fm = field_matcher(params.get("fieldSelector"), f"{rt.api_version}, Resource={rt.plural}", params.get("labelSelector"))
        rv_param, match = params.get("resourceVersion"), params.get("resourceVersionMatch")
        cont = params.get("continue")
        start, at = "", self.store.rv
        if cont:
            try:
                token = json.loads(base64.b64decode(cont))
                start, at = token["start"], int(token["rv"])
            except Exception as e:
                raise errors.bad_request(f"continue key is not valid: {e}") from e
            if at < self.store.horizon:
                raise errors.expired(
                    "The provided continue parameter is too old to display a consistent list result. "
                    "You can start a new list without the continue parameter, or use the continue "
                    "token in this response to retrieve the remainder of the results. Continuing "
                    "with the provided token results in an inconsistent list - objects that were "
                    "created, modified, or deleted between the time the first chunk was returned "
                    "and now may show up in the list."
                )
            items = self.store.snapshot(rt.key, ns, at)
        elif rv_param and match == "Exact":
            at = self._rv(rv_param)
            if at > self.store.rv:
                raise errors.too_large(at)
            items = self.store.snapshot(rt.key, ns, at)
        else:
            if rv_param and rv_param != "0" and self._rv(rv_param) > self.store.rv:
                raise errors.too_large(self._rv(rv_param))
            items = self.store.items(rt.key, ns)
        items = [o for o in items if lm(o) and fm(o)]
        if start:
            items = [o for o in items if _okey(o) >= start]
        meta: dict[str, Any] = {}
        limit = int(params.get("limit") or 0)
        if limit > 0 and len(items) > limit:
            rest = items[limit:]
            items = items[:limit]
            token = {"v": "meta.k8s.io/v1", "rv": at, "start": _okey(rest[0])}
            meta["continue"] = base64.b64encode(json.dumps(token).encode()).decode()
            meta["remainingItemCount"] = len(rest)
        elif rt.custom:
            meta["continue"] = ""
        meta["resourceVersion"] = str(at)
        if not rt.custom:
            for o in items:
                o.pop("kind", None)
                o.pop("apiVersion", None)
        return {"apiVersion": rt.api_version, "items": items, "kind": rt.list_kind, "metadata": meta}

    @staticmethod
    def _rv(s: str) -> int:
        try:
            return int(s)
        except ValueError as e:
            raise errors.bad_request(f'resourceVersion: Invalid value: "{s}": must be an integer') from e

    def create(self, rt: ResourceType, ns: str, body: Any, params: Params, ua: str, sub: str = "") -> dict[str, Any]:
        _dry_run_option(params, "CreateOptions")
        if sub:
            raise errors.method_not_supported(f"{rt.plural}/{sub}", rt.group, "create")
        obj = self._check_body(rt, ns, body, None)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        obj = self._validate(rt, obj, params)
        self._require_namespace(rt, ns)
        if self.store.get(rt.key, ns if rt.namespaced else "", obj["metadata"]["name"]) is not None:
            raise errors.already_exists(rt.plural, rt.group, obj["metadata"]["name"])
        self._prepare_new(rt, obj)
        if rt.status_subresource and rt.custom:
            obj.pop("status", None)
        obj["metadata"].pop("managedFields", None)
        managed.record_update(None, obj, manager=manager_of(params, ua), sub="", status_subresource=rt.status_subresource, now=now())
        return self._commit(rt, None, obj, params)

    def _carry(self, rt: ResourceType, old: dict[str, Any], new: dict[str, Any], sub: str) -> dict[str, Any]:
        """Keep what a write may not change: server metadata, and status or everything else
        depending on the subresource."""
        om, nm = old["metadata"], new["metadata"]
        for k in ("uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if k in om:
                nm[k] = om[k]
            else:
                nm.pop(k, None)
        if "managedFields" not in nm and "managedFields" in om:
            nm["managedFields"] = om["managedFields"]
        if sub == "status":
            out = {k: v for k, v in old.items() if k != "status"}
            out["metadata"] = {**om, "resourceVersion": nm.get("resourceVersion", om.get("resourceVersion"))}
            if "managedFields" in nm:
                out["metadata"]["managedFields"] = nm["managedFields"]
            if "status" in new:
                out["status"] = new["status"]
            return out
        if rt.status_subresource:
            new.pop("status", None)
            if "status" in old:
                new["status"] = old["status"]
        if rt is resources.NAMESPACES:
            new["spec"], new["status"] = old.get("spec"), old.get("status")
        if rt is resources.SECRETS:
            self._secret(new)
        if rt.model is not None:
            builtin_kinds.on_update(rt.kind, old, new)
        if "generation" in om and self._spec_changed(old, new):
            nm["generation"] = om["generation"] + 1
        return new

    def update(self, rt: ResourceType, ns: str, name: str, body: Any, params: Params, ua: str, sub: str = "") -> dict[str, Any]:
        _dry_run_option(params, "UpdateOptions")
        obj = self._check_body(rt, ns, body, name)
        key_ns = ns if rt.namespaced else ""
        old = self.store.get(rt.key, key_ns, name)
        if old is None:
            raise self._nf(rt, name)
        rv = obj["metadata"].get("resourceVersion")
        if not rv and rt.custom:
            raise errors.invalid(rt.kind, rt.group, name, [{"reason": "FieldValueInvalid", "field": "metadata.resourceVersion", "message": "Invalid value: 0x0: must be specified for an update"}])
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.plural, rt.group, name)
        new = self._carry(rt, old, obj, sub)
        new = self._validate(rt, new, params, old)
        managed.record_update(old, new, manager=manager_of(params, ua), sub=sub, status_subresource=rt.status_subresource, now=now())
        return self._commit(rt, old, new, params)

    def patch(self, rt: ResourceType, ns: str, name: str, content_type: str, raw: bytes, params: Params, ua: str, sub: str = "") -> tuple[dict[str, Any], bool]:
        """Returns (object, created): only an apply may create."""
        _dry_run_option(params, "PatchOptions")
        ctype = content_type.split(";")[0].strip()
        accepted = patches.CUSTOM_PATCH_TYPES if rt.custom else patches.BUILTIN_PATCH_TYPES
        if ctype not in accepted:
            raise errors.unsupported_media_type(accepted)
        if params.get("force") and ctype != patches.APPLY:
            raise errors.bad_request("force: Invalid value: true: may not be specified for non-apply patch")
        key_ns = ns if rt.namespaced else ""
        old = self.store.get(rt.key, key_ns, name)
        if ctype == patches.APPLY:
            return self._apply(rt, ns, name, old, raw, params, sub)
        try:
            doc = json.loads(raw or b"null")
        except ValueError as e:
            raise errors.bad_request(f"error decoding patch: {e}") from e
        if old is None:
            raise self._nf(rt, name)
        if ctype == patches.JSON_PATCH:
            patched = patches.json_patch(old, doc)
        else:
            if not isinstance(doc, dict):
                raise errors.bad_request("json: cannot unmarshal into Go value of type map[string]interface {}")
            patched = patches.merge_patch(old, doc)
        patched.setdefault("metadata", {})
        rv = patched["metadata"].get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.plural, rt.group, name)
        patched["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        obj = self._check_body(rt, ns, patched, name)
        new = self._carry(rt, old, obj, sub)
        new = self._validate(rt, new, params, old)
        managed.record_update(old, new, manager=manager_of(params, ua), sub=sub, status_subresource=rt.status_subresource, now=now())
        return self._commit(rt, old, new, params), False

    def _apply(self, rt: ResourceType, ns: str, name: str, old: dict[str, Any] | None, raw: bytes, params: Params, sub: str) -> tuple[dict[str, Any], bool]:
        manager = params.get("fieldManager")
        if not manager:
            raise errors.bad_request("PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch")
        try:
            applied = yaml.safe_load(raw or b"")
        except yaml.YAMLError as e:
            raise errors.bad_request(f"error decoding YAML: {e}") from e
        applied = self._check_body(rt, ns, applied, name)
        if rt.custom or rt.model is not None:
            if rt.custom:
                _checked, outcome = schema.check_custom(rt.schema, copy.deepcopy(applied))
                undeclared = outcome.unknown
            else:
                undeclared = typed.check(rt.model, rt.kind, rt.version, applied).unknown
            if undeclared:
                # the applied configuration must type-check against the schema, whatever
                # fieldValidation says: structured-merge-diff's plain error, a 500 Status
                errs = [f"{'.' + u}: field not declared in schema" for u in undeclared]
                detail = errs[0] if len(errs) == 1 else "errors:\n  " + "\n  ".join(errs)
                where = f"{ns}/{name}" if rt.namespaced else f"/{name}"
                raise KubeError(500, "", f"failed to create typed patch object ({where}; {rt.api_version}, Kind={rt.kind}): {detail}")
        if old is None and sub:
            raise self._nf(rt, name)
        if old is None:  # an apply that creates: admission refuses a namespace that is not there
            self._require_namespace(rt, ns)
        merged = managed.apply(old, applied, manager=manager, force=params.flag("force"), sub=sub, status_subresource=rt.status_subresource, now=now())
        for k in ("apiVersion", "kind"):
            merged[k] = applied[k]
        merged["metadata"]["name"] = name
        if rt.namespaced:
            merged["metadata"]["namespace"] = ns
        if old is None:
            self._prepare_new(rt, merged)
            if rt.custom and rt.status_subresource:
                merged.pop("status", None)
            merged = self._validate(rt, merged, params)
            return self._commit(rt, None, merged, params), True
        merged["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        new = self._carry(rt, old, merged, sub)
        new = self._validate(rt, new, params, old)
        return self._commit(rt, old, new, params), False

    def delete(self, rt: ResourceType, ns: str, name: str, options: dict[str, Any], params: Params) -> dict[str, Any]:
        """`options` is the request's DeleteOptions body; when it has one, its `dryRun` (a list,
        as kubectl sends it) counts, not the query's."""
        if options:
            dry = options.get("dryRun") or []
            if not isinstance(dry, list) or len(dry) > 1:
                dry = [",".join(map(str, dry))] if isinstance(dry, list) else [str(dry)]
            params = Params({**params.q, "dryRun": dry[0] if dry else ""})
        _dry_run_option(params, "DeleteOptions")
        key_ns = ns if rt.namespaced else ""
        old = self.store.get(rt.key, key_ns, name)
        if old is None:
            raise self._nf(rt, name)
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != old["metadata"].get("uid"):
            raise errors.conflict(rt.plural, rt.group, name, f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {old['metadata'].get('uid')}")
        if pre.get("resourceVersion") and pre["resourceVersion"] != old["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.plural, rt.group, name, f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, ResourceVersion in object meta: {old['metadata']['resourceVersion']}")
        if params.get("dryRun") == "All":
            return old
        if rt is resources.NAMESPACES:
            for (rkey, ons, oname) in [k for k in self.store.objects if k[1] == name and k[0] != rt.key]:
                self.store.remove(rkey, ons, oname)
            gone = self.store.remove(rt.key, "", name)
            assert gone is not None
            gone["metadata"]["deletionTimestamp"] = now()
            gone["status"] = {"phase": "Terminating"}
            return gone
        if old["metadata"].get("finalizers"):
            if old["metadata"].get("deletionTimestamp"):
                return old
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            if "generation" in new["metadata"]:
                new["metadata"]["generation"] += 1
            return self.store.put(rt.key, new, "MODIFIED")
        gone = self.store.remove(rt.key, key_ns, name)
        self._after_write(rt, None, name)
        assert gone is not None
        return gone

    def delete_collection(self, rt: ResourceType, ns: str | None, params: Params) -> dict[str, Any]:
        listed = self.list(rt, ns, params)
        for o in listed["items"]:
            m = o["metadata"]
            self.delete(rt, m.get("namespace", ""), m["name"], {}, params)
        return listed


def _dry_run_option(params: Params, options_kind: str) -> None:
    """`dryRun` may only be `All` (the apiserver's ValidateDryRun: 422 on the options kind)."""
    value = params.get("dryRun")
    if value and value != "All":
        raise errors.invalid(options_kind, "meta.k8s.io", "", [{
            "reason": "FieldValueNotSupported", "field": "dryRun",
            "message": f'Unsupported value: []string{{"{value}"}}: supported values: "All"',
        }])


def _okey(o: dict[str, Any]) -> str:
    m = o["metadata"]
    return f"{m.get('namespace', '')}/{m['name']}"
