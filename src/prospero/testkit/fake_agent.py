"""A fake caliban agent worker: one agent's per-agent stream (caliband-wire.md §4).

Faithful to `caliban __agent-worker` where tests can tell the difference:

- On accept the worker writes its retained history (a ring of the last `ring_size` lines),
  then live lines. Snapshot + subscribe happen in one step, so every retained line is seen
  exactly once and in order. There is no hello and no handshake besides TLS + bearer (TCP).
- Live delivery per client is bounded (`live_queue_size`, 1024 like the broadcast channel);
  a client that falls behind silently loses its *oldest* undelivered lines (counted in
  `lines_dropped`) and continues.
- After `RunEnd`: short linger (~100 ms), exit code (EndOfTurn 0, MaxTurnsReached 75,
  Cancelled 124, anything else 1), stop accepting and unlink the Unix socket, flush and close
  every connection (EOF).
- Inbound `AttachInbound` frames are read from every connection into one shared inbox
  (capacity 64, extra frames dropped and counted); honoured only when `interactive`.
  Unparseable lines are skipped (counted in `inbound_malformed`).
- TCP: TLS handshake, then (if a token is set) the `{"bearer": ...}` preamble line (at most
  4096 bytes, constant-time compare; `prospero.testkit.listener`, shared by every fake); any
  failure drops the connection without a word. The
  client's inbound bytes are drained while writing and connections are half-closed cleanly
  so the peer sees FIN, not RST.

Test-only observations: `history`, `inbound`, `lines_dropped`, `connections_total`, ...
Script entries are described in `prospero.testkit.scripts`; a `FaultPlan`
(`prospero.testkit.faults`) adds cuts, refused reconnects, slow readers, crashes and bad lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from typing import IO, Any

import orjson
from pydantic import ValidationError

from prospero.core.aio import wait_for
from prospero.core.transport import STREAM_LIMIT, OversizedLine, read_line
from prospero.core.wire.control import ATTACH_INBOUND_ADAPTER, Endpoint, TcpEndpoint, UnixEndpoint
from prospero.core.wire.turnevents import EXIT_CODE_BY_STOP, stop_label
from prospero.testkit import scripts
from prospero.testkit.fake_agent_client import AttachClient
from prospero.testkit.faults import FaultPlan, FaultRunner
from prospero.testkit.listener import admit, bound_port, listen_tcp, listen_unix, tcp_addr
from prospero.testkit.listener import read_bearer_preamble as read_bearer_preamble  # re-export

log = logging.getLogger(__name__)

RING_SIZE = 1024
LIVE_QUEUE_SIZE = 1024
INBOX_CAPACITY = 64
LINGER = 0.1
SIGTERM_EXIT = 143  # 128 + SIGTERM: what a worker killed by the daemon reports
CLOSE_GRACE = 2.0  # upper bound for flushing clients at exit


def exit_code_for(stopped_for: Any) -> int:
    """Worker exit code for a RunEnd's `stopped_for` (caliband-wire.md §5.1)."""
    return EXIT_CODE_BY_STOP.get(stop_label(stopped_for), 1)


class FakeAgentWorker:
    def __init__(
        self,
        agent_id: str,
        script: Sequence[dict[str, Any] | str],
        *,
        interactive: bool = False,
        ring_size: int = RING_SIZE,
        line_delay: float = 0.0,
        on_status: Callable[[str], None] | None = None,
        on_exit: Callable[[int], None] | None = None,
        live_queue_size: int = LIVE_QUEUE_SIZE,
        inbox_capacity: int = INBOX_CAPACITY,
        linger: float = LINGER,
        transcript_path: str | os.PathLike[str] | None = None,
        fault_plan: FaultPlan | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.script: list[dict[str, Any] | str] = list(script)
        self.interactive = interactive
        self.ring_size = ring_size
        self.fault_plan = fault_plan
        if fault_plan is not None and fault_plan.line_delay is not None:
            line_delay = fault_plan.line_delay
        self.line_delay = line_delay
        self.on_status = on_status
        self.on_exit = on_exit
        self.live_queue_size = live_queue_size
        self.linger = linger
        # observations for tests
        self.inbound: list[dict[str, Any]] = []
        self.history: list[bytes] = []
        self.exit_code: int | None = None
        self.endpoints: list[Endpoint] = []
        self.status_reports: list[str] = []
        self.lines_dropped = 0  # live lines lost by slow clients (all clients together)
        self.inbox_dropped = 0
        self.inbound_malformed = 0
        self.inbound_ignored = 0  # well-formed frames a non-interactive worker ignored
        self.connections_total = 0
        self.auth_failures = 0
        self.replies_emitted = 0
        self.exited_detached = False  # the run ended while no reader was connected
        # internals
        self._relisten: list[Callable[[], Any]] = []  # how to listen again after a refusal
        self._faults = FaultRunner(fault_plan, self) if fault_plan is not None else None
        self._ring: deque[bytes] = deque(maxlen=ring_size)
        self._clients: set[AttachClient] = set()
        self._servers: list[asyncio.Server] = []
        self._unix_paths: list[tuple[str, int]] = []
        self._conns: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self._play_task: asyncio.Task[None] | None = None
        self._gate = asyncio.Event()
        self._gate.set()
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue(inbox_capacity)
        self._finished = asyncio.Event()
        self._accepting = True
        self._exit_started = False
        self._waiting_input = False
        self._turn_index = -1
        self._model: str = scripts.DEFAULT_MODEL  # model of the last TurnStart, reused by replies
        self._transcript: IO[bytes] | None = None
        if transcript_path is not None:
            self._transcript = open(transcript_path, "ab")  # closed at exit

    # --- properties -------------------------------------------------------------------------

    @property
    def cuts(self) -> int:
        """Fault plan: how many times the readers were cut."""
        return self._faults.cuts if self._faults is not None else 0

    @property
    def refused_windows(self) -> int:
        """Fault plan: how many times the endpoint stopped listening."""
        return self._faults.refused_windows if self._faults is not None else 0

    @property
    def lines_emitted(self) -> int:
        return len(self.history)

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    @property
    def running(self) -> bool:
        """Started and not exited."""
        return self._play_task is not None and self.exit_code is None

    @property
    def waiting_input(self) -> bool:
        """True while parked at an interactive input boundary (reported `idle`)."""
        return self._waiting_input

    @property
    def active_clients(self) -> int:
        return len(self._clients)

    @property
    def endpoint(self) -> Endpoint:
        if not self.endpoints:
            raise RuntimeError(f"worker {self.agent_id} is not serving")
        return self.endpoints[0]

    # --- serving ----------------------------------------------------------------------------

    async def serve_unix(self, path: str) -> UnixEndpoint:
        async def on_connect(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await self._on_connect(r, w, None)

        async def listen() -> None:
            server, ino = await listen_unix(on_connect, path, limit=STREAM_LIMIT)
            self._servers.append(server)
            self._unix_paths.append((path, ino))

        await listen()
        self._relisten.append(listen)
        ep = UnixEndpoint(path=path)
        self.endpoints.append(ep)
        return ep

    async def serve_tcp(
        self, host: str, port: int, ssl_context: ssl.SSLContext | None, token: str | None
    ) -> TcpEndpoint:
        """Listen on host:port (0 = ephemeral). `ssl_context=None` serves plaintext (fakes only)."""

        async def on_connect(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await self._on_connect(r, w, token)

        server = await listen_tcp(on_connect, host, port, ssl_context, limit=STREAM_LIMIT)
        self._servers.append(server)
        bound = bound_port(server)

        async def listen() -> None:  # again on the same port, after a refused window
            again = await listen_tcp(on_connect, host, bound, ssl_context, limit=STREAM_LIMIT)
            self._servers.append(again)

        self._relisten.append(listen)
        ep = TcpEndpoint(addr=tcp_addr(host, bound))
        self.endpoints.append(ep)
        return ep

    # --- playback control -------------------------------------------------------------------

    def start(self) -> None:
        if self._play_task is None and not self._exit_started:
            self._play_task = asyncio.create_task(self._play(), name=f"fake-agent-{self.agent_id}")

    def pause(self) -> None:
        self._gate.clear()

    def resume(self) -> None:
        self._gate.set()

    def emit(self, entry: dict[str, Any] | str | bytes) -> None:
        """Write one line right now (bypassing the script), e.g. to add live lines in tests."""
        if isinstance(entry, bytes):
            self._emit(entry)
        elif isinstance(entry, str):
            self._emit(entry.encode())
        else:
            self._emit_frame(entry)

    def cut_connections(self) -> None:
        """Abort every connected client now (simulates a dropped connection)."""
        for c in list(self._clients):
            c.aborted = True
            c.wake.set()
            c.writer.transport.abort()

    async def wait_finished(self, timeout: float | None = None) -> int:
        await wait_for(self._finished.wait(), timeout)
        assert self.exit_code is not None
        return self.exit_code

    async def stop(self) -> None:
        """Stop as if SIGTERMed: stop serving, unlink the socket, close connections.

        A worker that had not exited yet reports exit code 143 (via `on_exit`)."""
        if self._finished.is_set():
            self._close_servers()
            return
        if self._exit_started:
            with contextlib.suppress(TimeoutError):
                await wait_for(self._finished.wait(), CLOSE_GRACE + 1.0)
            if self._finished.is_set():
                return
        if self._play_task is not None and not self._play_task.done():
            self._play_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._play_task
        self._exit_started = True
        self._close_servers()
        if self.exit_code is None:
            self.exit_code = SIGTERM_EXIT
            self._notify_exit(SIGTERM_EXIT)
        for c in list(self._clients):
            c.aborted = True
            c.wake.set()
        for w in list(self._conns.values()):
            w.close()
        await self._wait_conn_tasks(1.0)
        self._close_transcript()
        self._finished.set()

    # --- internals: emission ----------------------------------------------------------------

    def _emit(self, line: bytes) -> None:
        line = line.rstrip(b"\r\n")
        self.history.append(line)
        self._ring.append(line)
        if self._transcript is not None:
            with contextlib.suppress(OSError):
                self._transcript.write(line + b"\n")
                self._transcript.flush()
        for c in self._clients:
            if not c.offer(line):
                self.lines_dropped += 1
        if self._faults is not None:
            self._faults.after_line(len(self.history))

    def _emit_frame(self, frame: dict[str, Any]) -> None:
        ti = frame.get("turn_index")
        if isinstance(ti, int) and ti > self._turn_index:
            self._turn_index = ti
        if frame.get("type") == "TurnStart" and isinstance(frame.get("model"), str):
            self._model = frame["model"]
        self._emit(orjson.dumps(frame))

    # --- internals: fault plan hooks (prospero.testkit.faults.FaultRunner) -----------------

    @property
    def exiting(self) -> bool:
        return self._exit_started

    def readers(self) -> list[AttachClient]:
        return list(self._clients)

    def write_line(self, line: bytes) -> None:
        self._emit(line)

    def stop_listening(self) -> None:
        """Close the listeners for now: dials are refused (a Unix socket file stays, dead,
        until the worker listens again or exits)."""
        servers, self._servers = self._servers, []
        for srv in servers:
            srv.close()

    async def listen_again(self) -> None:
        """After a refused window: listen again on the same addresses."""
        for listen in self._relisten:
            try:
                await listen()
            except OSError as e:
                log.warning("fake agent %s: cannot listen again: %s", self.agent_id, e)
        if self._exit_started:  # exited while we re-listened
            self._close_servers()

    async def _pace(self) -> None:
        # Always yield: a real worker's producer (a model stream) never emits a burst without
        # letting its socket writers run; a tight loop here would overflow every live queue.
        await asyncio.sleep(self.line_delay if self.line_delay > 0 else 0)

    def _report(self, status: str) -> None:
        self.status_reports.append(status)
        if self.on_status is not None:
            try:
                self.on_status(status)
            except Exception:
                log.exception("on_status callback failed for %s", self.agent_id)

    def _notify_exit(self, code: int) -> None:
        if self.on_exit is not None:
            try:
                self.on_exit(code)
            except Exception:
                log.exception("on_exit callback failed for %s", self.agent_id)

    async def _play(self) -> None:
        has_wait = any(isinstance(e, dict) and "$wait_input" in e for e in self.script)
        plan = self.fault_plan
        try:
            if plan is not None:
                for bad in plan.bad_lines_after(0):
                    self._emit(bad)
            for entry in self.script:
                await self._gate.wait()
                if plan is not None and plan.crash_at is not None:
                    if self.lines_emitted >= plan.crash_at:  # a stream error: no RunEnd
                        await self._exit(plan.crash_code, linger=False)
                        return
                if isinstance(entry, str):
                    self._emit(entry.encode())
                    await self._pace()
                    continue
                if not isinstance(entry, dict):
                    log.warning("fake agent %s: skipping script entry %r", self.agent_id, entry)
                    continue
                if "$sleep" in entry:
                    await asyncio.sleep(float(entry["$sleep"]))
                elif "$wait_input" in entry:
                    if self.interactive:
                        await self._input_boundary()
                elif "$exit" in entry:
                    await self._exit(int(entry["$exit"]), linger=False)
                    return
                elif "$raw" in entry:
                    self._emit(str(entry["$raw"]).encode())
                    await self._pace()
                elif entry.get("type") == "RunEnd":
                    if self.interactive and not has_wait:
                        await self._input_boundary()
                        await self._gate.wait()
                    self._emit_frame(entry)
                    await self._exit(exit_code_for(entry.get("stopped_for")), linger=True)
                    return
                else:
                    self._emit_frame(entry)
                    await self._pace()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("fake agent %s: stream error", self.agent_id)
            await self._exit(1, linger=False)
        # Script exhausted without RunEnd/$exit: the agent stays "running" until stopped.

    async def _input_boundary(self) -> None:
        """Wait for operator input: UserMessage -> one echo turn, EndInput -> return."""
        self._waiting_input = True
        self._report("idle")
        try:
            while True:
                frame = await self._inbox.get()
                if frame.get("type") == "UserMessage":
                    self._waiting_input = False
                    self._report("running")
                    await self._reply(str(frame.get("text", "")))
                    self._waiting_input = True
                    self._report("idle")
                else:  # EndInput
                    self._waiting_input = False
                    self._report("running")
                    return
        finally:
            self._waiting_input = False

    async def _reply(self, text: str) -> None:
        turn = self._turn_index + 1
        self.replies_emitted += 1
        reply = f"echo: {text}"
        frames = [
            scripts.turn_start(
                turn,
                message_id=f"msg_reply_{self.replies_emitted:04d}",
                model=self._model,
            ),
            scripts.text_delta(reply, turn, 0),
            scripts.turn_end(turn, content=[scripts.text_block(reply)]),
        ]
        for f in frames:
            await self._gate.wait()
            self._emit_frame(f)
            await self._pace()

    # --- internals: exit --------------------------------------------------------------------

    async def _exit(self, code: int, *, linger: bool) -> None:
        if self._exit_started:
            return
        self._exit_started = True
        if linger and self.linger > 0:
            await asyncio.sleep(self.linger)
        self.exit_code = code
        self.exited_detached = not self._clients
        self._close_servers()
        self._notify_exit(code)
        for c in list(self._clients):
            c.eof = True
            c.stalled = False  # a slow reader still gets what its queue kept
            c.wake.set()
        await self._wait_conn_tasks(CLOSE_GRACE)
        self._close_transcript()
        self._finished.set()

    def _close_servers(self) -> None:
        self._accepting = False
        if self._faults is not None:
            self._faults.close()
        for s in self._servers:
            s.close()
        self._servers.clear()
        for path, ino in self._unix_paths:
            with contextlib.suppress(OSError):
                if os.stat(path).st_ino == ino:
                    os.unlink(path)
        self._unix_paths.clear()

    def _close_transcript(self) -> None:
        if self._transcript is not None:
            with contextlib.suppress(OSError):
                self._transcript.close()
            self._transcript = None

    async def _wait_conn_tasks(self, limit: float) -> bool:
        """Wait for connection handlers to end; past `limit` abort their transports (and only
        as a last resort cancel them). True when all ended within `limit`."""
        tasks = [t for t in self._conns if t is not asyncio.current_task()]
        if not tasks:
            return True
        _, pending = await asyncio.wait(tasks, timeout=limit)
        if not pending:
            return True
        for t in pending:
            w = self._conns.get(t)
            if w is not None:
                w.transport.abort()
        _, pending = await asyncio.wait(pending, timeout=0.5)
        for t in pending:
            t.cancel()
        return False

    # --- internals: connections -------------------------------------------------------------

    async def _on_connect(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str | None
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns[task] = writer
        try:
            if not await admit(reader, writer, token):
                self.auth_failures += 1
                log.info("fake agent %s: dropped a connection (bad bearer preamble)", self.agent_id)
                return
            if not self._accepting:
                writer.transport.abort()
                return
            await self._serve_client(reader, writer)
        except Exception:
            log.debug("fake agent %s: connection ended with an error", self.agent_id, exc_info=True)
        except asyncio.CancelledError:
            # Outermost frame of a server-owned task: end quietly (a re-raised cancel makes
            # Python 3.11's stream callback log a spurious traceback at loop teardown).
            pass
        finally:
            self._conns.pop(task, None)

    async def _serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        # Snapshot and subscribe in one synchronous step: no line can slip in between.
        client = AttachClient(reader, writer, list(self._ring), self.live_queue_size)
        self._clients.add(client)
        self.connections_total += 1
        if self.exit_code is not None:
            client.eof = True
        rtask = asyncio.create_task(self._read_inbound(client))
        graceful = False
        try:
            graceful = await client.write_all()
        except (OSError, ssl.SSLError):
            pass
        finally:
            self._clients.discard(client)
            await client.close(rtask, graceful)

    async def _read_inbound(self, c: AttachClient) -> None:
        while True:
            try:
                line = await read_line(c.reader)
            except OversizedLine:
                self.inbound_malformed += 1
                continue
            except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
                return
            if line is None:
                return
            text = line.strip()
            if not text:
                continue
            try:
                frame = ATTACH_INBOUND_ADAPTER.validate_json(text)
            except ValidationError:
                self.inbound_malformed += 1
                log.debug("fake agent %s: skipped unparseable inbound line", self.agent_id)
                continue
            d = frame.model_dump(mode="json")
            self.inbound.append(d)
            if not self.interactive:
                self.inbound_ignored += 1
                continue
            try:
                self._inbox.put_nowait(d)
            except asyncio.QueueFull:
                self.inbox_dropped += 1
                log.warning("fake agent %s: inbox full, dropped an inbound frame", self.agent_id)
