"""Label and field selectors as the apiserver parses them.

Labels: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, comma-joined (AND).
Fields: `metadata.name` and `metadata.namespace` with `=`, `==`, `!=` (what a custom resource
supports); any other field label is a 400 the way the apiserver words it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from prospero.testkit.fake_kube.errors import KubeError, bad_request

Matcher = Callable[[dict[str, Any]], bool]

_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*$")


def _split(selector: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p for p in parts if p.strip()]


def _label_ok(op: str, key: str, values: frozenset[str], labels: dict[str, str]) -> bool:
    if op in ("=", "=="):
        return key in labels and labels[key] in values
    if op == "!=":
        return labels.get(key) not in values
    if op == "in":
        return labels.get(key) in values
    if op == "notin":
        return labels.get(key) not in values
    if op == "exists":
        return key in labels
    return key not in labels  # "!"


def label_matcher(selector: str | None) -> Matcher:
    if not selector:
        return lambda _obj: True
    reqs: list[tuple[str, str, frozenset[str]]] = []
    for part in _split(selector):
        m = _EQ_RE.match(part)
        if m:
            key, op, val = m.groups()
            reqs.append((op, key, frozenset([val])))
            continue
        m = _SET_RE.match(part)
        if not m:
            raise bad_request(f"unable to parse requirement: <nil>: Invalid value: {part.strip()!r}")
        neg, key, op, vals = m.groups()
        if op:
            reqs.append((op, key, frozenset(v.strip() for v in vals.split(",") if v.strip())))
        else:
            reqs.append(("!" if neg else "exists", key, frozenset()))

    def match(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(_label_ok(op, k, vs, labels) for op, k, vs in reqs)

    return match


FIELDS = {"metadata.name": "name", "metadata.namespace": "namespace"}


def field_matcher(selector: str | None, describe: str, label_selector: str | None) -> Matcher:
    """`describe`: the resource as the error names it (`caliban.caliban-ai.dev/v1alpha1,
    Resource=calibantasks`)."""
    if not selector:
        return lambda _obj: True
    reqs: list[tuple[str, bool, str]] = []  # (metadata attribute, negated, value)
    for part in _split(selector):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if not m:
            raise bad_request(f"invalid selector: '{selector}'; can't understand '{part}'")
        field, op, val = m.groups()
        if field not in FIELDS:
            raise KubeError(
                400,
                "BadRequest",
                f'Unable to find "{describe}" that match label selector "{label_selector or ""}", '
                f'field selector "{selector}": field label not supported: {field}',
            )
        reqs.append((FIELDS[field], op == "!=", val))

    def match(obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return all((meta.get(a, "") == v) != neg for a, neg, v in reqs)

    return match
