"""Authentication and scopes of the HTTP API (ADR 0010; issue 10).

Credentials, in this order (the first one present decides):

* `Authorization: Bearer <token>` — any route;
* `?access_token=<token>` — only on the two SSE GETs (`/api/stream`,
  `/api/agents/{id}/stream`), because a browser `EventSource` cannot set headers;
* the `prospero_session` cookie set by `POST /api/session` (the dashboard): an HMAC-SHA256
  signed payload `{n: token name, s: scope, h: prefix of the token's SHA-256, e: expiry}`. It is
  checked against the live token table on every request, so removing (or re-issuing) a token
  in the tokens file ends its sessions too. The key comes from `session.key` in the data dir
  (0600) or is random per process. A cookie-authenticated request that changes state also
  needs positive same-origin evidence (`guard.same_origin_evidence`), else 403 `cross_origin`.

Scopes `read < operate < admin` gate the route table `ROUTE_TABLE` (first match wins):
probes, the dashboard's assets, `/api/session` and the API docs are open; GET/HEAD under
`/api/` and `/metrics` need `read`; spawn, agent operations (`DELETE /api/agents/{id}`,
`POST /api/agents/{id}/...`), decision resolution and the MCP server (`/mcp`, any method) need
`operate`; workspace add/delete/config and policy writes need `admin`, as does ANY route the
table does not list (fail closed). Automations: enable/disable/run-now `operate`, create,
change, delete and secret rotation `admin`; the webhook trigger is open (its HMAC signature
is the credential, docs/automations.md).

Answers: 401 `unauthorized` with `WWW-Authenticate: Bearer` without valid credentials; 403
`forbidden` naming the scope needed and the one held; 429 `rate_limited` with `Retry-After`
once a client IP has presented `auth_failure_limit` wrong credentials within
`auth_failure_window` seconds (until the window frees up; requests without credentials do not
count). With no token source configured, authentication is off (loopback default).

The matched token's NAME (never the token) goes to `request.state.token_name` (decisions stamp
it as the actor); every authenticated state-changing request writes one `prospero.audit` line
(actor, scope, method, path, status). Tokens are never logged.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import re
import secrets
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from hashlib import sha256
from typing import Any
from urllib.parse import parse_qsl

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from prospero.api.errors import send_envelope
from prospero.api.guard import CROSS_ORIGIN, cross_site_marked, same_origin_evidence
from prospero.api.middleware import StatusRecorder
from prospero.api.settings import ApiSettings
from prospero.core.metrics import Metrics
from prospero.core.tokens import Scope as TokenScope
from prospero.core.tokens import TokenEntry, TokenTable

audit_log = logging.getLogger("prospero.audit")
log = logging.getLogger(__name__)

AUTH_FAILURES = "api_auth_failures"
AUTH_RATE_LIMITED = "api_auth_rate_limited"
SESSION_COOKIE = "prospero_session"
SSE_PATH = re.compile(r"^/api/(stream|agents/[^/]+/stream)$")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
HASH_PREFIX_HEX = 16
_COOKIE_VERSION = "v1"

# ------------------------------------------------------------------------------ route table

GET_HEAD = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class Rule:
    methods: frozenset[str] | None  # None = every method
    template: str  # `{name}` = one path segment; `{name:path}` = the rest of the path
    scope: TokenScope | None  # None = open (no credentials needed)
    regex: re.Pattern[str]

    def matches(self, method: str, path: str) -> bool:
        return (self.methods is None or method in self.methods) and bool(self.regex.fullmatch(path))


def _rule(methods: frozenset[str] | None, template: str, scope: TokenScope | None) -> Rule:
    pattern = ""
    for part in re.split(r"(\{[^}]+\})", template):
        if part.startswith("{") and part.endswith("}"):
            pattern += ".*" if part.endswith(":path}") else "[^/]+"
        else:
            pattern += re.escape(part)
    return Rule(methods, template, scope, re.compile(pattern))


OPEN = None
READ, OPERATE, ADMIN = TokenScope.read, TokenScope.operate, TokenScope.admin
POST, PUT, PATCH, DELETE = (frozenset({m}) for m in ("POST", "PUT", "PATCH", "DELETE"))

ROUTE_TABLE: tuple[Rule, ...] = (
    # open: probes, the dashboard's assets (no data), signing in, the API docs
    _rule(GET_HEAD, "/healthz", OPEN),
    _rule(GET_HEAD, "/readyz", OPEN),
    _rule(GET_HEAD, "/", OPEN),
    _rule(GET_HEAD, "/index.html", OPEN),
    _rule(GET_HEAD, "/ui/{path:path}", OPEN),
    _rule(None, "/api/session", OPEN),
    _rule(GET_HEAD, "/openapi.json", OPEN),
    _rule(GET_HEAD, "/docs", OPEN),
    _rule(GET_HEAD, "/docs/{path:path}", OPEN),
    _rule(GET_HEAD, "/redoc", OPEN),
    # operate: agents and decisions
    _rule(POST, "/api/workspaces/{workspace}/agents", OPERATE),
    _rule(DELETE, "/api/agents/{agent_id}", OPERATE),
    _rule(POST, "/api/agents/{agent_id}/{action}", OPERATE),
    _rule(POST, "/api/decisions/{decision_id}", OPERATE),
    # operate: the MCP server (api/mcp_server.py), every method: its tools spawn and drive agents
    _rule(None, "/mcp", OPERATE),
    # automations (routes_automations.py): the webhook's HMAC signature is its credential;
    # enable/disable/run-now are running things; creating and changing them is configuring
    _rule(POST, "/api/automations/{ref}/trigger", OPEN),
    _rule(POST, "/api/automations/{ref}/enable", OPERATE),
    _rule(POST, "/api/automations/{ref}/disable", OPERATE),
    _rule(POST, "/api/automations/{ref}/run", OPERATE),
    _rule(POST, "/api/automations", ADMIN),
    _rule(PATCH, "/api/automations/{ref}", ADMIN),
    _rule(DELETE, "/api/automations/{ref}", ADMIN),
    _rule(POST, "/api/automations/{ref}/rotate-secret", ADMIN),
    # notifications (routes_notifications.py): targets and test messages are configuring
    _rule(POST, "/api/notifications/targets", ADMIN),
    _rule(PATCH, "/api/notifications/targets/{ref}", ADMIN),
    _rule(DELETE, "/api/notifications/targets/{ref}", ADMIN),
    _rule(POST, "/api/notifications/targets/{ref}/test", ADMIN),
    # admin: workspaces, their provider config and permission policy
    _rule(POST, "/api/workspaces", ADMIN),
    _rule(DELETE, "/api/workspaces/{name}", ADMIN),
    _rule(PUT, "/api/workspaces/{name}/config", ADMIN),
    _rule(PATCH, "/api/workspaces/{name}/config", ADMIN),
    _rule(PUT, "/api/workspaces/{workspace}/policy", ADMIN),
    _rule(PATCH, "/api/workspaces/{workspace}/policy", ADMIN),
    # read: every other GET/HEAD of the API (snapshots, history, streams, usage, metrics)
    _rule(GET_HEAD, "/metrics", READ),
    _rule(GET_HEAD, "/api/cluster", READ),
    _rule(GET_HEAD, "/api/{path:path}", READ),
)


def classify(method: str, path: str) -> Rule | None:
    """The table rule for a request, or None when no rule lists it."""
    method = method.upper()
    for rule in ROUTE_TABLE:
        if rule.matches(method, path):
            return rule
    return None


def required_scope(method: str, path: str) -> TokenScope | None:
    """The scope a request needs; None = open. Unlisted routes need `admin` (fail closed)."""
    rule = classify(method, path)
    return ADMIN if rule is None else rule.scope


# ------------------------------------------------------------------------------ identities


@dataclass(frozen=True)
class Identity:
    name: str
    scope: TokenScope
    via: str  # "bearer" | "query" | "cookie"


# ------------------------------------------------------------------------------ sessions


def _b64e(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64d(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SessionSigner:
    """Signs and verifies the dashboard's session cookie (HMAC-SHA256)."""

    def __init__(self, key: bytes | None, ttl: float) -> None:
        self.key = key or secrets.token_bytes(32)
        self.ttl = ttl

    def _mac(self, signed: str) -> bytes:
        return hmac.new(self.key, signed.encode("ascii"), sha256).digest()

    def issue(self, entry: TokenEntry, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + self.ttl)
        payload = {
            "n": entry.name,
            "s": entry.scope.name,
            "h": entry.hash_hex[:HASH_PREFIX_HEX],
            "e": expires,
        }
        signed = f"{_COOKIE_VERSION}.{_b64e(orjson.dumps(payload))}"
        return f"{signed}.{_b64e(self._mac(signed))}"

    def verify(self, value: str, table: TokenTable) -> tuple[Identity | None, str, bool]:
        """(identity, reason, forged): `forged` when the signature or format is wrong (that
        counts as a failed attempt); an expired or revoked session is not forged."""
        parts = value.split(".")
        if len(parts) != 3 or parts[0] != _COOKIE_VERSION:
            return None, "malformed session cookie", True
        signed = f"{parts[0]}.{parts[1]}"
        try:
            mac = _b64d(parts[2])
            payload = orjson.loads(_b64d(parts[1]))
        except (binascii.Error, ValueError):
            return None, "malformed session cookie", True
        if not hmac.compare_digest(mac, self._mac(signed)):
            return None, "invalid session cookie signature", True
        if not isinstance(payload, dict):
            return None, "malformed session cookie", True
        name, prefix, expires = payload.get("n"), payload.get("h"), payload.get("e")
        if not isinstance(name, str) or not isinstance(prefix, str) or not isinstance(expires, int):
            return None, "malformed session cookie", True
        if expires <= time.time():
            return None, "session expired: sign in again", False
        entry = table.by_name(name)
        if entry is None or not hmac.compare_digest(
            entry.hash_hex[:HASH_PREFIX_HEX].encode(), prefix.encode()
        ):
            return None, "session revoked: its token is no longer valid", False
        # The table's current scope applies (a token re-scoped in the file re-scopes sessions).
        return Identity(entry.name, entry.scope, "cookie"), "", False

    def set_cookie_header(self, value: str, secure: bool) -> bytes:
        attrs = (
            f"{SESSION_COOKIE}={value}; Path=/; Max-Age={int(self.ttl)}; HttpOnly; SameSite=Strict"
        )
        return (attrs + ("; Secure" if secure else "")).encode("latin-1")

    @staticmethod
    def clear_cookie_header(secure: bool) -> bytes:
        attrs = f"{SESSION_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
        return (attrs + ("; Secure" if secure else "")).encode("latin-1")


# ------------------------------------------------------------------------------ rate limit


class FailureLimiter:
    """Failed authentication attempts per client IP in a sliding window; a client over the
    limit is refused (429) until its oldest failure leaves the window. Bounded memory: at most
    `max_clients` IPs are tracked (the least recently failing are forgotten first)."""

    def __init__(self, limit: int, window: float, max_clients: int = 10_000) -> None:
        self.limit = limit
        self.window = window
        self.max_clients = max_clients
        self._fails: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, ip: str, now: float) -> deque[float] | None:
        q = self._fails.get(ip)
        if q is None:
            return None
        while q and q[0] <= now - self.window:
            q.popleft()
        if not q:
            del self._fails[ip]
            return None
        return q

    def retry_after(self, ip: str) -> float | None:
        """Seconds until `ip` may try again, or None when it is not limited."""
        if self.limit <= 0:
            return None
        now = time.monotonic()
        q = self._recent(ip, now)
        if q is None or len(q) < self.limit:
            return None
        return max(q[0] + self.window - now, 0.001)

    def fail(self, ip: str) -> None:
        if self.limit <= 0:
            return
        now = time.monotonic()
        q = self._recent(ip, now)
        if q is None:
            q = self._fails[ip] = deque(maxlen=self.limit)
            while len(self._fails) > self.max_clients:
                self._fails.popitem(last=False)
        q.append(now)
        self._fails.move_to_end(ip)


# ------------------------------------------------------------------------------ parsing


def _headers(scope: Scope, name: bytes) -> list[str]:
    return [bytes(v).decode("latin-1") for k, v in scope.get("headers", ()) if k == name]


def _bearer(scope: Scope) -> tuple[bool, str | None]:
    """(present, token): an Authorization header that is not `Bearer <t>` is present but
    carries no token."""
    values = [v for v in _headers(scope, b"authorization") if v.strip()]
    if not values:
        return False, None
    scheme, _, cred = values[0].strip().partition(" ")
    if scheme.lower() == "bearer" and cred.strip():
        return True, cred.strip()
    return True, None


def _query_token(scope: Scope) -> str | None:
    qs: str = bytes(scope.get("query_string", b"")).decode("latin-1")
    for key, value in parse_qsl(qs, keep_blank_values=False):
        if key == "access_token":
            return value
    return None


def session_cookie(scope: Scope) -> str | None:
    """The `prospero_session` value from the Cookie header(s). Parsed by hand: the stdlib's
    SimpleCookie gives up on a whole header when any other cookie in it is malformed."""
    for raw in _headers(scope, b"cookie"):
        for part in raw.split(";"):
            name, sep, value = part.strip().partition("=")
            if sep and name == SESSION_COOKIE and value.strip().strip('"'):
                return value.strip().strip('"')
    return None


def client_ip(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "-"


def is_https(scope: Scope) -> bool:
    """The request came over https, or from a page served over https (its `Origin`; e.g. a
    TLS-terminating proxy in front of prosperod): its session cookie gets `Secure`."""
    if str(scope.get("scheme", "http")).lower() == "https":
        return True
    return any(o.strip().lower().startswith("https://") for o in _headers(scope, b"origin"))


# ------------------------------------------------------------------------------ the authenticator


@dataclass
class AuthResult:
    identity: Identity | None = None
    present: bool = False  # some credential was presented
    forged: bool = False  # ... and it was wrong (counts toward the rate limit)
    reason: str = "authentication required"


class Authenticator:
    """The token table, the session signer and the failure limiter of one app."""

    def __init__(self, settings: ApiSettings, metrics: Metrics | None = None) -> None:
        self.table: TokenTable = settings.tokens
        self.signer = SessionSigner(settings.session_key, settings.session_ttl)
        self.limiter = FailureLimiter(settings.auth_failure_limit, settings.auth_failure_window)
        self.public_origins = list(getattr(settings, "public_origins", []) or [])
        self.metrics = metrics

    @property
    def enabled(self) -> bool:
        return self.table.enabled

    def check_token(self, token: str, via: str) -> Identity | None:
        entry = self.table.match(token)
        return None if entry is None else Identity(entry.name, entry.scope, via)

    def authenticate(self, scope: Scope) -> AuthResult:
        present, token = _bearer(scope)
        if present:
            if token is None:
                return AuthResult(
                    None, True, True, "invalid Authorization header: send Bearer <token>"
                )
            ident = self.check_token(token, "bearer")
            if ident is None:
                return AuthResult(None, True, True, "invalid bearer token")
            return AuthResult(ident, True)
        if scope["method"] in GET_HEAD and SSE_PATH.match(scope["path"]):
            token = _query_token(scope)
            if token is not None:
                ident = self.check_token(token, "query")
                if ident is None:
                    return AuthResult(None, True, True, "invalid access_token")
                return AuthResult(ident, True)
        cookie = session_cookie(scope)
        if cookie is not None:
            ident, reason, forged = self.signer.verify(cookie, self.table)
            return AuthResult(ident, True, forged, reason)
        return AuthResult(
            None,
            False,
            False,
            "authentication required: send Authorization: Bearer <token> "
            "(or sign in to the dashboard)",
        )

    def record_failure(self, ip: str, guessed: bool = True) -> None:
        """Count a 401; a wrong credential (not a missing one) also counts toward the limit."""
        if self.metrics is not None:
            self.metrics.inc(AUTH_FAILURES)
        if guessed:
            self.limiter.fail(ip)

    def rate_limited(self, ip: str) -> float | None:
        wait = self.limiter.retry_after(ip)
        if wait is not None and self.metrics is not None:
            self.metrics.inc(AUTH_RATE_LIMITED)
        return wait


# ------------------------------------------------------------------------------ responses


def _retry_after_value(wait: float) -> str:
    return str(max(1, int(wait + 0.999)))


def unauthorized_headers(invalid: bool) -> list[tuple[bytes, bytes]]:
    value = 'Bearer realm="prospero"' + (', error="invalid_token"' if invalid else "")
    return [(b"www-authenticate", value.encode())]


def rate_limited_headers(wait: float) -> list[tuple[bytes, bytes]]:
    return [(b"retry-after", _retry_after_value(wait).encode())]


RATE_LIMITED_MESSAGE = "too many failed authentication attempts from this address; retry later"


def audit(ident: Identity, scope: Scope, status: int) -> None:
    audit_log.info(
        "%s %s -> %s by %s",
        scope["method"],
        scope["path"],
        status or "-",
        ident.name,
        extra={
            "actor": ident.name,
            "scope": ident.scope.name,
            "via": ident.via,
            "method": scope["method"],
            "path": scope["path"],
            "status": status,
            "client": client_ip(scope),
        },
    )


def _set_state(scope: Scope, ident: Identity | None, result: AuthResult | None = None) -> None:
    state: dict[str, Any] = scope.setdefault("state", {})
    state["auth"] = ident
    state["auth_result"] = result
    if ident is not None:
        state["token_name"] = ident.name
        state["token_scope"] = ident.scope.name
        state["token_via"] = ident.via


class AuthMiddleware:
    def __init__(self, app: ASGIApp, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.auth.enabled:
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        need = required_scope(method, path)
        if need is None:
            # Open route: identify the caller when it can be (GET /api/session), never refuse.
            result = self.auth.authenticate(scope)
            _set_state(scope, result.identity, result)
            await self.app(scope, receive, send)
            return
        ip = client_ip(scope)
        foreign = cross_site_marked(scope, self.auth.public_origins)
        if foreign and _query_token(scope) is not None:
            # A page on another origin cannot read the answer, but it can tell an EventSource
            # that opens from one that fails: never let it test tokens (nor count its guesses
            # against this IP's failure budget, which would lock the real user out).
            await send_envelope(
                send,
                403,
                "a request from another origin cannot authenticate with ?access_token=",
                CROSS_ORIGIN,
            )
            return
        wait = self.auth.rate_limited(ip)
        if wait is not None:
            await send_envelope(
                send, 429, RATE_LIMITED_MESSAGE, "rate_limited", rate_limited_headers(wait)
            )
            return
        result = self.auth.authenticate(scope)
        ident = result.identity
        if ident is None:
            # A foreign page's failures do not spend the budget either (it cannot read them).
            self.auth.record_failure(ip, guessed=result.forged and not foreign)
            await send_envelope(
                send, 401, result.reason, "unauthorized", unauthorized_headers(result.present)
            )
            return
        _set_state(scope, ident, result)
        mutation = method not in SAFE_METHODS
        if (
            mutation
            and ident.via == "cookie"
            and not same_origin_evidence(scope, self.auth.public_origins)
        ):
            await send_envelope(
                send,
                403,
                "a request signed in with the session cookie that changes state must come from "
                "this origin (Sec-Fetch-Site: same-origin or a matching Origin header)",
                CROSS_ORIGIN,
            )
            audit(ident, scope, 403)
            return
        if ident.scope < need:
            await send_envelope(
                send,
                403,
                f"this request needs the '{need.name}' scope; token '{ident.name}' has "
                f"'{ident.scope.name}'",
                "forbidden",
            )
            if mutation:
                audit(ident, scope, 403)
            return
        if not mutation:
            await self.app(scope, receive, send)
            return
        recorder = StatusRecorder(send)
        try:
            await self.app(scope, receive, recorder)
        finally:
            audit(ident, scope, recorder.status)


__all__ = [
    "AUTH_FAILURES",
    "ROUTE_TABLE",
    "SESSION_COOKIE",
    "AuthMiddleware",
    "Authenticator",
    "FailureLimiter",
    "Identity",
    "Rule",
    "SessionSigner",
    "classify",
    "required_scope",
]
