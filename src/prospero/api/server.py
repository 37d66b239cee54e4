"""Run the API with uvicorn inside the caller's asyncio loop, with our shutdown order.

`ApiServer` binds its own socket (so port 0 works and the bound port is known before serving),
disables uvicorn's signal capture (the daemon owns SIGTERM/SIGINT) and its access log (ours
never writes query strings, which may carry `access_token`).

Slow and abusive clients (`prospero.api.h11_protocol`): the h11 protocol is forced (never
httptools) and subclassed with a header-read deadline per request (`header_timeout`) and a bound
on concurrent connections (`max_connections`, refused with 503 at accept); the body read is
bounded by `BodyLimitMiddleware` (`body_timeout`). The values come from the app's ApiSettings
unless given here.

Idle cost: uvicorn's main loop ticks 10 times a second (to refresh the Date header and look at
`should_exit`); `_Server` waits on an event instead and builds the Date header when a request
reads it, so an idle prosperod is not woken by its HTTP server.

Shutdown (`stop()`): stop accepting connections, end SSE streams and background API tasks,
wait (bounded) for in-flight requests; the caller then stops the Runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections.abc import Generator
from email.utils import formatdate

import uvicorn
from fastapi import FastAPI
from uvicorn.server import ServerState

from prospero.api.app import api_state_of
from prospero.api.h11_protocol import guarded_protocol
from prospero.core.aio import wait_for

log = logging.getLogger(__name__)


class _ServerState(ServerState):
    """uvicorn's state shared by the connections, with the default headers (`Date`) built when
    a request reads them, once per wall-clock second: right to the second with no timer.
    (uvicorn rebuilds them from a 10 Hz tick of its main loop, which this server does not run;
    the tick's own writes are ignored.)"""

    def __init__(self, config: uvicorn.Config) -> None:
        self._config = config
        self._second = -1
        self._headers: list[tuple[bytes, bytes]] = []
        super().__init__()

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        second = int(time.time())
        if second != self._second:
            date = [(b"date", formatdate(second, usegmt=True).encode())]
            self._headers = (date if self._config.date_header else []) + list(
                self._config.encoded_headers
            )
            self._second = second
        return self._headers

    @default_headers.setter
    def default_headers(self, value: list[tuple[bytes, bytes]]) -> None:
        pass  # computed on read (above)


class _Server(uvicorn.Server):
    """uvicorn's server without its idle wakeups: the main loop waits for `should_exit` to be
    set (by `ApiServer.stop()`/`force_exit()`, on the loop) instead of ticking 10 times a
    second, and the Date header is computed on read (`_ServerState`). uvicorn's own loop is
    kept when a tick has work to do (`limit_max_requests`, `callback_notify`: unused here)."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit = asyncio.Event()  # before uvicorn's __init__ sets should_exit
        super().__init__(config)
        self.server_state = _ServerState(config)

    @property
    def should_exit(self) -> bool:
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()
        else:
            self._exit.clear()

    async def main_loop(self) -> None:
        if self.config.limit_max_requests is not None or self.config.callback_notify is not None:
            await super().main_loop()
            return
        await self._exit.wait()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The daemon installs its own handlers; uvicorn must neither replace nor re-raise them.
        yield


def is_loopback(host: str) -> bool:
    h = host.strip().strip("[]")
    if h.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind a listening TCP socket (IPv4 or IPv6 by the host's form). Raises OSError."""
    h = host.strip("[]")
    infos = socket.getaddrinfo(h, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    last: OSError | None = None
    for family, stype, proto, _canon, addr in infos:
        sock = socket.socket(family, stype, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(2048)
            sock.setblocking(False)
            return sock
        except OSError as e:
            sock.close()
            last = e
    raise last or OSError(f"cannot bind {host}:{port}")


# File descriptors kept free beyond max_connections (event store, agent streams, logs, ...).
FD_HEADROOM = 512


def ensure_fd_headroom(max_connections: int) -> None:
    """Raise the soft RLIMIT_NOFILE (never lower it) so that `max_connections` sockets fit;
    warn when the hard limit does not allow it (accept then fails first, with EMFILE)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return
    need = max_connections + FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError):
            pass
    if soft < need:
        log.warning(
            "open-file limit %d is below max_connections %d + %d: raise `ulimit -n` or lower "
            "--max-connections",
            soft,
            max_connections,
            FD_HEADROOM,
        )


class ApiServer:
    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 7878,
        *,
        graceful_timeout: float = 10.0,
        header_timeout: float | None = None,
        max_connections: int | None = None,
    ) -> None:
        settings = api_state_of(app).settings
        self.app = app
        self.header_timeout = settings.header_timeout if header_timeout is None else header_timeout
        self.max_connections = (
            settings.max_connections if max_connections is None else max_connections
        )
        self.host = host
        self.requested_port = port
        self.graceful_timeout = graceful_timeout
        self._sock: socket.socket | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        assert self._sock is not None, "server not started"
        return int(self._sock.getsockname()[1])

    @property
    def url(self) -> str:
        host = self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def bind(self) -> None:
        """Bind the listening socket now (raises OSError), so a busy port fails fast."""
        if self._sock is None:
            self._sock = bind_socket(self.host, self.requested_port)

    def close_socket(self) -> None:
        if self._sock is not None and self._server is None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def force_exit(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True

    async def start(self) -> None:
        """Bind (if not yet) and serve; returns once uvicorn accepts connections."""
        self.bind()
        assert self._sock is not None
        ensure_fd_headroom(self.max_connections)
        protocol = guarded_protocol(
            header_timeout=self.header_timeout,
            max_connections=self.max_connections,
            metrics=api_state_of(self.app).metrics,
        )
        config = uvicorn.Config(
            self.app,
            http=protocol,
            ws="none",
            lifespan="off",
            access_log=False,
            log_config=None,
            server_header=False,
            timeout_graceful_shutdown=max(1, round(self.graceful_timeout)),
            timeout_keep_alive=5,
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]), name="uvicorn")
        while not self._server.started:
            if self._task.done():
                exc = self._task.exception() if not self._task.cancelled() else None
                raise RuntimeError(f"HTTP server failed to start: {exc!r}")
            await asyncio.sleep(0.01)
        log.info("listening on %s", self.url)

    async def wait(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True  # wakes uvicorn's main loop: it closes the listener
        await api_state_of(self.app).shutdown()  # end SSE streams, cancel drains
        try:
            await wait_for(asyncio.shield(self._task), self.graceful_timeout + 5)
        except TimeoutError:
            log.warning("HTTP server did not stop in time; cancelling")
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        except Exception:
            log.exception("HTTP server failed while stopping")
        finally:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.close()
