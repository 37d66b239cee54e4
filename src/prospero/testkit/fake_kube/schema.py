"""A custom resource's structural schema at write time: defaulting, pruning, validation.

What kube-apiserver does with a CRD's `openAPIV3Schema` on create/update/patch, reduced to
the keywords the caliban CRDs use: `type`, `properties`, `required`, `items`, `enum`,
`default`, `minLength`, `minItems`, `additionalProperties` (schema form) and
`x-kubernetes-preserve-unknown-fields`. Unknown fields are pruned; with
`fieldValidation=Strict` (kubectl's default) they are refused instead, with the apiserver's
`strict decoding error: unknown field "spec.x"`, and with `Warn` reported as a `Warning`
header. Failures are 422 `Invalid` with one cause per field, worded like the apiserver's
(`spec.task.prompt: Required value`, `Unsupported value: "x": supported values: ...`).
"""

from __future__ import annotations

import json
import re
from typing import Any

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)


def _type_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _matches(t: str, v: Any) -> bool:
    actual = _type_of(v)
    return actual == t or (t == "number" and actual == "integer")


def _go(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _cause(reason: str, field: str, message: str) -> dict[str, Any]:
    return {"reason": reason, "message": message, "field": field}


class Outcome:
    def __init__(self) -> None:
        self.causes: list[dict[str, Any]] = []
        self.unknown: list[str] = []


def _walk(schema: dict[str, Any], value: Any, path: str, out: Outcome) -> Any:
    t = schema.get("type")
    if t and not _matches(t, value):
        if value is None and schema.get("nullable"):
            return value
        out.causes.append(
            _cause(
                "FieldValueTypeInvalid",
                path,
                f'Invalid value: "{_type_of(value)}": {path} in body must be of type {t}: '
                f'"{_type_of(value)}"',
            )
        )
        return value
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_go(e) for e in schema["enum"])
        out.causes.append(
            _cause(
                "FieldValueNotSupported",
                path,
                f"Unsupported value: {_go(value)}: supported values: {supported}",
            )
        )
    if isinstance(value, str) and "minLength" in schema and len(value) < schema["minLength"]:
        out.causes.append(
            _cause(
                "FieldValueInvalid",
                path,
                f"Invalid value: {_go(value)}: {path} in body should be at least "
                f"{schema['minLength']} chars long",
            )
        )
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            out.causes.append(
                _cause(
                    "FieldValueInvalid",
                    path,
                    f"Invalid value: {len(value)}: {path} in body should have at least "
                    f"{schema['minItems']} items",
                )
            )
        items = schema.get("items")
        if isinstance(items, dict):
            return [_walk(items, v, f"{path}[{i}]", out) for i, v in enumerate(value)]
        return value
    if isinstance(value, dict):
        return _walk_object(schema, value, path, out)
    return value


def _walk_object(schema: dict[str, Any], value: dict[str, Any], path: str, out: Outcome) -> Any:
    props: dict[str, Any] = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    result: dict[str, Any] = {}
    # an object's own required fields are reported before its children's (go-openapi's order)
    for k in schema.get("required") or []:
        sub = props.get(k)
        if k not in value and not (isinstance(sub, dict) and "default" in sub):
            out.causes.append(
                _cause("FieldValueRequired", f"{path}.{k}" if path else k, "Required value")
            )
    for k, v in value.items():
        child = f"{path}.{k}" if path else k
        if k in props:
            result[k] = _walk(props[k], v, child, out)
        elif isinstance(extra, dict):
            result[k] = _walk(extra, v, child, out)
        elif preserve or extra is True or (not props and extra is None and "type" not in schema):
            result[k] = v
        else:
            out.unknown.append(child)
    for k, sub in props.items():
        if k not in result and isinstance(sub, dict) and "default" in sub:
            result[k] = json.loads(json.dumps(sub["default"]))
    return result


def check_custom(schema: dict[str, Any] | None, obj: dict[str, Any]) -> tuple[dict[str, Any], Outcome]:
    """Default, prune and validate a custom resource's body (not its metadata)."""
    out = Outcome()
    if not schema:
        return obj, out
    top = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    props = dict(schema.get("properties") or {})
    for k in ("apiVersion", "kind", "metadata"):
        props.pop(k, None)
    body = _walk_object({**schema, "properties": props}, top, "", out)
    result: dict[str, Any] = {k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}
    result.update(body)
    return result, out


def check_metadata(meta: dict[str, Any]) -> list[dict[str, Any]]:
    causes: list[dict[str, Any]] = []
    name = meta.get("name")
    if not name:
        causes.append(
            _cause(
                "FieldValueRequired",
                "metadata.name",
                "Required value: name or generateName is required",
            )
        )
    elif not isinstance(name, str) or len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        causes.append(
            _cause("FieldValueInvalid", "metadata.name", f"Invalid value: {_go(name)}: {_DNS1123_MSG}")
        )
    for key in ("labels", "annotations"):
        m = meta.get(key)
        if m is not None and not (
            isinstance(m, dict) and all(isinstance(v, str) for v in m.values())
        ):
            causes.append(
                _cause(
                    "FieldValueTypeInvalid",
                    f"metadata.{key}",
                    f"Invalid value: {_go(m)}: must be a map of strings",
                )
            )
    return causes


def unknown_field_message(kind: str, version: str, unknown: list[str]) -> str:
    fields = ", ".join(f'unknown field "{u}"' for u in unknown)
    return (
        f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding error: '
        f"{fields}"
    )
