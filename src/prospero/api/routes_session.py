"""Dashboard sessions (ADR 0010): sign in with a token, get an HMAC-signed cookie.

* `POST /api/session` `{"token": "pspo_..."}` -> 204 and `Set-Cookie: prospero_session=...;
  Path=/; Max-Age=...; HttpOnly; SameSite=Strict` (`; Secure` when the request came over
  https or from an https page, e.g. behind a TLS proxy). A wrong token -> 401 (and it counts toward the per-IP failure limit: 429 after too
  many). With authentication off -> 409 `invalid_state` (there is nothing to sign in to).
* `GET /api/session` -> `{name, scope, via}` of the caller's credentials (bearer, query or
  cookie), or 401; with authentication off `{name: null, scope: "admin", via: "none"}`.
* `DELETE /api/session` -> 204 and a cookie that clears the session in this browser.

The cookie never holds the token: the token's name, scope, a prefix of its hash and an expiry,
signed (see `api/auth.py`), so removing the token from the tokens file ends the session.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from prospero.api.auth import (
    RATE_LIMITED_MESSAGE,
    Authenticator,
    AuthResult,
    Identity,
    SessionSigner,
    client_ip,
    is_https,
    rate_limited_headers,
    unauthorized_headers,
)
from prospero.api.errors import envelope
from prospero.api.responses import errors, json_response

router = APIRouter(tags=["session"])


class SessionRequest(BaseModel):
    token: str = Field(min_length=1, max_length=1024, description="An API token (`pspo_...`).")


class SessionInfo(BaseModel):
    name: str | None = Field(description="The token's name (null when authentication is off).")
    scope: Literal["read", "operate", "admin"]
    via: Literal["bearer", "query", "cookie", "none"]


def authenticator(request: Request) -> Authenticator:
    auth: Authenticator = request.app.state.auth
    return auth


Auth = Annotated[Authenticator, Depends(authenticator)]


def _headers(pairs: list[tuple[bytes, bytes]]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in pairs}


@router.post(
    "/api/session",
    operation_id="createSession",
    status_code=204,
    response_class=Response,
    summary="Sign in: exchange a token for a session cookie",
    responses=errors(401, 409, 429),
)
async def create_session(body: SessionRequest, request: Request, auth: Auth) -> Response:
    if not auth.enabled:
        return envelope(409, "authentication is off: no API tokens are configured", "invalid_state")
    ip = client_ip(request.scope)
    wait = auth.rate_limited(ip)
    if wait is not None:
        return envelope(
            429, RATE_LIMITED_MESSAGE, "rate_limited", _headers(rate_limited_headers(wait))
        )
    entry = auth.table.match(body.token.strip())
    if entry is None:
        auth.record_failure(ip)
        return envelope(401, "invalid token", "unauthorized", _headers(unauthorized_headers(True)))
    value = auth.signer.issue(entry)
    resp = Response(status_code=204)
    resp.headers.append(
        "set-cookie", auth.signer.set_cookie_header(value, is_https(request.scope)).decode()
    )
    resp.headers["cache-control"] = "no-store"
    return resp


@router.get(
    "/api/session",
    operation_id="getSession",
    response_model=SessionInfo,
    summary="Who am I: the caller's token name, scope and credential kind",
    responses=errors(401),
)
async def get_session(request: Request, auth: Auth) -> Response:
    if not auth.enabled:
        return json_response(SessionInfo(name=None, scope="admin", via="none"))
    ident: Identity | None = getattr(request.state, "auth", None)
    if ident is None:
        result: AuthResult | None = getattr(request.state, "auth_result", None)
        reason = result.reason if result is not None else "authentication required"
        present = result.present if result is not None else False
        return envelope(401, reason, "unauthorized", _headers(unauthorized_headers(present)))
    info = SessionInfo(name=ident.name, scope=ident.scope.name, via=ident.via)
    return json_response(info)


@router.delete(
    "/api/session",
    operation_id="deleteSession",
    status_code=204,
    response_class=Response,
    summary="Sign out: clear the session cookie",
)
async def delete_session(request: Request) -> Response:
    resp = Response(status_code=204)
    resp.headers.append(
        "set-cookie",
        SessionSigner.clear_cookie_header(is_https(request.scope)).decode(),
    )
    return resp
