"""The CLI's HTTP client: a thin, blocking wrapper over prosperod's API.

The CLI is never a second control path: every command is one (or a few) HTTP calls against
prosperod. Replies are read into the DTOs of `prospero.types` (`get_model`). Errors become
`CliError` with the one line the user sees and the exit code of its kind (`cli.exits`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter, ValidationError

from prospero.cli import exits
from prospero.types.agent_ids import AgentIdResolution, AmbiguousAgentId
from prospero.types.model import AgentStatus

DEFAULT_ADDR = "http://127.0.0.1:7878"

# Requests that change the fleet can take a while (spawn polls the caliband); reads are quick.
REQUEST_TIMEOUT = httpx.Timeout(60.0, connect=5.0)


M = TypeVar("M")


class CliError(Exception):
    """A failure the user sees as one line on stderr; `code` is the process exit status."""

    def __init__(self, message: str, code: int = exits.FAILURE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class Unreachable(CliError):
    def __init__(self, message: str) -> None:
        super().__init__(message, exits.UNREACHABLE)


class ServerError(CliError):
    def __init__(self, status: int, error: str, kind: str | None = None, body: Any = None) -> None:
        super().__init__(f"server returned {status}: {error}", exits.for_status(status))
        self.status = status
        self.error = error
        self.kind = kind
        self.body = body  # the decoded JSON body (the envelope and any extra fields)


def normalize_addr(addr: str | None) -> str:
    """`--addr` is a URL; accept a bare `host:port` (the daemon's format) too."""
    given = (addr or "").strip() or DEFAULT_ADDR
    addr = given if "://" in given else "http://" + given
    addr = addr.rstrip("/")
    try:
        url = httpx.URL(addr)
    except httpx.InvalidURL as e:
        raise CliError(f"invalid --addr / PROSPERO_ADDR {given!r}: {e}", code=exits.USAGE) from None
    if url.scheme not in ("http", "https") or not url.host:
        raise CliError(
            f"invalid --addr / PROSPERO_ADDR {given!r}: expected a URL like {DEFAULT_ADDR}",
            code=exits.USAGE,
        )
    return addr


def seg(value: str) -> str:
    """Quote one path segment (agent ids and workspace names are user input)."""
    return quote(value, safe="")


def error_from_response(resp: httpx.Response) -> ServerError:
    """Build `server returned <code>: <error>` from the `{error, kind}` envelope when present."""
    error: str | None = None
    kind: str | None = None
    try:
        body = resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        body = None
    if isinstance(body, dict):
        if isinstance(body.get("error"), str):
            error = body["error"]
            kind = body.get("kind") if isinstance(body.get("kind"), str) else None
        elif "detail" in body:  # a framework-shaped error, should the envelope be missing
            error = str(body["detail"])
    if not error:
        text = resp.text.strip().splitlines()
        error = text[0][:200] if text else (resp.reason_phrase or "error")
    return ServerError(resp.status_code, error, kind, body)


@dataclass
class SseMessage:
    event: str  # "message" for unnamed frames
    data: str
    id: str | None = None


def iter_sse(lines: Iterator[str]) -> Iterator[SseMessage | None]:
    """Parse an SSE line stream. Yields a message per dispatched event and None per comment
    (heartbeats), so callers get a chance to run on keep-alives."""
    event = ""
    data: list[str] = []
    last_id: str | None = None
    for raw in lines:
        line = raw.rstrip("\r")
        if not line:
            if data:
                yield SseMessage(event or "message", "\n".join(data), last_id)
            event, data = "", []
            continue
        if line.startswith(":"):
            yield None
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            event = value
        elif field == "id":
            last_id = value
        # "retry" and unknown fields are ignored, as the SSE spec says.
    # An event not terminated by a blank line when the stream ends is discarded (SSE spec):
    # after a cut connection it may be incomplete; the resume re-sends it.


class Client:
    def __init__(
        self,
        addr: str | None = None,
        token: str | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: httpx.Timeout = REQUEST_TIMEOUT,
    ) -> None:
        self.addr = normalize_addr(addr)
        # X-Prospero-Client marks requests that a cross-site page could not send (prosperod's
        # OriginGuard wants it, a bearer header or a JSON body on every state change).
        headers = {
            "Accept": "application/json",
            "User-Agent": "prospero-cli",
            "X-Prospero-Client": "cli",
        }
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.addr,
            headers=headers,
            timeout=timeout,
            transport=transport,
            trust_env=False,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def unreachable(self, exc: Exception | None = None) -> Unreachable:
        return Unreachable(f"cannot reach prosperod at {self.addr} (is the daemon running?)")

    # ------------------------------------------------------------------ plain requests

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        send_body: bool = False,
    ) -> httpx.Response:
        kwargs: dict[str, Any] = {}
        if json_body is not None or send_body:
            kwargs["json"] = json_body
        if params:
            kwargs["params"] = {k: v for k, v in params.items() if v is not None}
        try:
            resp = self._http.request(method, path, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise self.unreachable(e) from None
        except httpx.TimeoutException:
            raise Unreachable(f"prosperod at {self.addr} did not answer in time") from None
        except httpx.TransportError as e:
            raise Unreachable(f"connection to prosperod at {self.addr} failed: {e}") from None
        if resp.status_code >= 400:
            raise error_from_response(resp)
        return resp

    def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        resp = self.request("GET", path, params=params)
        try:
            return resp.json()
        except ValueError:
            raise CliError(
                f"prosperod at {self.addr} returned a non-JSON body for {path}"
            ) from None

    def get_model(self, path: str, model: type[M], params: dict[str, Any] | None = None) -> M:
        """GET `path` and read its JSON into `model` (a DTO of `prospero.types`, or a list
        of them): a reply of another shape is one line, not a traceback."""
        return self.parse(self.get_json(path, params), model, path)

    def get_both(
        self, path: str, model: type[M], params: dict[str, Any] | None = None
    ) -> tuple[Any, M]:
        """The reply's JSON as it came (for -o json|yaml) and read into `model`."""
        data = self.get_json(path, params)
        return data, self.parse(data, model, path)

    def parse(self, data: Any, model: type[M], what: str) -> M:
        try:
            return TypeAdapter(model).validate_python(data)
        except ValidationError as e:
            where, why = "body", "invalid"
            if e.errors():
                first = e.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "body"
                why = first["msg"]
            raise CliError(
                f"prosperod at {self.addr} returned an unexpected reply for {what} ({where}: {why})"
            ) from None

    def resolve_agent(self, given: str) -> str:
        """The agent id a unique prefix (or a whole id) names, through the API's
        `GET /api/agent-ids/{prefix}`: not found (exit 3) when nothing matches, a conflict
        (exit 5) listing the candidates when several do."""
        try:
            resp = self.request("GET", f"/api/agent-ids/{seg(given)}")
        except ServerError as e:
            if e.status == 404 and e.kind == "not_found" and e.error == "no such endpoint":
                return given  # a prosperod older than prefixes: take the id as given
            if e.status == 409 and isinstance(e.body, dict) and "candidates" in e.body:
                amb = self.parse(e.body, AmbiguousAgentId, "an ambiguous agent id")
                raise CliError(ambiguous_message(amb), exits.CONFLICT) from None
            raise
        return self.parse(resp.json(), AgentIdResolution, "an agent id").agent.agent_id

    def healthz(self) -> bool:
        try:
            resp = self._http.get("/healthz", timeout=5.0)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    # ------------------------------------------------------------------ SSE

    def stream_lines(
        self, path: str, params: dict[str, Any], last_event_id: int | None
    ) -> AbstractContextManager[httpx.Response]:
        """Open an SSE response (a context manager). Connect errors raise `Unreachable`."""
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if last_event_id is not None and last_event_id > 0:
            headers["Last-Event-ID"] = str(last_event_id)
        # No overall read timeout: a quiet agent is legitimately silent; keep-alives and
        # the caller's own checks bound the wait.
        return self._http.stream(
            "GET",
            path,
            params=params,
            headers=headers,
            timeout=httpx.Timeout(None, connect=5.0, read=STREAM_READ_TIMEOUT),
        )


# A stream with neither data nor keep-alive for this long is treated as dropped (reconnect).
STREAM_READ_TIMEOUT = 45.0


@dataclass
class FollowItem:
    """One thing `follow_events` yields: an event, a gap signal, or a note (reconnects)."""

    kind: str  # "event" | "gap" | "reconnect" | "tick"
    data: Any = None


def follow_events(
    client: Client,
    agent_id: str,
    from_seq: int = 0,
    *,
    reconnect_budget: float = 30.0,
    terminal_grace: float = 3.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[FollowItem]:
    """Follow one agent's SSE stream, resuming across dropped connections without duplicates.

    Stops after `agent_finished` (or `agent_gone`), or when the agent turned terminal and the
    stream said nothing more for `terminal_grace` seconds. Reconnects with
    `?from=last+1` and `Last-Event-ID: last`; events with `seq <= last` are dropped.
    """
    path = f"/api/agents/{seg(agent_id)}/stream"
    last = max(from_seq, 0) - 1
    first_attempt = True
    failing_since: float | None = None
    terminal_at: float | None = None
    attempt = 0
    while True:
        params = {"from": last + 1}
        try:
            with client.stream_lines(path, params, last if last >= 0 else None) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise error_from_response(resp)
                first_attempt = False
                failing_since = None
                for msg in iter_sse(resp.iter_lines()):
                    attempt = 0  # the connection delivered something: back off from scratch
                    if msg is None:
                        yield FollowItem("tick")
                    elif msg.event == "gap":
                        yield FollowItem("gap", _loads(msg.data))
                    elif msg.event in ("message", ""):
                        ev = _loads(msg.data)
                        if not isinstance(ev, dict):
                            continue
                        seq = ev.get("seq")
                        if isinstance(seq, int):
                            if seq <= last:
                                continue  # duplicate after a resume
                            last = seq
                        yield FollowItem("event", ev)
                        kind = (ev.get("kind") or {}).get("kind")
                        if kind in ("agent_finished", "agent_gone"):
                            return
                        if kind == "status_changed" and _terminal(ev["kind"].get("to")):
                            terminal_at = time.monotonic()
                    if terminal_at is not None and time.monotonic() - terminal_at > terminal_grace:
                        return
            # The server closed the stream. It does so after agent_finished (handled above)
            # or when shutting down; an agent already terminal has nothing more to say.
            if terminal_at is not None:
                return
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            if first_attempt:
                raise client.unreachable(e) from None
        except (httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError):
            if terminal_at is not None:
                return
        except httpx.TransportError as e:
            if first_attempt:
                raise Unreachable(f"connection to prosperod at {client.addr} failed: {e}") from None
        now = time.monotonic()
        if failing_since is None:
            failing_since = now
        elif now - failing_since > reconnect_budget:
            raise client.unreachable()
        yield FollowItem("reconnect", last + 1)
        sleep(min(2.0, 0.1 * (2**attempt)))
        attempt += 1


def fleet_events(
    client: Client,
    last: int,
    kinds: Collection[str],
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[dict[str, Any] | None]:
    """Follow the fleet stream from store ordinal `last + 1`, only events of `kinds`,
    resuming after a dropped connection; yields each event, and None at each keep-alive (so
    the caller can check its own deadline). Gives up (Unreachable) after 6 failures in a
    row."""
    failures = 0
    params_kinds = ",".join(sorted(kinds))
    while True:
        try:
            with client.stream_lines(
                "/api/stream", {"from": last + 1, "kinds": params_kinds}, None
            ) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise error_from_response(resp)
                failures = 0
                for msg in iter_sse(resp.iter_lines()):
                    if msg is None:
                        yield None
                        continue
                    if msg.event not in ("message", ""):
                        continue
                    if msg.id is not None and msg.id.isdigit():
                        last = int(msg.id)
                    ev = _loads(msg.data)
                    if isinstance(ev, dict) and (ev.get("kind") or {}).get("kind") in kinds:
                        yield ev
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            failures += 1
            if failures > 5:
                raise client.unreachable(e) from None
        except (httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError):
            failures += 1
        sleep(min(2.0, 0.1 * 2**failures))


def _terminal(status: Any) -> bool:
    try:
        return AgentStatus(status).terminal
    except ValueError:
        return False


def ambiguous_message(amb: AmbiguousAgentId) -> str:
    """`agent id prefix '65b' is ambiguous; it matches: 65b7… (alpha, running), …`"""
    parts = []
    for c in amb.candidates:
        about = ", ".join(x for x in (c.workspace, c.status, c.label) if x)
        parts.append(f"{c.agent_id} ({about})" if about else c.agent_id)
    more = f" and {amb.more} more" if amb.more else ""
    return (
        f"agent id prefix '{amb.prefix}' is ambiguous; it matches: {', '.join(parts)}{more} "
        "(give more of the id)"
    )


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
