"""The `{error, kind}` envelope for every failure the API returns (prospero-surface.md §1.1).

Core errors carry a `kind`; the status code is chosen from it. Framework errors (unknown route,
wrong method, request validation, malformed JSON) are normalised into the same envelope.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Send

from prospero.core.errors import ProsperoError

log = logging.getLogger(__name__)


class InvalidRequest(ProsperoError):
    """A request parameter the framework could not validate by type (e.g. a timestamp)."""

    kind = "invalid_request"


# core error kind -> HTTP status
KIND_STATUS: dict[str, int] = {
    "not_found": 404,
    "invalid_state": 409,
    "conflict": 409,
    "budget_exceeded": 409,
    "provider_misconfigured": 400,
    "invalid_config": 400,
    "unreachable": 503,
    "protocol": 502,
    "unsupported": 409,
    "internal": 500,
    "invalid_request": 422,
}

# HTTP status -> kind, for errors raised by the framework itself
STATUS_KIND: dict[int, str] = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    500: "internal",
    503: "unavailable",
}


def envelope(
    status: int, message: str, kind: str, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        content=envelope_bytes(message, kind),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def envelope_bytes(message: str, kind: str) -> bytes:
    try:
        return orjson.dumps({"error": message, "kind": kind})
    except orjson.JSONEncodeError:
        # A message quoting client input with a lone surrogate (not encodable as UTF-8).
        safe = message.encode("utf-8", "backslashreplace").decode("utf-8")
        return orjson.dumps({"error": safe, "kind": kind})


async def send_envelope(
    send: Send,
    status: int,
    message: str,
    kind: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Answer a raw ASGI request with the `{error, kind}` envelope (for the pure-ASGI layers
    that refuse a request before routing: guards, auth, body limit)."""
    body = envelope_bytes(message, kind)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _describe_validation(errors: list[Any]) -> str:
    parts: list[str] = []
    for err in errors[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body",)) or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    more = len(errors) - 5
    if more > 0:
        parts.append(f"(+{more} more)")
    return "invalid request: " + "; ".join(parts)


async def _prospero_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProsperoError)
    kind = getattr(exc, "kind", "internal")
    status = KIND_STATUS.get(kind, 500)
    if status >= 500:
        log.warning("request failed (%s): %s", kind, exc)
    message = str(exc) or kind.replace("_", " ")
    if kind == "internal":
        message = f"internal error: {message}"
    return envelope(status, message, kind)


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    main = content_type.split(";", 1)[0].strip().lower()
    return main == "application/json" or main.endswith("+json")


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    whole_body = [e for e in errors if tuple(e.get("loc", ())) == ("body",)]
    if whole_body and not _is_json(request.headers.get("content-type")):
        if any(e.get("type") == "missing" for e in whole_body):
            return envelope(422, "invalid request: a JSON body is required", "invalid_request")
        # A body sent without `Content-Type: application/json` is not parsed (this also keeps
        # browsers' cross-site "simple requests" from driving the API).
        return envelope(
            415,
            "request body must be JSON (Content-Type: application/json)",
            "unsupported_media_type",
        )
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(
            (e.get("ctx", {}).get("error", "") for e in errors if e.get("type") == "json_invalid"),
            "",
        )
        return envelope(400, f"malformed JSON body: {detail}".rstrip(": "), "invalid_request")
    return envelope(422, _describe_validation(errors), "invalid_request")


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    kind = STATUS_KIND.get(exc.status_code, "internal" if exc.status_code >= 500 else "error")
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    headers = dict(exc.headers) if exc.headers else None
    if exc.status_code == 404 and detail == "Not Found":
        detail = "no such endpoint"
    return envelope(exc.status_code, detail, kind, headers)


async def _unhandled(_request: Request, exc: Exception) -> Response:
    log.error("unhandled error in request handler", exc_info=exc)
    return envelope(500, "internal error", "internal")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ProsperoError, _prospero_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unhandled)
