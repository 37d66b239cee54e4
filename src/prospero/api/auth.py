"""Optional bearer-token authentication for the HTTP API.

* Tokens are configured by name (`name -> token`); a request is accepted when its
  `Authorization: Bearer <t>` matches one of them. Every configured token is compared with
  `hmac.compare_digest` (no early exit), so timing does not reveal which one nearly matched.
* `/healthz` is always open (liveness probes carry no credentials).
* The two SSE endpoints (`GET /api/stream`, `GET /api/agents/{id}/stream`) also accept
  `?access_token=<t>`, because a browser `EventSource` cannot set headers. Nowhere else.
* Failures answer 401 `{"error": ..., "kind": "unauthorized"}` with `WWW-Authenticate: Bearer`.
* The matched token's NAME (never the token) is put on `request.state.token_name` for audit.
  Tokens are never logged; the access log writes the path without the query string.
"""

from __future__ import annotations

import hmac
import re
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from prospero.api.errors import envelope_bytes
from prospero.core.metrics import Metrics

OPEN_PATHS = frozenset({"/healthz"})
SSE_PATH = re.compile(r"^/api/(stream|agents/[^/]+/stream)$")
AUTH_FAILURES = "api_auth_failures"


def match_token(presented: str, tokens: dict[str, str]) -> str | None:
    """Constant-time match of `presented` against every configured token; returns its name."""
    given = presented.encode()
    found: str | None = None
    for name, token in tokens.items():
        if hmac.compare_digest(given, token.encode()) and found is None:
            found = name
    return found


def _bearer(scope: Scope) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == b"authorization":
            raw: str = bytes(value).decode("latin-1").strip()
            scheme, _, cred = raw.partition(" ")
            if scheme.lower() == "bearer" and cred.strip():
                return cred.strip()
            return None
    return None


def _query_token(scope: Scope) -> str | None:
    qs: str = bytes(scope.get("query_string", b"")).decode("latin-1")
    for key, value in parse_qsl(qs, keep_blank_values=False):
        if key == "access_token":
            return value
    return None


class AuthMiddleware:
    def __init__(self, app: ASGIApp, tokens: dict[str, str], metrics: Metrics | None = None):
        self.app = app
        self.tokens = dict(tokens)
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.tokens or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        presented = _bearer(scope)
        via = "header"
        if presented is None and scope["method"] == "GET" and SSE_PATH.match(scope["path"]):
            presented = _query_token(scope)
            via = "query"
        name = match_token(presented, self.tokens) if presented is not None else None
        if name is None:
            if self.metrics is not None:
                self.metrics.inc(AUTH_FAILURES)
            reason = "missing bearer token" if presented is None else "invalid bearer token"
            body = envelope_bytes(reason, "unauthorized")
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"www-authenticate", b'Bearer realm="prospero"'),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        state = scope.setdefault("state", {})
        state["token_name"] = name
        state["token_via"] = via
        await self.app(scope, receive, send)


__all__ = ["AUTH_FAILURES", "AuthMiddleware", "match_token"]
