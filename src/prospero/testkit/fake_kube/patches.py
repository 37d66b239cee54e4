"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902), as the apiserver applies them.

`application/strategic-merge-patch+json` is accepted for the built-in types only and applied
as a merge patch (the built-ins here have no lists with patch strategies that matter); a custom
resource refuses it with the apiserver's 415.
"""

from __future__ import annotations

import copy
from typing import Any

from prospero.testkit.fake_kube.errors import KubeError, bad_request

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
CUSTOM_PATCH_TYPES = [JSON_PATCH, MERGE, APPLY]
BUILTIN_PATCH_TYPES = [JSON_PATCH, MERGE, STRATEGIC, APPLY]


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _parts(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"the server rejected our request due to an error in our request: {path!r}")
    return [_unescape(t) for t in path[1:].split("/")]


def _fail(op: str, path: str, why: str) -> KubeError:
    return KubeError(422, "Invalid", f"the server rejected our request due to an error in our request: {op} operation does not apply: {why}: {path}")


def _resolve(doc: Any, parts: list[str], op: str, path: str) -> Any:
    node = doc
    for p in parts:
        if isinstance(node, dict) and p in node:
            node = node[p]
        elif isinstance(node, list) and p.isdigit() and int(p) < len(node):
            node = node[int(p)]
        else:
            raise _fail(op, path, "doc is missing path")
    return node


def _add(doc: Any, parts: list[str], value: Any, op: str, path: str) -> Any:
    if not parts:
        return value
    parent = _resolve(doc, parts[:-1], op, path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise _fail(op, path, "doc is missing path")
    else:
        raise _fail(op, path, "doc is missing path")
    return doc


def _remove(doc: Any, parts: list[str], op: str, path: str) -> Any:
    parent = _resolve(doc, parts[:-1], op, path)
    last = parts[-1] if parts else ""
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise _fail(op, path, "doc is missing path")


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(target)
    for o in ops:
        if not isinstance(o, dict) or "op" not in o:
            raise bad_request("the server rejected our request due to an error in our request")
        op, path = o["op"], o.get("path", "")
        parts = _parts(path)
        if op == "add":
            doc = _add(doc, parts, copy.deepcopy(o.get("value")), op, path)
        elif op == "remove":
            _remove(doc, parts, op, path)
        elif op == "replace":
            _resolve(doc, parts, op, path)
            if parts:
                _remove(doc, parts, op, path)
            doc = _add(doc, parts, copy.deepcopy(o.get("value")), op, path)
        elif op == "move":
            val = _remove(doc, _parts(o.get("from", "")), op, path)
            doc = _add(doc, parts, val, op, path)
        elif op == "copy":
            val = copy.deepcopy(_resolve(doc, _parts(o.get("from", "")), op, path))
            doc = _add(doc, parts, val, op, path)
        elif op == "test":
            if _resolve(doc, parts, op, path) != o.get("value"):
                raise KubeError(
                    422,
                    "Invalid",
                    f"the server rejected our request due to an error in our request: testing value {path} failed: test failed",
                )
        else:
            raise bad_request(f"Unexpected kind: {op}")
    return doc
