"""Browser-facing guards of the HTTP API: the Host allowlist and same-origin mutations.

prosperod spawns agents that edit files and run commands, so a web page that can reach it must
not be able to drive it. Two pure-ASGI middlewares (issue 10):

`HostGuard` (DNS rebinding). A page on `http://rebind.attacker.example:7878/` whose name is
re-pointed at 127.0.0.1 is *same-origin* with prosperod in the browser's eyes; the only thing
that gives it away is the `Host` header. Every HTTP request whose Host is not allowed is
answered 421 `host_not_allowed` before routing and before the dashboard assets. Allowed (the
port is ignored; case-insensitive; one trailing dot ignored):

* `localhost`, any loopback IP literal (`127.0.0.1`, `127.1.2.3`, `::1`, `[::1]`,
  `::ffff:127.0.0.1`) and the IP literal of the local address the connection arrived on (which
  covers the bind address when it is an IP) — a literal IP cannot be rebound;
* the names configured with `allowed_hosts` (`prosperod --allowed-host NAME`, repeatable):
  exact names or IPs, or `*.example.com` for any subdomain of example.com (not example.com
  itself); plus the host of each `public_origins` entry (`--public-url`);
* everything when `allowed_hosts` holds `*` (unsafe: re-opens DNS rebinding).

A request without a Host header (HTTP/1.0) is refused, as is one with several.

`OriginGuard` (cross-site requests). A state-changing request (any method but GET, HEAD,
OPTIONS) is answered 403 `cross_origin` when

* `Sec-Fetch-Site` is present and is not `same-origin` or `none`, or
* `Origin` is present and is neither the request's own origin (its scheme + Host) nor a
  configured public origin (`Origin: null` is always refused), or
* it carries none of the properties a cross-site HTML form, `navigator.sendBeacon` or a
  `no-cors` fetch cannot send without a CORS preflight (which prosperod never grants):
  `Authorization: Bearer …`, a JSON `Content-Type` (`application/json` or `…+json`), or a
  non-empty `X-Prospero-Client` header (the dashboard and the CLI send one on every request).

Reads are not affected: without CORS headers a cross-origin page cannot read a response, and
a rebound name cannot get past `HostGuard`.

`same_origin_evidence(scope)` tells cookie authentication whether a request carries POSITIVE
evidence of coming from prosperod's own pages (a cookie is sent by the browser on its own, so
the mere absence of cross-site markers is not enough for it).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from prospero.api.errors import send_envelope

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SAME_ORIGIN_SITES = frozenset({"same-origin", "none"})
CLIENT_HEADER = "X-Prospero-Client"
HOST_NOT_ALLOWED = "host_not_allowed"
CROSS_ORIGIN = "cross_origin"
NON_SIMPLE_HINT = (
    "send `Content-Type: application/json`, an `Authorization: Bearer` header or "
    f"`{CLIENT_HEADER}: <name>`"
)
# Where OriginGuard records its verdict for same_origin_evidence (scope["state"][...]).
SAME_ORIGIN_STATE = "same_origin"
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_NAME = re.compile(r"^[a-z0-9_-]+(\.[a-z0-9_-]+)*$")
_ECHO_MAX = 100


# ------------------------------------------------------------------------------ parsing


def _header(scope: Scope, name: bytes) -> list[str]:
    return [bytes(v).decode("latin-1").strip() for k, v in scope.get("headers", ()) if k == name]


def normalize_host(host: str) -> str | None:
    """A host name or IP literal in canonical form (lowercase, no brackets, no trailing dot,
    IPs compressed), or None when it is not a valid host."""
    h = host.strip().lower()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if h.endswith(".") and not h.endswith(".."):
        h = h[:-1]
    if not h:
        return None
    try:
        return str(ipaddress.ip_address(h))
    except ValueError:
        pass
    return h if _NAME.match(h) else None


def split_host_header(value: str) -> tuple[str, int | None] | None:
    """`name[:port]`, `[v6][:port]` or a bare IPv6 literal -> (normalized host, port)."""
    v = value.strip()
    port_s = ""
    if v.startswith("["):
        end = v.find("]")
        if end < 0:
            return None
        host, rest = v[: end + 1], v[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                return None
            port_s = rest[1:]
    elif v.count(":") > 1:
        host = v  # a bare IPv6 literal, e.g. `::1`
    else:
        host, _, port_s = v.partition(":")
    if port_s and not (port_s.isdigit() and int(port_s) <= 65535):
        return None
    norm = normalize_host(host)
    if norm is None:
        return None
    return norm, int(port_s) if port_s else None


Origin = tuple[str, str, int]


def parse_origin(value: str) -> Origin | None:
    """`scheme://host[:port]` -> (scheme, normalized host, port with the scheme's default)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    host = normalize_host(parts.hostname)
    if host is None:
        return None
    return scheme, host, port if port is not None else _DEFAULT_PORTS[scheme]


def _own_origin(scope: Scope) -> Origin | None:
    hosts = _header(scope, b"host")
    if len(hosts) != 1:
        return None
    parsed = split_host_header(hosts[0])
    if parsed is None:
        return None
    scheme = str(scope.get("scheme") or "http").lower()
    host, port = parsed
    return scheme, host, port if port is not None else _DEFAULT_PORTS.get(scheme, 80)


def _is_loopback_ip(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


# ------------------------------------------------------------------------------ decisions


class HostPolicy:
    """Which Host header values are served (see the module docstring)."""

    def __init__(self, allowed_hosts: Iterable[str] = (), public_origins: Iterable[str] = ()):
        self.any = False
        self.names: set[str] = set()
        self.suffixes: list[str] = []
        for raw in allowed_hosts:
            item = raw.strip().lower()
            if item == "*":
                self.any = True
            elif item.startswith("*."):
                suffix = normalize_host(item[2:])
                if suffix is None:
                    raise ValueError(f"invalid allowed host pattern {raw!r}")
                self.suffixes.append(suffix)
            else:
                name = normalize_host(item)
                if name is None:
                    raise ValueError(f"invalid allowed host {raw!r}")
                self.names.add(name)
        for origin in public_origins:
            parsed = parse_origin(origin)
            if parsed is None:
                raise ValueError(f"invalid public origin {origin!r}")
            self.names.add(parsed[1])

    def allows(self, host: str, local_ip: str | None = None) -> bool:
        """`host` is a normalized host (see `normalize_host`)."""
        if self.any or host == "localhost" or host in self.names or _is_loopback_ip(host):
            return True
        if local_ip is not None and host == normalize_host(local_ip):
            return True
        return any(host.endswith("." + s) for s in self.suffixes)


def check_host(scope: Scope, policy: HostPolicy) -> str | None:
    """None when the request's Host is allowed, else the reason it is refused."""
    if policy.any:
        return None
    hosts = _header(scope, b"host")
    if not hosts:
        return "a Host header is required"
    if len(hosts) > 1:
        return "several Host headers"
    parsed = split_host_header(hosts[0])
    shown = hosts[0][:_ECHO_MAX]
    if parsed is None:
        return f"invalid Host header {shown!r}"
    server = scope.get("server")
    local_ip = str(server[0]) if server else None
    if policy.allows(parsed[0], local_ip):
        return None
    return (
        f"Host {shown!r} is not served here; to serve this name start prosperod with "
        f"--allowed-host {parsed[0]} (or --public-url)"
    )


def _cross_site_reason(scope: Scope, public: frozenset[Origin]) -> str | None:
    """Why the request's Sec-Fetch-Site / Origin says it comes from another site, or None."""
    for site in _header(scope, b"sec-fetch-site"):
        if site.lower() not in SAME_ORIGIN_SITES:
            return f"Sec-Fetch-Site: {site[:_ECHO_MAX]}"
    for origin in _header(scope, b"origin"):
        if origin.lower() == "null":
            return "Origin: null"
        parsed = parse_origin(origin)
        if parsed is None or (parsed != _own_origin(scope) and parsed not in public):
            return f"Origin: {origin[:_ECHO_MAX]}"
    return None


def _media_type(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


def has_non_simple_property(scope: Scope) -> bool:
    """True when the request carries something a cross-site form, beacon or no-cors fetch
    cannot: a bearer Authorization header, a JSON Content-Type or a non-empty
    X-Prospero-Client header."""
    for key, value in scope.get("headers", ()):
        text = bytes(value).decode("latin-1").strip()
        if key == b"authorization" and text.lower().startswith("bearer "):
            return True
        if key == b"content-type":
            media = _media_type(text)
            if media == "application/json" or (
                media.startswith("application/") and media.endswith("+json")
            ):
                return True
        if key == b"x-prospero-client" and text:
            return True
    return False


def cross_site_marked(scope: Scope, public_origins: Iterable[str] = ()) -> bool:
    """True when `Sec-Fetch-Site` or `Origin` says the request comes from another origin (any
    method). Authentication uses it so that a foreign page can neither guess `?access_token=`
    values through an EventSource nor spend the client IP's auth-failure budget."""
    public = frozenset(p for p in (parse_origin(o) for o in public_origins) if p is not None)
    return _cross_site_reason(scope, public) is not None


def same_origin_evidence(scope: Scope, public_origins: Iterable[str] = ()) -> bool:
    """Positive evidence that the request comes from prosperod's own pages:
    `Sec-Fetch-Site: same-origin`, or an `Origin` equal to the request's own origin (or to a
    configured public origin), with nothing saying cross-site. Uses the verdict `OriginGuard`
    recorded on the scope (which counts the configured public origins) when it ran."""
    state = scope.get("state") or {}
    recorded = state.get(SAME_ORIGIN_STATE)
    if isinstance(recorded, bool):
        return recorded
    public = frozenset(p for p in (parse_origin(o) for o in public_origins) if p is not None)
    return _same_origin_evidence(scope, public)


def _same_origin_evidence(scope: Scope, public: frozenset[Origin]) -> bool:
    if _cross_site_reason(scope, public) is not None:
        return False
    if any(s.lower() == "same-origin" for s in _header(scope, b"sec-fetch-site")):
        return True
    origins = _header(scope, b"origin")
    return bool(origins) and all(
        (p := parse_origin(o)) is not None and (p == _own_origin(scope) or p in public)
        for o in origins
    )


# ------------------------------------------------------------------------------ middleware


VARY = ((b"vary", b"Origin, Sec-Fetch-Site"),)


async def _refuse(send: Send, status: int, message: str, kind: str) -> None:
    await send_envelope(send, status, message, kind, VARY)


class HostGuard:
    """421 `host_not_allowed` for a request whose Host is not allowed (module docstring)."""

    def __init__(
        self, app: ASGIApp, allowed_hosts: Iterable[str] = (), public_origins: Iterable[str] = ()
    ) -> None:
        self.app = app
        self.policy = HostPolicy(allowed_hosts, public_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            reason = check_host(scope, self.policy)
            if reason is not None:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                else:
                    await _refuse(send, 421, reason, HOST_NOT_ALLOWED)
                return
        await self.app(scope, receive, send)


class OriginGuard:
    """403 `cross_origin` for a state-changing request that is, or may be, cross-site."""

    def __init__(self, app: ASGIApp, public_origins: Iterable[str] = ()) -> None:
        self.app = app
        parsed = [parse_origin(o) for o in public_origins]
        if any(p is None for p in parsed):
            raise ValueError(f"invalid public origin in {list(public_origins)!r}")
        self.public = frozenset(p for p in parsed if p is not None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})[SAME_ORIGIN_STATE] = _same_origin_evidence(scope, self.public)
        if scope["method"] not in SAFE_METHODS:
            reason = _cross_site_reason(scope, self.public)
            if reason is not None:
                await _refuse(send, 403, f"cross-origin request refused ({reason})", CROSS_ORIGIN)
                return
            if not has_non_simple_property(scope):
                await _refuse(
                    send,
                    403,
                    "state-changing request refused: it could have come from another site; "
                    + NON_SIMPLE_HINT,
                    CROSS_ORIGIN,
                )
                return
        await self.app(scope, receive, send)


__all__ = [
    "CLIENT_HEADER",
    "CROSS_ORIGIN",
    "HOST_NOT_ALLOWED",
    "HostGuard",
    "HostPolicy",
    "OriginGuard",
    "has_non_simple_property",
    "normalize_host",
    "parse_origin",
    "same_origin_evidence",
]
