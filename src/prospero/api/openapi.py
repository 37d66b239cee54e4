"""The OpenAPI document prosperod serves at `/openapi.json`: what the server really does.

FastAPI derives paths, parameters and bodies from the routes; this module adds what it cannot
see, because it happens outside the route handlers:

* every error is the `{error, kind}` envelope (`ErrorEnvelope`), including FastAPI's own
  request-validation errors, which `errors.install_error_handlers` normalises (so the stock
  `HTTPValidationError` shape is never sent and is removed from the document);
* the statuses the middleware can answer on any operation: 421 (Host not allowed), 403
  (`cross_origin` on state-changing requests; `forbidden` for too small a token scope), 401 and
  429 (authentication), 413 and 408 (request body too large / too slow), 400 (a malformed
  `Content-Length` or JSON body), 415 (a body that is not JSON), 503 (the stack is starting or
  stopping) and 500;
* security schemes: `Authorization: Bearer pspo_…`, the `prospero_session` cookie set by
  `POST /api/session`, and `?access_token=` on the two SSE streams only; each operation lists
  them with the scope it needs (read < operate < admin) as the requirement's role name, or
  `security: []` when it is open;
* 201/202/204 answers have no body (but a k8s workspace write's 202, which carries the
  Workspace CR's phase: `WorkspaceAccepted`); `/healthz` and `/metrics` are text/plain; the
  streams are text/event-stream.

The document is built once per app, on first request (`install_openapi`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from prospero.api.auth import required_scope
from prospero.types.api import ErrorEnvelope
from prospero.types.text import NAME_PATTERN

ENVELOPE_REF = {"$ref": "#/components/schemas/ErrorEnvelope"}

BEARER = "bearerAuth"
COOKIE = "sessionCookie"
QUERY = "accessTokenQuery"
SESSION_COOKIE = "prospero_session"

SECURITY_SCHEMES: dict[str, dict[str, Any]] = {
    BEARER: {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "pspo_<base64url>",
        "description": (
            "`Authorization: Bearer pspo_…`: a named token with one scope (read < operate < "
            "admin), made by `prospero token new NAME --scope SCOPE --tokens-file F`. Needed "
            "only when prosperod has API tokens configured."
        ),
    },
    COOKIE: {
        "type": "apiKey",
        "in": "cookie",
        "name": SESSION_COOKIE,
        "description": (
            "The HttpOnly, SameSite=Strict session cookie `POST /api/session` sets (the "
            "dashboard's sign-in); it carries the scope of the token it was made from. A "
            "state-changing request authenticated by it must be provably same-origin."
        ),
    },
    QUERY: {
        "type": "apiKey",
        "in": "query",
        "name": "access_token",
        "description": (
            "The token as `?access_token=`, accepted on the two SSE streams only (a browser "
            "EventSource cannot set headers)."
        ),
    },
}

STATE_CHANGING = frozenset({"post", "put", "patch", "delete"})
SSE_OPERATIONS = frozenset({("get", "/api/stream"), ("get", "/api/agents/{agent_id}/stream")})
EMPTY_STATUSES = frozenset({"201", "202", "204"})


def scope_for(method: str, path: str) -> str | None:
    """The token scope an operation needs (None: open), from the auth route table."""
    scope = required_scope(method.upper(), path)
    return None if scope is None else scope.name


# status -> what the envelope's `kind` is and when it is sent
GLOBAL_ERRORS: dict[str, str] = {
    "400": (
        "`invalid_request`: a malformed `Content-Length` or JSON body. Operations that check "
        "configuration also answer `invalid_config` / `provider_misconfigured` (e.g. a root "
        "that is not an existing directory), and answering a decision `invalid_option`."
    ),
    "401": (
        "`unauthorized`: API tokens are configured and the request carries none, or one that "
        "is unknown or expired (`WWW-Authenticate: Bearer`)."
    ),
    "403": (
        "`forbidden`: the token's scope is too small for this operation (the message names the "
        "scope needed and the one held). `cross_origin` (state-changing requests only): "
        "`Origin` / `Sec-Fetch-Site` say another site sent it, or it carries none of "
        "`Content-Type: application/json`, `Authorization`, `X-Prospero-Client: <name>`."
    ),
    "404": "`not_found`: no such resource (or no such endpoint).",
    "408": "`request_timeout`: the request body did not arrive within the body read timeout.",
    "413": "`payload_too_large`: the request body is over the limit (1 MiB by default).",
    "415": "`unsupported_media_type`: a request body sent without `Content-Type: application/json`.",
    "421": (
        "`host_not_allowed`: the `Host` header names a host prosperod does not serve "
        "(loopback and `--allowed-host` / `--public-url` only; DNS-rebinding defence)."
    ),
    "422": (
        "`invalid_request`: a parameter or body field failed validation (the message names "
        "each, as `loc: reason`)."
    ),
    "429": (
        "`rate_limited`: too many failed authentications from this client address; retry after "
        "`Retry-After` seconds."
    ),
    "500": "`internal`: an unexpected server error.",
    "503": (
        "`unreachable`: prosperod is starting or stopping, a caliband cannot be reached, or the "
        "server is at its bound of concurrent connections."
    ),
}
# Statuses only some operations answer (listed by the route): what the envelope says then.
ROUTE_ERRORS: dict[str, str] = {
    "409": (
        "`invalid_state` / `conflict` / `unsupported`: the resource is not in a state that "
        "allows this (e.g. the agent has finished), or it already exists differently."
    ),
    "502": "`protocol`: caliband answered something prosperod did not expect.",
}
RESPONSE_HEADERS: dict[str, dict[str, Any]] = {
    "401": {
        "WWW-Authenticate": {
            "description": 'Always `Bearer realm="prospero"`.',
            "schema": {"type": "string"},
        }
    },
    "429": {
        "Retry-After": {
            "description": "Seconds until authentication is tried again.",
            "schema": {"type": "integer", "minimum": 0},
        }
    },
}


# FastAPI's default descriptions (the HTTP reason phrase), replaced by what the kind means.
STOCK_DESCRIPTIONS = frozenset(
    {
        "",
        "Bad Request",
        "Not Found",
        "Conflict",
        "Validation Error",
        "Unprocessable Entity",
        "Bad Gateway",
        "Service Unavailable",
        "Internal Server Error",
    }
)


def _envelope_response(description: str, code: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": dict(ENVELOPE_REF)}},
    }
    if code in RESPONSE_HEADERS:
        out["headers"] = RESPONSE_HEADERS[code]
    return out


def _is_envelope_schema(schema: Any) -> bool:
    ref = schema.get("$ref", "") if isinstance(schema, dict) else ""
    return ref.endswith(("/ErrorEnvelope", "/ErrorBody", "/HTTPValidationError"))


def _merge_error(responses: dict[str, Any], code: str) -> None:
    """Document the envelope for `code`, keeping an operation's own wording and, when it
    documents another body for the status (e.g. `/readyz` 503), accepting either."""
    description = GLOBAL_ERRORS.get(code) or ROUTE_ERRORS[code]
    existing = responses.get(code)
    if existing is None:
        responses[code] = _envelope_response(description, code)
        return
    own = existing.get("description", "")
    generic = own in STOCK_DESCRIPTIONS
    media = existing.get("content", {}).get("application/json")
    if media is None or _is_envelope_schema(media.get("schema")):
        merged = _envelope_response(description if generic else f"{own} — {description}", code)
        responses[code] = {**existing, **merged}
        return
    media["schema"] = {"anyOf": [media["schema"], dict(ENVELOPE_REF)]}
    existing["description"] = f"{own}; or {description}"


def _has_params(op: dict[str, Any]) -> bool:
    return bool(op.get("parameters")) or "requestBody" in op


def _document_operation(method: str, path: str, op: dict[str, Any]) -> None:
    responses: dict[str, Any] = op.setdefault("responses", {})
    scope = scope_for(method, path)
    codes = {"400", "408", "413", "421", "500", "503"}
    if scope is not None:
        codes |= {"401", "403", "429"}
    if method in STATE_CHANGING:
        codes.add("403")
    if path == "/api/session":
        codes |= {"401", "429"}
    if "{" in path:
        codes.add("404")
    if _has_params(op):
        codes.add("422")
    if "requestBody" in op:
        codes.add("415")
    codes |= {c for c in responses if c in ROUTE_ERRORS}
    for code in sorted(codes):
        _merge_error(responses, code)
    # any remaining stock `HTTPValidationError` / `ErrorBody` refs -> the envelope
    for resp in responses.values():
        media = resp.get("content", {}).get("application/json")
        if media is not None and _is_envelope_schema(media.get("schema")):
            media["schema"] = dict(ENVELOPE_REF)
    for code, resp in responses.items():
        # FastAPI documents no content for a `response_class=Response` route: say it is empty
        if code in EMPTY_STATUSES and "content" not in resp:
            if resp.get("description") in (None, "", "Successful Response"):
                resp["description"] = "Accepted; empty body." if code == "202" else "Empty body."
    if path == "/api/session" and method in ("post", "delete") and "204" in responses:
        verb = "sets" if method == "post" else "clears"
        responses["204"]["headers"] = {
            "Set-Cookie": {
                "description": f"{verb} `{SESSION_COOKIE}` (HttpOnly; SameSite=Strict; Path=/).",
                "schema": {"type": "string"},
            }
        }
    op["responses"] = dict(sorted(responses.items()))
    if scope is None:
        op["security"] = []
    else:
        sec = [{BEARER: [scope]}, {COOKIE: [scope]}]
        if (method, path) in SSE_OPERATIONS:
            sec.append({QUERY: [scope]})
        op["security"] = sec
        op["x-prospero-scope"] = scope
        note = f"Needs a token of scope `{scope}` or higher when API tokens are configured."
        op["description"] = f"{op['description']}\n\n{note}" if op.get("description") else note


# A workspace root as the schema says it: the body model lets "" through for the route's own
# 400 ("a local workspace needs a root directory"), so the document asks for an absolute path.
WORKSPACE_ROOT_PATTERN = r"^/[^\x00-\x1f\x7f-\x9f]*$"


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A parameter's schema without FastAPI's `anyOf [T, null]` for `T | None`: a query
    parameter or header is present or absent, never a JSON null (a client told it may be null
    sends the text `null`, which is refused)."""
    branches = schema.get("anyOf")
    if not isinstance(branches, list):
        return schema
    kept = [b for b in branches if b != {"type": "null"}]
    if len(kept) == len(branches):
        return schema
    rest = {k: v for k, v in schema.items() if k != "anyOf"}
    if len(kept) == 1:
        return {**kept[0], **rest}
    return {**rest, "anyOf": kept}


def _tighten(spec: dict[str, Any]) -> None:
    """Say what the server really accepts where the models are looser than the validation
    (requests the schema allowed were refused)."""
    for item in spec.get("paths", {}).values():
        for op in item.values():
            for param in op.get("parameters", ()) if isinstance(op, dict) else ():
                schema = param["schema"] = _without_null(param.get("schema", {}))
                # No id or name has a control character: such a path gets 404 or 422.
                if param.get("in") == "path" and schema.get("type") == "string":
                    schema.setdefault("pattern", NAME_PATTERN)
    body = spec.get("components", {}).get("schemas", {}).get("AddWorkspaceBody")
    root = body.get("properties", {}).get("root") if isinstance(body, dict) else None
    if isinstance(body, dict) and isinstance(root, dict):
        root.pop("default", None)
        root["pattern"] = WORKSPACE_ROOT_PATTERN
        root.setdefault("description", "An existing directory, as an absolute path (else 400).")
        required = body.setdefault("required", [])
        if "root" not in required:
            required.append("root")


def build_openapi(app: FastAPI) -> dict[str, Any]:
    spec = get_openapi(
        title=app.title,
        version=app.version,
        openapi_version=app.openapi_version,
        description=app.description,
        routes=app.routes,
        tags=app.openapi_tags,
        servers=app.servers,
    )
    components = spec.setdefault("components", {})
    schemas: dict[str, Any] = components.setdefault("schemas", {})
    schemas["ErrorEnvelope"] = ErrorEnvelope.model_json_schema()
    components["securitySchemes"] = SECURITY_SCHEMES
    for path, item in spec.get("paths", {}).items():
        for method, op in item.items():
            if method in ("get", "put", "post", "delete", "patch", "head", "options"):
                _document_operation(method, path, op)
    _tighten(spec)
    for stale in ("HTTPValidationError", "ValidationError", "ErrorBody"):
        schemas.pop(stale, None)
    return spec


def install_openapi(app: FastAPI) -> None:
    """Serve `build_openapi(app)` (built once, on first use) as the app's document."""
    cache: dict[str, dict[str, Any]] = {}

    def openapi() -> dict[str, Any]:
        if "spec" not in cache:
            cache["spec"] = build_openapi(app)
        app.openapi_schema = cache["spec"]
        return cache["spec"]

    app.openapi = openapi  # type: ignore[method-assign]


__all__ = ["SECURITY_SCHEMES", "build_openapi", "install_openapi", "scope_for"]
