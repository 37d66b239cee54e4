"""`Status` failures exactly as kube-apiserver writes them (k8s.io/apimachinery api/errors).

Every refusal the fake makes is a `KubeError` carrying the `metav1.Status` body and its HTTP
code; the HTTP layer writes it as JSON. Messages follow the apiserver's wording, because
clients (kubectl above all) print them verbatim, e.g.
`Error from server (NotFound): calibantasks.caliban.caliban-ai.dev "x" not found`.
"""

from __future__ import annotations

from typing import Any


class KubeError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:  # an error that is not a Status (500) has no reason
            body["reason"] = self.reason
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def qualified(resource: str, group: str) -> str:
    """`calibantasks.caliban.caliban-ai.dev`, or `namespaces` for the core group."""
    return f"{resource}.{group}" if group else resource


def _details(name: str, group: str, kind: str) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if name:
        d["name"] = name
    if group:
        d["group"] = group
    d["kind"] = kind
    return d


def not_found(resource: str, group: str, name: str) -> KubeError:
    return KubeError(
        404,
        "NotFound",
        f'{qualified(resource, group)} "{name}" not found',
        _details(name, group, resource),
    )


def not_found_path() -> KubeError:
    """An unknown URL (no such group, version or resource): the apiserver's bare 404."""
    return KubeError(404, "NotFound", "the server could not find the requested resource", {})


def already_exists(resource: str, group: str, name: str) -> KubeError:
    return KubeError(
        409,
        "AlreadyExists",
        f'{qualified(resource, group)} "{name}" already exists',
        _details(name, group, resource),
    )


OPTIMISTIC_LOCK = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def conflict(resource: str, group: str, name: str, why: str = OPTIMISTIC_LOCK) -> KubeError:
    return KubeError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(resource, group)} "{name}": {why}',
        _details(name, group, resource),
    )


def invalid(kind: str, group: str, name: str, causes: list[dict[str, Any]]) -> KubeError:
    """422; `causes` are `{reason, message, field}` (message already prefixed by its kind of
    failure, e.g. `Required value`)."""
    parts = [f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    gk = f"{kind}.{group}" if group else kind
    d = _details(name, group, kind)
    d["causes"] = causes
    return KubeError(422, "Invalid", f'{gk} "{name}" is invalid: {joined}', d)


def bad_request(message: str) -> KubeError:
    return KubeError(400, "BadRequest", message)


def expired(message: str) -> KubeError:
    return KubeError(410, "Expired", message)


def too_old(rv: int, oldest: int) -> KubeError:
    """What the watch cache answers for a resourceVersion older than its window."""
    return expired(f"too old resource version: {rv} ({oldest})")


def too_large(rv: int) -> KubeError:
    return KubeError(
        504,
        "Timeout",
        f"Too large resource version: {rv}, current: {rv - 1}",
        {
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": 1,
        },
    )


def unsupported_media_type(accepted: list[str]) -> KubeError:
    return KubeError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(accepted),
    )


def method_not_supported(resource: str, group: str, verb: str) -> KubeError:
    return KubeError(
        405,
        "MethodNotAllowed",
        f"{verb} is not supported on resources of kind {qualified(resource, group)!r}",
        _details("", group, resource),
    )


def apply_conflict(conflicts: list[tuple[str, str]]) -> KubeError:
    """`conflicts`: (printed manager, field path `.spec.x`), the way structured-merge-diff's
    NewConflictError words them."""
    causes = [
        {"reason": "FieldManagerConflict", "message": f"conflict with {m}", "field": p}
        for m, p in conflicts
    ]
    if len(conflicts) == 1:
        m, p = conflicts[0]
        msg = f"Apply failed with 1 conflict: conflict with {m}: {p}"
    else:
        by: dict[str, list[str]] = {}
        for m, p in conflicts:
            by.setdefault(m, []).append(p)
        lines: list[str] = []
        for m in sorted(by):
            lines.append(f"conflicts with {m}:")
            lines.extend(f"- {p}" for p in by[m])
        msg = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return KubeError(409, "Conflict", msg, {"causes": causes})
