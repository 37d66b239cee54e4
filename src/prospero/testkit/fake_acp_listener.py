"""The per-agent ACP endpoint of a fake agent (acp.md; ADR 0011).

`AcpAgentListener(agent_id, agent_factory=..., command=...)` serves ACP on a Unix socket or on
TCP + TLS + the `{"bearer": ...}` preamble (wrong token: dropped without a word), exactly like
the caliban per-agent listener, then ACP's newline-delimited JSON-RPC:

- with `agent_factory`, every connection is served by one scripted agent (the factory is
  called once, at the first connection; `listener.agent`), so sessions survive a reconnect;
  the listener finishes when the agent exits (`exit` step, or `session/close`);
- with `command`, every connection is bridged byte for byte to a freshly spawned stdio ACP
  process (own process group, stderr drained into `stderr_tail`). When the process exits on
  its own (also within `eof_grace` after the client closed the connection, i.e. after stdin
  EOF) the listener finishes with its exit code (signal N -> 128+N); when it has to be killed
  because the client went away, the process group is killed and the listener keeps serving
  (the next connection gets a new process).

`stop()` is a kill: listener closed, connections cut, bridged processes killed, exit code 143.
`exit_code`, `wait_finished()`, `on_exit(code)` report the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from prospero.core.aio import wait_for
from prospero.core.transport import STREAM_LIMIT
from prospero.core.wire.control import Endpoint, TcpEndpoint, UnixEndpoint
from prospero.testkit.fake_acp import CLOSE_GRACE, FakeAcpAgent
from prospero.testkit.fake_agent import SIGTERM_EXIT
from prospero.testkit.listener import admit, bound_port, listen_tcp, listen_unix, tcp_addr

log = logging.getLogger(__name__)

EOF_GRACE = 2.0
KILL_GRACE = 1.0
READ_CHUNK = 64 * 1024


class AcpAgentListener:
    """The per-agent ACP endpoint of one fake agent (see the module docstring)."""

    def __init__(
        self,
        agent_id: str,
        *,
        agent_factory: Callable[[], FakeAcpAgent] | None = None,
        command: Sequence[str] | None = None,
        on_exit: Callable[[int], None] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        linger: float = 0.0,
        eof_grace: float = EOF_GRACE,
    ) -> None:
        if (agent_factory is None) == (command is None):
            raise ValueError("give exactly one of agent_factory and command")
        if command is not None and not list(command):
            raise ValueError("empty ACP command")
        self.agent_id = agent_id
        self.agent_factory = agent_factory
        self.command: list[str] | None = list(command) if command is not None else None
        self.on_exit = on_exit
        self.cwd = str(cwd) if cwd is not None else None
        self.env = env
        self.linger = linger
        self.eof_grace = eof_grace
        # observations
        self.agent: FakeAcpAgent | None = None
        self.exit_code: int | None = None
        self.endpoints: list[Endpoint] = []
        self.connections_total = 0
        self.auth_failures = 0
        self.processes_started = 0
        self.process_exit_codes: list[int] = []
        self.stderr_tail: deque[str] = deque(maxlen=200)
        # internals
        self._servers: list[asyncio.Server] = []
        self._unix_paths: list[tuple[str, int]] = []
        self._conns: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self._procs: set[asyncio.subprocess.Process] = set()
        self._accepting = True
        self._exit_started = False
        self._finished = asyncio.Event()
        self._exit_task: asyncio.Task[None] | None = None

    # --- properties -------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    @property
    def running(self) -> bool:
        return not self._exit_started

    @property
    def endpoint(self) -> Endpoint:
        if not self.endpoints:
            raise RuntimeError(f"ACP listener {self.agent_id} is not serving")
        return self.endpoints[0]

    @property
    def active_connections(self) -> int:
        return len(self._conns)

    # --- serving ----------------------------------------------------------------------------

    async def serve_unix(self, path: str) -> UnixEndpoint:
        async def on_connect(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await self._on_connect(r, w, None)

        server, ino = await listen_unix(on_connect, path, limit=STREAM_LIMIT)
        self._servers.append(server)
        self._unix_paths.append((path, ino))
        ep = UnixEndpoint(path=path)
        self.endpoints.append(ep)
        return ep

    async def serve_tcp(
        self, host: str, port: int, ssl_context: ssl.SSLContext | None, token: str | None
    ) -> TcpEndpoint:
        """Listen on host:port (0 = ephemeral); `ssl_context=None` is plaintext (fakes only)."""

        async def on_connect(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await self._on_connect(r, w, token)

        server = await listen_tcp(on_connect, host, port, ssl_context, limit=STREAM_LIMIT)
        self._servers.append(server)
        ep = TcpEndpoint(addr=tcp_addr(host, bound_port(server)))
        self.endpoints.append(ep)
        return ep

    async def wait_finished(self, timeout: float | None = None) -> int:
        await wait_for(self._finished.wait(), timeout)
        assert self.exit_code is not None
        return self.exit_code

    async def stop(self) -> None:
        """Kill: stop listening, cut connections, kill bridged processes; exit code 143."""
        if self._finished.is_set():
            self._close_servers()
            return
        if self._exit_started:
            with contextlib.suppress(TimeoutError):
                await wait_for(self._finished.wait(), CLOSE_GRACE + 2.0)
            if self._finished.is_set():
                return
        self._exit_started = True
        self._close_servers()
        if self.exit_code is None:
            self.exit_code = SIGTERM_EXIT
            self._notify_exit(SIGTERM_EXIT)
        if self.agent is not None:
            await self.agent.close_connections(graceful=False)
        for proc in list(self._procs):
            self._kill_group(proc, signal.SIGTERM)
        for w in list(self._conns.values()):
            w.transport.abort()
        await self._wait_conn_tasks(CLOSE_GRACE + KILL_GRACE)
        self._finished.set()

    # --- internals --------------------------------------------------------------------------

    def _ensure_agent(self) -> FakeAcpAgent:
        if self.agent is None:
            assert self.agent_factory is not None
            agent = self.agent_factory()
            agent.on_exit = self._begin_exit
            self.agent = agent
        return self.agent

    def _notify_exit(self, code: int) -> None:
        if self.on_exit is not None:
            try:
                self.on_exit(code)
            except Exception:
                log.exception("ACP listener %s: on_exit callback failed", self.agent_id)

    def _close_servers(self) -> None:
        self._accepting = False
        for s in self._servers:
            s.close()
        self._servers.clear()
        for path, ino in self._unix_paths:
            with contextlib.suppress(OSError):
                if os.stat(path).st_ino == ino:
                    os.unlink(path)
        self._unix_paths.clear()

    def _begin_exit(self, code: int) -> None:
        """The peer exited on its own with `code`. The exit is reported at once (before any
        connection closes, so a client that sees EOF already finds the final status); the
        connections close in a task, after `linger`."""
        if self._exit_started:
            return
        self._exit_started = True
        self.exit_code = code
        self._close_servers()
        self._notify_exit(code)
        self._exit_task = asyncio.get_running_loop().create_task(
            self._exit(), name=f"acp-listener-exit-{self.agent_id}"
        )

    async def _exit(self) -> None:
        if self.linger > 0:
            await asyncio.sleep(self.linger)
        if self.agent is not None:
            await self.agent.close_connections(graceful=True)
        for proc in list(self._procs):
            self._kill_group(proc, signal.SIGTERM)
        await self._wait_conn_tasks(CLOSE_GRACE + KILL_GRACE)
        self._finished.set()

    async def _wait_conn_tasks(self, limit: float) -> None:
        tasks = [t for t in self._conns if t is not asyncio.current_task()]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=limit)
        if not pending:
            return
        for t in pending:
            w = self._conns.get(t)
            if w is not None:
                w.transport.abort()
        _, pending = await asyncio.wait(pending, timeout=0.5)
        for t in pending:
            t.cancel()

    async def _on_connect(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str | None
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns[task] = writer
        try:
            if not await admit(reader, writer, token):  # shared with every fake (listener)
                self.auth_failures += 1
                log.info("ACP listener %s: dropped a connection (bad bearer)", self.agent_id)
                return
            if not self._accepting:
                writer.transport.abort()
                return
            self.connections_total += 1
            if self.command is None:
                await self._ensure_agent().serve(reader, writer)
            else:
                await self._bridge(reader, writer)
        except Exception:
            log.debug(
                "ACP listener %s: connection ended with an error", self.agent_id, exc_info=True
            )
        except asyncio.CancelledError:
            # Outermost frame of a server-owned task: end quietly.
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            self._conns.pop(task, None)

    # --- bridge -----------------------------------------------------------------------------

    def _kill_group(self, proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.killpg(proc.pid, sig)

    async def _bridge(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self.command is not None
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=self.cwd,
                env=self.env,
                start_new_session=True,
            )
        except OSError as e:
            log.warning("ACP listener %s: cannot start %s: %s", self.agent_id, self.command, e)
            self.stderr_tail.append(f"cannot start {self.command}: {e}")
            writer.transport.abort()
            self._begin_exit(127)
            return
        self.processes_started += 1
        self._procs.add(proc)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr

        async def pump_in() -> None:
            try:
                while data := await reader.read(READ_CHUNK):
                    stdin.write(data)
                    await stdin.drain()
            except (OSError, ssl.SSLError, ConnectionError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    stdin.close()

        async def pump_out() -> None:
            try:
                while data := await stdout.read(READ_CHUNK):
                    writer.write(data)
                    await writer.drain()
            except (OSError, ssl.SSLError, ConnectionError):
                pass

        async def drain_err() -> None:
            with contextlib.suppress(Exception):
                while line := await stderr.readline():
                    text = line.decode(errors="replace").rstrip()
                    self.stderr_tail.append(text)
                    log.debug("ACP peer %s stderr: %s", self.agent_id, text)

        up = asyncio.create_task(pump_in())
        down = asyncio.create_task(pump_out())
        err = asyncio.create_task(drain_err())
        waiter = asyncio.create_task(proc.wait())
        killed_by_us = False
        try:
            await asyncio.wait({up, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                # The client went away (stdin is closed now): let the process end by itself.
                done, _ = await asyncio.wait({waiter}, timeout=self.eof_grace)
                if not done:
                    killed_by_us = True
                    self._kill_group(proc, signal.SIGTERM)
                    done, _ = await asyncio.wait({waiter}, timeout=KILL_GRACE)
                    if not done:
                        self._kill_group(proc, signal.SIGKILL)
                        await waiter
            # Flush what the process wrote before it ended, then clean up stragglers.
            await asyncio.wait({down}, timeout=CLOSE_GRACE)
            self._kill_group(proc, signal.SIGKILL)
            # Record the process's end before reporting the agent's: whoever sees the final
            # status also finds the exit code here.
            self.process_exit_codes.append(_exit_code(proc))
            if not killed_by_us:
                self._begin_exit(_exit_code(proc))  # before the client sees EOF
        finally:
            for t in (up, down, err, waiter):
                if not t.done():
                    t.cancel()
            await asyncio.gather(up, down, err, waiter, return_exceptions=True)
            self._kill_group(proc, signal.SIGKILL)
            self._procs.discard(proc)
            with contextlib.suppress(Exception):
                if writer.can_write_eof() and not writer.transport.is_closing():
                    writer.write_eof()
                writer.close()
                await wait_for(writer.wait_closed(), 1.0)


def _exit_code(proc: asyncio.subprocess.Process) -> int:
    """A shell-style exit code: signal N -> 128 + N."""
    rc = proc.returncode if proc.returncode is not None else -signal.SIGKILL
    return rc if rc >= 0 else 128 - rc
