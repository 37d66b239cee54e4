"""A built-in kind's body checked against its Go types, as kube-apiserver decodes it.

The apiserver decodes a built-in object (Deployment, Service, Role, ...) into its Go struct:
a value of the wrong JSON type is a 400 (`json: cannot unmarshal string into Go struct field
DeploymentSpec.spec.replicas of type int32`); a field the struct does not have is dropped, or,
with `fieldValidation=Strict` (kubectl's default), refused with `strict decoding error: unknown
field "spec.x"` (a `Warning` header with `Warn`); a field the OpenAPI schema marks required
and that is absent fails validation, 422 `Required value`.

The types come from lightkube's generated models (`lightkube.models.*`, a runtime dependency),
read with `msgspec.inspect`: the same field names, nesting and required lists as the
Kubernetes OpenAPI they are generated from. They follow a newer Kubernetes minor than the
1.32 the fake announces, so a field added since is accepted (a documented simplification);
Go's int32/int64 distinction is not in them, so a number is reported as `int32` or `int64`
by a short list of the 64-bit fields.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec
from msgspec import inspect as mi

from prospero.testkit.fake_kube.errors import bad_request

# the int64 fields among those the fake's built-ins carry (the rest are int32)
_INT64 = {
    "terminationGracePeriodSeconds", "activeDeadlineSeconds", "runAsUser", "runAsGroup",
    "fsGroup", "deletionGracePeriodSeconds", "generation", "observedGeneration",
}


@functools.cache
def struct_info(model: type[msgspec.Struct]) -> mi.StructType:
    info = mi.type_info(model)
    assert isinstance(info, mi.StructType)
    return info


class TypedOutcome:
    def __init__(self) -> None:
        self.unknown: list[str] = []
        self.required: list[str] = []


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _go_type(t: mi.Type, name: str) -> str:
    if isinstance(t, mi.IntType):
        return "int64" if name in _INT64 else "int32"
    if isinstance(t, mi.StrType | mi.DateTimeType):
        return "string"
    if isinstance(t, mi.BoolType):
        return "bool"
    if isinstance(t, mi.FloatType):
        return "float64"
    if isinstance(t, mi.ListType):
        return "[]" + _go_type(t.item_type, name)
    if isinstance(t, mi.DictType):
        return "map[string]string"
    if isinstance(t, mi.StructType):
        return f"v1.{t.cls.__name__}"
    return "interface {}"


def _fits(t: mi.Type, v: Any) -> bool:
    if isinstance(t, mi.AnyType):
        return True
    if isinstance(t, mi.NoneType):
        return v is None
    if isinstance(t, mi.UnionType):
        return any(_fits(m, v) for m in t.types)
    if isinstance(t, mi.IntType):
        return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
    if isinstance(t, mi.FloatType):
        return isinstance(v, int | float) and not isinstance(v, bool)
    if isinstance(t, mi.StrType | mi.DateTimeType):
        return isinstance(v, str)
    if isinstance(t, mi.BoolType):
        return isinstance(v, bool)
    if isinstance(t, mi.ListType):
        return isinstance(v, list)
    if isinstance(t, mi.DictType | mi.StructType):
        return isinstance(v, dict)
    return True


def _unwrap(t: mi.Type, v: Any) -> mi.Type:
    """The member of an Optional/IntOrString union that `v` decodes into."""
    if isinstance(t, mi.UnionType):
        for m in t.types:
            if not isinstance(m, mi.NoneType) and _fits(m, v):
                return m
    return t


def check(model: type[msgspec.Struct], kind: str, version: str, obj: dict[str, Any]) -> TypedOutcome:
    """Walk the object's body (not apiVersion/kind/metadata, checked elsewhere). Raises the
    apiserver's 400 on a type mismatch; returns the unknown and missing required fields."""
    out = TypedOutcome()
    info = struct_info(model)
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    _walk_struct(info, body, "", model.__name__, kind, version, out)
    return out


def _walk_struct(info: mi.StructType, value: dict[str, Any], path: str, owner: str, kind: str, version: str, out: TypedOutcome) -> None:
    fields = {f.encode_name: f for f in info.fields}
    for key, v in value.items():
        here = f"{path}.{key}" if path else key
        f = fields.get(key)
        if f is None:
            if path or key not in ("apiVersion", "kind", "metadata"):
                out.unknown.append(here)
            continue
        if v is None:
            continue  # null is the Go zero value: as if absent
        _walk(f.type, v, here, key, info.cls.__name__, kind, version, out)
    for f in info.fields:
        if f.required and value.get(f.encode_name) is None and f.encode_name not in ("apiVersion", "kind", "metadata"):
            out.required.append(f"{path}.{f.encode_name}" if path else f.encode_name)


def _walk(t: mi.Type, v: Any, path: str, name: str, owner: str, kind: str, version: str, out: TypedOutcome) -> None:
    if not _fits(t, v):
        want = _unwrap(t, v)
        if isinstance(want, mi.UnionType):
            want = next(m for m in want.types if not isinstance(m, mi.NoneType))
        raise bad_request(
            f'{kind} in version "{version}" cannot be handled as a {kind}: json: cannot unmarshal '
            f"{_json_type(v)} into Go struct field {owner}.{path} of type {_go_type(want, name)}"
        )
    t = _unwrap(t, v)
    if isinstance(t, mi.StructType):
        _walk_struct(t, v, path, owner, kind, version, out)
    elif isinstance(t, mi.ListType):
        for i, item in enumerate(v):
            if item is not None:
                _walk(t.item_type, item, f"{path}[{i}]", name, owner, kind, version, out)
    elif isinstance(t, mi.DictType):
        for k, item in v.items():
            if not isinstance(item, str | int | float) and not isinstance(t.value_type, mi.AnyType):
                _walk(t.value_type, item, f"{path}[{k}]", name, owner, kind, version, out)
            elif isinstance(item, dict | list) and path.endswith(("labels", "annotations", "selector", "matchLabels", "nodeSelector")):
                raise bad_request(
                    f'{kind} in version "{version}" cannot be handled as a {kind}: json: cannot '
                    f"unmarshal {_json_type(item)} into Go struct field {owner}.{path} of type string"
                )
