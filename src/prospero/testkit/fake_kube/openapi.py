"""`/openapi/v3`: the published OpenAPI v3 documents, as much of them as clients read.

kubectl (1.32) fetches `/openapi/v3` before `apply`/`create` to learn whether the server does
field validation: it looks up the PATCH operation tagged with the object's
`x-kubernetes-group-version-kind` and checks for a `fieldValidation` query parameter. With it,
kubectl sends `fieldValidation=Strict` and leaves validation to the server (`schema.py`);
without a document it would insist on downloading OpenAPI v2 for client-side validation.
Each group-version document lists the resources' paths and operations with their
`x-kubernetes-action` and GVK, and, for custom resources, the CRD's schema as a component.
The root lists the group-versions with a content hash, as the apiserver does.
`/openapi/v2` stays 404 (a server may publish only v3).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from prospero.testkit.fake_kube.resources import Registry, ResourceType

_QUERY = ["dryRun", "fieldManager", "fieldValidation", "pretty"]


def _params(names: list[str]) -> list[dict[str, Any]]:
    return [{"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}} for n in names]


def _component(rt: ResourceType) -> str:
    if rt.group:
        rev = ".".join(reversed(rt.group.split(".")))
        return f"{rev}.{rt.version}.{rt.kind}"
    return f"io.k8s.api.core.{rt.version}.{rt.kind}"


def _op(rt: ResourceType, action: str, op_id: str, params: list[str], body_types: list[str] | None = None) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{_component(rt)}"}
    op: dict[str, Any] = {
        "tags": [f"{rt.group or 'core'}_{rt.version}"],
        "operationId": op_id,
        "parameters": _params(params),
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": rt.group, "kind": rt.kind, "version": rt.version},
    }
    if body_types:
        op["requestBody"] = {"content": {t: {"schema": ref} for t in body_types}, "required": True}
    return op


def _paths(rt: ResourceType) -> dict[str, Any]:
    prefix = f"/apis/{rt.group}/{rt.version}" if rt.group else f"/api/{rt.version}"
    ns = "/namespaces/{namespace}" if rt.namespaced else ""
    scope = "Namespaced" if rt.namespaced else ""
    collection = f"{prefix}{ns}/{rt.plural}"
    item = f"{collection}/{{name}}"
    patch_types = ["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"]
    out = {
        collection: {
            "get": _op(rt, "list", f"list{scope}{rt.kind}", ["labelSelector", "fieldSelector", "limit", "continue", "resourceVersion", "resourceVersionMatch", "watch", "allowWatchBookmarks", "sendInitialEvents", "timeoutSeconds"]),
            "post": _op(rt, "post", f"create{scope}{rt.kind}", _QUERY, ["*/*"]),
            "delete": _op(rt, "deletecollection", f"deleteCollection{scope}{rt.kind}", ["labelSelector", "fieldSelector", "dryRun"]),
        },
        item: {
            "get": _op(rt, "get", f"read{scope}{rt.kind}", ["pretty"]),
            "put": _op(rt, "put", f"replace{scope}{rt.kind}", _QUERY, ["*/*"]),
            "patch": _op(rt, "patch", f"patch{scope}{rt.kind}", [*_QUERY, "force"], patch_types),
            "delete": _op(rt, "delete", f"delete{scope}{rt.kind}", ["dryRun", "gracePeriodSeconds", "propagationPolicy"]),
        },
    }
    if rt.status_subresource:
        out[f"{item}/status"] = {
            "get": _op(rt, "get", f"read{scope}{rt.kind}Status", ["pretty"]),
            "put": _op(rt, "put", f"replace{scope}{rt.kind}Status", _QUERY, ["*/*"]),
            "patch": _op(rt, "patch", f"patch{scope}{rt.kind}Status", [*_QUERY, "force"], patch_types),
        }
    return out


def _schema(rt: ResourceType) -> dict[str, Any]:
    base: dict[str, Any] = dict(rt.schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
    props = dict(base.get("properties") or {})
    props.setdefault("apiVersion", {"type": "string"})
    props.setdefault("kind", {"type": "string"})
    props.setdefault("metadata", {"type": "object"})
    base["properties"] = props
    base["x-kubernetes-group-version-kind"] = [{"group": rt.group, "kind": rt.kind, "version": rt.version}]
    return base


def gv_path(rt: ResourceType) -> str:
    return f"apis/{rt.group}/{rt.version}" if rt.group else f"api/{rt.version}"


def documents(registry: Registry) -> dict[str, dict[str, Any]]:
    """The group-version documents by their path (`api/v1`, `apis/<g>/<v>`)."""
    docs: dict[str, dict[str, Any]] = {}
    for rt in registry.all():
        doc = docs.setdefault(
            gv_path(rt),
            {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"}, "paths": {}, "components": {"schemas": {}}},
        )
        doc["paths"].update(_paths(rt))
        doc["components"]["schemas"][_component(rt)] = _schema(rt)
    return docs


def _hash(doc: dict[str, Any]) -> str:
    return hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest().upper()


def root(registry: Registry) -> dict[str, Any]:
    return {
        "paths": {
            path: {"serverRelativeURL": f"/openapi/v3/{path}?hash={_hash(doc)}"}
            for path, doc in sorted(documents(registry).items())
        }
    }
