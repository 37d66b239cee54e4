"""Field management: `metadata.managedFields` and server-side apply.

A simplified model of structured-merge-diff, documented here because it is not the whole of it:

- A field set is a set of paths (tuples of map keys). Maps are granular; **lists are atomic**
  (a list is one leaf owned as a whole: the caliban CRDs declare no `x-kubernetes-list-type:
  map`). An empty map is a leaf.
- Tracked: every top-level field but `apiVersion`, `kind`, `metadata`, and of `metadata` only
  `labels`, `annotations`, `finalizers` and `ownerReferences`. With a `status` subresource the
  main resource tracks everything but `status`, and `/status` tracks only `status`.
- **Apply** (`application/apply-patch+yaml`, `fieldManager` required): the manager's set
  becomes exactly the leaves of the applied configuration. A leaf another manager (any
  operation) owns whose value the apply would change is a conflict — 409 with one
  `FieldManagerConflict` cause per field, unless `force=true`, which takes the field over.
  Equal values are co-owned. A field the manager applied before and omits now is removed from
  the object unless another manager still owns it.
- **Update** (create, PUT, merge/JSON patch): the manager (`fieldManager`, else the user agent
  up to its first `/`) gains every leaf it added or changed and every map it created (`.`);
  other managers lose what it changed; fields that vanished are dropped from every set.
- Entries are keyed by (manager, operation, subresource); an entry left with no fields is
  removed; `time` is the write's second; `fieldsV1` uses only `f:` and `.` keys.
"""

from __future__ import annotations

import copy
from typing import Any

from prospero.testkit.fake_kube.errors import apply_conflict

Path = tuple[str, ...]
_MISSING = object()
META_TRACKED = ("labels", "annotations", "finalizers", "ownerReferences")


def tracked(obj: dict[str, Any], sub: str, status_subresource: bool) -> dict[str, Any]:
    """The part of `obj` field management looks at, for a write to `sub` ('' or 'status')."""
    if sub == "status":
        return {"status": obj["status"]} if "status" in obj else {}
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if k in ("apiVersion", "kind"):
            continue
        if k == "metadata":
            meta = {mk: v[mk] for mk in META_TRACKED if isinstance(v, dict) and mk in v}
            if meta:
                out["metadata"] = meta
            continue
        if k == "status" and status_subresource:
            continue
        out[k] = v
    return out


def leaves(obj: Any, prefix: Path = ()) -> set[Path]:
    if isinstance(obj, dict) and obj:
        out: set[Path] = set()
        for k, v in obj.items():
            out |= leaves(v, (*prefix, k))
        return out
    return {prefix} if prefix else set()


def maps(obj: Any, prefix: Path = ()) -> set[Path]:
    """Paths of the (non-root) maps in obj."""
    out: set[Path] = set()
    if isinstance(obj, dict):
        if prefix:
            out.add(prefix)
        for k, v in obj.items():
            out |= maps(v, (*prefix, k))
    return out


def get(obj: Any, path: Path) -> Any:
    for k in path:
        if not isinstance(obj, dict) or k not in obj:
            return _MISSING
        obj = obj[k]
    return obj


def delete(obj: dict[str, Any], path: Path) -> None:
    """Remove the field at path, then any map it leaves empty below the top level."""
    parents: list[tuple[dict[str, Any], str]] = []
    node: Any = obj
    for k in path[:-1]:
        if not isinstance(node, dict) or k not in node:
            return
        parents.append((node, k))
        node = node[k]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    for parent, k in reversed(parents[1:]):
        if parent[k] == {}:
            del parent[k]
        else:
            break


def overlaps(p: Path, q: Path) -> bool:
    n = min(len(p), len(q))
    return p[:n] == q[:n]


def merge(dst: dict[str, Any], src: dict[str, Any]) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict) and v:
            merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)


# fieldsV1 -----------------------------------------------------------------------------------


def encode(paths: set[Path]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for p in sorted(paths):
        node = root
        for k in p:
            node = node.setdefault(f"f:{k}", {})
    for p in paths:
        node = root
        for k in p:
            node = node[f"f:{k}"]
        if node:
            node["."] = {}
    return root


def decode(fields: Any, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    if not isinstance(fields, dict) or not fields:
        return {prefix} if prefix else set()
    for k, v in fields.items():
        if k == ".":
            if prefix:
                out.add(prefix)
        elif k.startswith("f:"):
            out |= decode(v, (*prefix, k[2:]))
        elif prefix:
            out.add(prefix)  # k:/v:/i: list members: the list is atomic here
    return out


def _entry(manager: str, operation: str, api_version: str, now: str, paths: set[Path], sub: str) -> dict[str, Any]:
    e: dict[str, Any] = {
        "apiVersion": api_version,
        "fieldsType": "FieldsV1",
        "fieldsV1": encode(paths),
        "manager": manager,
        "operation": operation,
    }
    if sub:
        e["subresource"] = sub
    e["time"] = now
    return e


def _key(e: dict[str, Any]) -> tuple[str, str, str]:
    return (e.get("manager", ""), e.get("operation", ""), e.get("subresource", ""))


def printed_manager(e: dict[str, Any]) -> str:
    s = f'"{e.get("manager", "")}"'
    if e.get("subresource"):
        s += f' with subresource "{e["subresource"]}"'
    if e.get("operation") == "Update":
        s += f" using {e.get('apiVersion', '')}"
        if e.get("time"):
            s += f" at {e['time']}"
    return s


def _fmt(p: Path) -> str:
    return "." + ".".join(p)


def apply(
    current: dict[str, Any] | None,
    applied: dict[str, Any],
    *,
    manager: str,
    force: bool,
    sub: str,
    status_subresource: bool,
    now: str,
) -> dict[str, Any]:
    """The object after `manager` applies `applied` to `current` (None: it does not exist),
    with its managedFields. Raises the 409 apply conflict."""
    base = copy.deepcopy(current) if current is not None else {}
    entries: list[dict[str, Any]] = copy.deepcopy(
        (base.get("metadata") or {}).get("managedFields") or []
    )
    want = tracked(applied, sub, status_subresource)
    new_set = leaves(want)
    me = (manager, "Apply", sub)
    conflicts: list[tuple[str, str]] = []
    taken: set[Path] = set()
    for e in entries:
        if _key(e) == me:
            continue
        for q in decode(e.get("fieldsV1")):
            for p in new_set:
                if not overlaps(p, q):
                    continue
                at = p if len(p) <= len(q) else q
                if get(base, at) != get(want, at):
                    taken.add(q)
                    conflicts.append((printed_manager(e), _fmt(q)))
    if conflicts and not force:
        seen: set[tuple[str, str]] = set()
        uniq = [c for c in conflicts if not (c in seen or seen.add(c))]  # type: ignore[func-returns-value]
        raise apply_conflict(uniq)
    old_set: set[Path] = set()
    for e in entries:
        if _key(e) == me:
            old_set = decode(e.get("fieldsV1"))
    others = [decode(e.get("fieldsV1")) for e in entries if _key(e) != me]
    for p in sorted(old_set - new_set, key=len, reverse=True):
        if any(p in s for s in others):
            continue
        if any(overlaps(p, q) for q in new_set):
            continue
        delete(base, p)
    merge(base, want)
    kept: list[dict[str, Any]] = []
    placed = False
    for e in entries:
        if _key(e) == me:
            if new_set:
                kept.append(_entry(manager, "Apply", applied.get("apiVersion", ""), now, new_set, sub))
            placed = True
            continue
        paths = decode(e.get("fieldsV1"))
        if taken & paths:
            paths -= taken
            if not paths:
                continue
            e["fieldsV1"] = encode(paths)
        kept.append(e)
    if not placed and new_set:
        kept.append(_entry(manager, "Apply", applied.get("apiVersion", ""), now, new_set, sub))
    base.setdefault("metadata", {})["managedFields"] = kept
    return base


def record_update(
    old: dict[str, Any] | None,
    new: dict[str, Any],
    *,
    manager: str,
    sub: str,
    status_subresource: bool,
    now: str,
) -> None:
    """Set `new`'s managedFields after an Update-type write by `manager` (in place)."""
    meta = new.setdefault("metadata", {})
    if "managedFields" in meta and old is not None:
        old_entries = (old.get("metadata") or {}).get("managedFields") or []
        if meta["managedFields"] != old_entries:
            return  # the client set managedFields itself: they are taken as sent
    entries: list[dict[str, Any]] = copy.deepcopy(
        ((old or {}).get("metadata") or {}).get("managedFields") or []
    )
    o = tracked(old or {}, sub, status_subresource)
    n = tracked(new, sub, status_subresource)
    changed_leaves = {p for p in leaves(n) if get(o, p) != get(n, p)}
    created_maps = {p for p in maps(n) if get(o, p) is _MISSING}
    me = (manager, "Update", sub)

    def lost(q: Path) -> bool:
        for c in changed_leaves:
            if not overlaps(q, c):
                continue
            if len(q) >= len(c) or not isinstance(get(o, q), dict):
                return True
        return False

    kept: list[dict[str, Any]] = []
    mine: set[Path] = changed_leaves | created_maps
    at = -1
    for e in entries:
        paths = decode(e.get("fieldsV1"))
        if _key(e) == me:
            mine |= paths
            at = len(kept)
            continue
        paths = {q for q in paths if not lost(q) and get(new, q) is not _MISSING}
        if paths:
            e["fieldsV1"] = encode(paths)
            kept.append(e)
    mine = {q for q in mine if get(new, q) is not _MISSING}
    if mine:
        entry = _entry(manager, "Update", new.get("apiVersion", ""), now, mine, sub)
        if at >= 0:
            kept.insert(at, entry)
        else:
            kept.append(entry)
    meta["managedFields"] = kept
