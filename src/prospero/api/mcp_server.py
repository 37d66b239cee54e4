"""The MCP server at `/mcp` (issue 15 item 1): the official `mcp` SDK's streamable HTTP
transport, mounted as one route of prosperod's FastAPI app. Its tools: `api/mcp_tools.py`.

Where it sits. `/mcp` is an ordinary route of the app, so every layer in front of the API's
routes is in front of it too (`api/app.py`): the access log, `HostGuard` (421 for a Host that
is not allowed: DNS rebinding), `OriginGuard` (403 for a cross-site POST/DELETE, or one that a
cross-site form could send), authentication (`/mcp` needs the `operate` scope: 401 without
valid credentials, 403 with a smaller scope; `auth.ROUTE_TABLE`), the body limit and timeout.
On top of those, `McpEndpoint` refuses ANY request to `/mcp` (GET included) that says it comes
from another origin (`Origin`, `Sec-Fetch-Site`), which is what the SDK's own Origin check
does.

Transport security. The SDK's `TransportSecuritySettings` (its own Host/Origin allowlist) is
turned off on purpose: it can only list exact `host[:*]` names, while prosperod's policy
(`guard.HostPolicy`: loopback names and any loopback IP literal, the address the connection
arrived on, `--allowed-host` names and `*.suffix` patterns, `--public-url` origins) is the one
the rest of the API obeys. Enabled with a copy of that list it would refuse, in plain text,
some requests the API serves; so the one policy applies once, in front, and `/mcp` answers
exactly the hosts and origins the API answers. The SDK's JSON Content-Type check of POSTs
stays (it is not part of those settings).

Stateless. Each POST is served on its own (`stateless_http`): no session id, no server-held
session state, no GET stream (GET and DELETE answer 405, as the spec has a server without a
stream answer), so any replica of a cluster can serve any request (the tools
reach an agent's owner through the same relay as the REST routes) and an idle client costs
nothing. The SDK's session manager (its task group) runs in a task of its own, started by the
first request to `/mcp` and stopped by `ApiState.shutdown()` (the HTTP server stopping), which
cancels the tool calls still in flight; `/mcp` then answers 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from fastapi import FastAPI
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

import prospero
from prospero.api.deps import ApiState
from prospero.api.errors import send_envelope
from prospero.api.guard import CROSS_ORIGIN, cross_site_marked
from prospero.api.mcp_tools import ProsperoTools

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
MCP_METHODS = ("GET", "POST", "DELETE")
INSTRUCTIONS = (
    "Prospero is a control plane for fleets of coding agents. list_workspaces and list_agents "
    "show the fleet; spawn starts an agent in a workspace (wait_seconds waits for it to "
    "finish); follow it with agent_status and agent_events (paged: pass next_from as `from` "
    "while truncated is true). Interactive agents take send_input and end_input; "
    "cancel_turn, kill and respawn act on one agent. Supervised ACP agents ask permission: "
    "list_decisions shows the pending asks, approve and deny answer them."
)


@contextlib.contextmanager
def _no_root_logging_setup() -> Iterator[None]:
    """`MCPServer()` calls `logging.basicConfig` (a rich handler on the root logger at INFO)
    when the root logger has no handler yet; prosperod's logging is its own (`daemon/main`),
    so a placeholder handler makes that call a no-op while the server is built."""
    root = logging.getLogger()
    placeholder = logging.NullHandler() if not root.handlers else None
    if placeholder is not None:
        root.addHandler(placeholder)
    try:
        yield
    finally:
        if placeholder is not None:
            root.removeHandler(placeholder)


def build_server(state: ApiState) -> MCPServer:
    """The SDK server with Prospero's tools, bound to one app's state."""
    with _no_root_logging_setup():
        server: MCPServer = MCPServer(
            name="prosperod",
            title="Prospero",
            version=prospero.__version__,
            instructions=INSTRUCTIONS,
            subscriptions=False,  # no resources to subscribe to
        )
    ProsperoTools(state).register(server)
    return server


class McpEndpoint:
    """The ASGI app of the `/mcp` route: the cross-origin refusal, then the SDK's session
    manager, whose `run()` context is held by a task of its own (module docstring)."""

    def __init__(self, manager: StreamableHTTPSessionManager, public_origins: list[str]) -> None:
        self.manager = manager
        self.public_origins = list(public_origins)
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._closed = False

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        try:
            async with self.manager.run():
                ready.set_result(None)
                await self._stop.wait()
        except Exception as e:
            if not ready.done():
                ready.set_exception(e)
            else:
                log.exception("MCP session manager failed")

    async def _ensure_running(self) -> bool:
        if self._task is not None and not self._task.done():
            return True
        async with self._lock:
            if self._closed:
                return False
            if self._task is None:
                ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._task = asyncio.create_task(self._hold(ready), name="mcp-session-manager")
                try:
                    await ready
                except Exception:
                    self._task = None  # the next request tries again
                    raise
                log.info("MCP server ready at %s", MCP_PATH)
            return not self._task.done()

    async def close(self) -> None:
        """Stop the session manager (in-flight tool calls are cancelled); later requests get
        503."""
        self._closed = True
        self._stop.set()
        task = self._task
        if task is not None:
            with contextlib.suppress(Exception):
                await task

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # pragma: no cover - the route is HTTP only
            return
        if cross_site_marked(scope, self.public_origins):
            await send_envelope(
                send,
                403,
                "a request to /mcp from another origin is refused (Origin / Sec-Fetch-Site)",
                CROSS_ORIGIN,
            )
            return
        if scope["method"] != "POST":
            # Stateless: there is no session to delete, and a GET stream would have nothing to
            # carry (and hold a connection forever); the spec's answer is 405.
            await send_envelope(
                send,
                405,
                f"{scope['method']} /mcp: this MCP server is stateless (no sessions, no GET "
                "stream); send JSON-RPC messages with POST",
                "method_not_allowed",
                ((b"allow", b"POST"),),
            )
            return
        if not await self._ensure_running():
            await send_envelope(send, 503, "prosperod is stopping", "unavailable")
            return
        await self.manager.handle_request(scope, receive, send)


def install_mcp(app: FastAPI, state: ApiState) -> McpEndpoint:
    """Add the `/mcp` route to the app; `state.shutdown()` stops it."""
    server = build_server(state)
    server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=True,
        max_request_body_size=state.settings.max_body_bytes,
        # Off: prosperod's HostGuard / OriginGuard / McpEndpoint apply the API's own policy
        # in front of the SDK (module docstring).
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    endpoint = McpEndpoint(server.session_manager, state.settings.public_origins)
    app.router.routes.append(
        Route(MCP_PATH, endpoint=endpoint, methods=list(MCP_METHODS), include_in_schema=False)
    )
    state.closers.append(endpoint.close)
    return endpoint


__all__ = ["MCP_PATH", "McpEndpoint", "build_server", "install_mcp"]
