"""A faithful fake `caliband` control server (caliband-wire.md §1-§2, §10).

Speaks the real NDJSON control protocol over a real Unix socket, or TCP with TLS and the
bearer-token preamble, and runs one FakeAgentWorker per agent for the session plane.

In-process (tests):

    fake = await FakeCaliband.start_unix(path, root=repo)
    ...
    await fake.stop()

As a process (stands in for a real caliband binary, e.g. behind autostart):

    python -m prospero.testkit.fake_caliband [--socket PATH] [--workspace-root DIR] [--script FILE]
    python -m prospero.testkit.fake_caliband --listen HOST:PORT --tls-cert F --tls-key F --token T
    python -m prospero.testkit.fake_caliband ... --scenario FILE  # script + FaultPlan per prompt

ACP agents (`SpawnSpec.drive_protocol == "acp"`, ADR 0011): the per-agent endpoint (same
allocation, same Unix or TLS + token rules) serves ACP instead of the NDJSON attach stream, via
`prospero.testkit.fake_acp_listener.AcpAgentListener`: a scripted `FakeAcpAgent` playing
`acp_script_for(spec)` (default `acp_scripts.default_acp_script()`), or with `acp_command` /
`--acp-command "node path/agent.js"` a bridge to a fresh stdio ACP process per connection.
Status: `running` while the peer lives; `done` / `failed` when it exits 0 / non-zero (script
`exit`, `session/close`, bridged process exit); `kill` -> `killed`.

Without `--socket` the control socket is derived from `--workspace-root` exactly as caliband
does (prospero.core.discovery). Prints `ready <endpoint>` once listening; runs until SIGINT,
SIGTERM or a `shutdown` request.

Modules: this one (listening, the agent registry, spawning, workers, test hooks),
`fake_caliband_control` (the control protocol), `fake_caliband_records` (an agent's entry and
manifest), `fake_caliband_git` (source and worktrees), `fake_caliband_cli` (the command line).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import shutil
import ssl
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from prospero.core.transport import MAX_LINE
from prospero.core.wire.control import AgentRecord, Endpoint, SpawnSpec, TcpEndpoint, UnixEndpoint
from prospero.testkit import scripts
from prospero.testkit.acp_scripts import AcpScript, default_acp_script
from prospero.testkit.certs import server_ssl_context
from prospero.testkit.fake_agent import FakeAgentWorker
from prospero.testkit.fake_caliband_control import ControlProtocol
from prospero.testkit.fake_caliband_git import create_worktree, remove_worktree, resolve_source
from prospero.testkit.fake_caliband_records import ACTIVE, FLIPPABLE, AgentEntry, SpawnFailed
from prospero.testkit.faults import FaultPlan
from prospero.testkit.listener import bound_port, listen_tcp, listen_unix, tcp_addr
from prospero.types.model import AgentStatus

if TYPE_CHECKING:
    from prospero.testkit.fake_acp_listener import AcpAgentListener

log = logging.getLogger(__name__)

ScriptFor = Callable[[SpawnSpec], Sequence[dict[str, Any] | str]]
AcpScriptFor = Callable[[SpawnSpec], AcpScript]
FaultPlanFor = Callable[[SpawnSpec], FaultPlan | None]


class FakeCaliband(ControlProtocol):
    def __init__(
        self,
        *,
        root: str | os.PathLike[str] | None = None,
        script_for: ScriptFor | None = None,
        script: Sequence[dict[str, Any] | str] | None = None,
        line_delay: float = 0.0,
        ring_size: int = 1024,
        data_dir: str | os.PathLike[str] | None = None,
        advertise_host: str | None = None,
        agent_port_base: int | None = None,
        linger: float = 0.1,
        start_paused: bool = False,
        acp_script_for: AcpScriptFor | None = None,
        acp_command: Sequence[str] | None = None,
        acp_load_session: bool = True,
        acp_close_session: bool = True,
        fault_plan_for: FaultPlanFor | None = None,
    ) -> None:
        # Per spawned NDJSON agent: the worker's FaultPlan (prospero.testkit.faults), or None.
        self.fault_plan_for: FaultPlanFor = fault_plan_for or (lambda _s: None)
        self.linger = linger
        # ACP agents: a scripted FakeAcpAgent per agent, or a bridge to a stdio command.
        self.acp_script_for: AcpScriptFor = acp_script_for or (lambda _s: default_acp_script())
        # Bridged processes run in the agent's working dir: pin relative file arguments now.
        self.acp_command: list[str] | None = (
            [os.path.abspath(a) if os.path.exists(a) else a for a in acp_command]
            if acp_command
            else None
        )
        self.acp_load_session = acp_load_session
        # Scripted ACP agents advertise `session/close` (and exit on it); without, a finished
        # session leaves the worker running until kill/rm, as third-party agents do.
        self.acp_close_session = acp_close_session
        # Workers of new agents start with playback paused (tests resume them via `workers`).
        self.start_paused = start_paused
        self.root: Path | None = Path(root) if root is not None else None
        if script_for is None:
            fixed = list(script) if script is not None else None
            script_for = (
                (lambda _spec: fixed)
                if fixed is not None
                else (lambda _s: scripts.default_script())
            )
        self.script_for: ScriptFor = script_for
        self.line_delay = line_delay
        self.ring_size = ring_size
        self._owns_data_dir = data_dir is None
        self.data_dir = (
            Path(data_dir)
            if data_dir is not None
            else Path(tempfile.mkdtemp(prefix="fake-caliband-"))
        )
        self.advertise_host = advertise_host
        self.agent_port_base = agent_port_base
        self._next_port = agent_port_base
        # observations / hooks
        self.workers: dict[str, FakeAgentWorker] = {}  # every worker ever started, by agent id
        self.acp_listeners: dict[str, AcpAgentListener] = {}  # every ACP agent's listener
        self.received_specs: list[SpawnSpec] = []
        self.received_spec_keys: list[list[str]] = []  # every spawn's spec keys, as sent
        self.received_attach_ids: list[str] = []
        self.requests: list[BaseModel] = []  # every well-formed request, in arrival order
        self.bad_requests: list[bytes] = []
        self.list_count = 0
        self.shutdown_count = 0
        self.auth_failures = 0
        self.oversized_requests = 0
        self.connections_total = 0
        # state
        self._agents: dict[str, AgentEntry] = {}
        self._server: asyncio.Server | None = None
        self._unix_path: tuple[str, int] | None = None
        self._ssl: ssl.SSLContext | None = None
        self._token: str | None = None
        self._tcp_host: str | None = None
        self._endpoint: Endpoint | None = None
        self._conns: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self._bg: set[asyncio.Task[Any]] = set()
        self._started = time.monotonic()
        self._last_started_at: dt.datetime | None = None
        self._shutdown = asyncio.Event()
        self._stopped = False

    # --- lifecycle --------------------------------------------------------------------------

    @classmethod
    async def start_unix(
        cls,
        path: str | os.PathLike[str],
        *,
        root: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> FakeCaliband:
        fake = cls(root=root, **kwargs)
        await fake.listen_unix(str(path))
        return fake

    @classmethod
    async def start_tcp(
        cls,
        host: str,
        port: int,
        cert_pem: bytes | None,
        key_pem: bytes | None,
        token: str | None,
        *,
        root: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> FakeCaliband:
        """TCP control listener (port 0 = ephemeral). TLS when cert+key are given; without
        them it serves plaintext, which only a fake allows. Agents get the same TLS + token."""
        fake = cls(root=root, **kwargs)
        await fake.listen_tcp(host, port, cert_pem, key_pem, token)
        return fake

    async def listen_unix(self, path: str) -> None:
        self._server, ino = await listen_unix(self._on_connect, path, limit=MAX_LINE + 1)
        self._unix_path = (path, ino)
        self._endpoint = UnixEndpoint(path=path)
        self._shutdown.clear()  # listening again after a `shutdown` (a restarted daemon)

    async def listen_tcp(
        self, host: str, port: int, cert_pem: bytes | None, key_pem: bytes | None, token: str | None
    ) -> None:
        if (cert_pem is None) != (key_pem is None):
            raise ValueError("TLS cert and key must be given together")
        self._ssl = server_ssl_context(cert_pem, key_pem) if cert_pem and key_pem else None
        self._token = token
        self._tcp_host = host
        self._server = await listen_tcp(self._on_connect, host, port, self._ssl, limit=MAX_LINE + 1)
        bound = bound_port(self._server)
        if self.advertise_host is None:
            self.advertise_host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        self._endpoint = TcpEndpoint(
            addr=tcp_addr(host if host not in ("0.0.0.0", "", "::") else "127.0.0.1", bound)
        )

    @property
    def endpoint(self) -> Endpoint:
        if self._endpoint is None:
            raise RuntimeError("FakeCaliband is not listening")
        return self._endpoint

    @property
    def accepting(self) -> bool:
        return self._server is not None

    async def wait_shutdown(self) -> None:
        """Returns once a `shutdown` request was served (or stop() was called)."""
        await self._shutdown.wait()

    def _stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._unix_path is not None:
            path, ino = self._unix_path
            with contextlib.suppress(OSError):
                if os.stat(path).st_ino == ino:
                    os.unlink(path)
            self._unix_path = None

    async def stop(self) -> None:
        """Stop listening, stop every worker, clean worktrees, drop the data dir we made."""
        if self._stopped:
            return
        self._stopped = True
        self._stop_accepting()
        self._shutdown.set()
        for w in list(self._conns.values()):
            w.transport.abort()
        if self._conns:
            _, pending = await asyncio.wait(list(self._conns), timeout=2.0)
            for t in pending:
                t.cancel()
        await asyncio.gather(*(w.stop() for w in self.workers.values()), return_exceptions=True)
        await asyncio.gather(
            *(lst.stop() for lst in self.acp_listeners.values()), return_exceptions=True
        )
        for a in list(self._agents.values()):
            self._schedule_cleanup(a)
        if self._bg:
            await asyncio.wait(list(self._bg), timeout=10.0)
        if self._owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    async def __aenter__(self) -> FakeCaliband:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- test hooks -------------------------------------------------------------------------

    @property
    def agents(self) -> dict[str, AgentRecord]:
        return {k: a.record for k, a in self._agents.items()}

    def record(self, agent_id: str) -> AgentRecord:
        return self._agents[agent_id].record

    def status_of(self, agent_id: str) -> AgentStatus | None:
        a = self._agents.get(agent_id)
        return a.record.status if a else None

    def set_status(self, agent_id: str, status: AgentStatus | str) -> None:
        self._set_status(self._agents[agent_id], AgentStatus(status))

    def set_interactive(self, agent_id: str, interactive: bool) -> None:
        a = self._agents[agent_id]
        a.record.spec.interactive = interactive
        if a.worker is not None:
            a.worker.interactive = interactive
        a.write_manifest()

    def remove_agent(self, agent_id: str) -> AgentRecord | None:
        """Drop a record silently (its worker keeps running), e.g. to trigger `agent_gone`."""
        a = self._agents.pop(agent_id, None)
        return a.record if a else None

    async def add_agent(
        self,
        *,
        id: str | None = None,
        name: str | None = None,
        status: AgentStatus | str = AgentStatus.running,
        spec: SpawnSpec | None = None,
        script: Sequence[dict[str, Any] | str] | None = None,
        started_at: str | None = None,
        working_dir: str = "",
        endpoint: Endpoint | None = None,
        serve: bool = True,
        start: bool = True,
        interactive: bool | None = None,
        line_delay: float | None = None,
        ring_size: int | None = None,
        acp_script: AcpScript | None = None,
    ) -> AgentRecord:
        """Register a pre-existing agent (as if spawned earlier by someone else).

        With `serve` a FakeAgentWorker plays `script` (default: the §10 default script) on a
        fresh per-agent endpoint; without it the record points at `endpoint` (or a dead path).
        A `spec` with `drive_protocol="acp"` gets an ACP listener instead (`acp_script`, else
        `acp_script_for(spec)`, or the `acp_command` bridge).
        """
        agent_id = id or self._new_id()
        spec = spec or SpawnSpec(initial_prompt="pre-existing agent")
        if interactive is not None:
            spec.interactive = interactive
        session_dir = self._make_session_dir(agent_id)
        if endpoint is None and not serve:
            endpoint = UnixEndpoint(path=str(self.data_dir / f"dead-{agent_id}.sock"))
        record = AgentRecord(
            id=agent_id,
            name=name or spec.label or f"agent-{agent_id}",
            status=AgentStatus(status),
            started_at=started_at or self._now(),
            session_dir=str(session_dir),
            endpoint=endpoint or UnixEndpoint(path=""),
            working_dir=working_dir,
            spec=spec,
        )
        agent = AgentEntry(record=record)
        self._agents[agent_id] = agent
        if serve and spec.drive_protocol == "acp":
            listener = self._make_acp_listener(agent, acp_script)
            record.endpoint = await self._serve_worker(listener)
        elif serve:
            worker = self._make_worker(
                agent,
                list(script) if script is not None else scripts.default_script(),
                line_delay=line_delay,
                ring_size=ring_size,
            )
            record.endpoint = await self._serve_worker(worker)
            if self.start_paused:
                worker.pause()
            if start:
                worker.start()
        agent.write_manifest()
        return record

    # --- spawn ------------------------------------------------------------------------------

    async def _spawn(self, spec: SpawnSpec, replacing: str | None = None) -> AgentRecord:
        source = resolve_source(self.root, spec)
        worktree: Path | None = None
        branch: str | None = None
        if spec.isolation_worktree:
            worktree, branch = await create_worktree(source)
        working_dir = worktree or source
        agent_id = self._new_id()
        session_dir = self._make_session_dir(agent_id)
        record = AgentRecord(
            id=agent_id,
            name=spec.label or f"agent-{agent_id}",
            status=AgentStatus.spawning,
            started_at=self._now(),
            session_dir=str(session_dir),
            endpoint=UnixEndpoint(path=""),
            working_dir=str(working_dir) if working_dir is not None else "",
            spec=spec,
        )
        agent = AgentEntry(
            record=record, worktree=worktree, branch=branch, git_dir=source if worktree else None
        )
        worker: FakeAgentWorker | AcpAgentListener | None
        if spec.drive_protocol == "acp":
            worker = self._make_acp_listener(agent)
        else:
            worker = self._make_worker(agent, list(self.script_for(spec)))
        assert worker is not None
        try:
            record.endpoint = await self._serve_worker(worker)
        except SpawnFailed:
            self.workers.pop(agent_id, None)
            self.acp_listeners.pop(agent_id, None)
            self._schedule_cleanup(agent)
            shutil.rmtree(session_dir, ignore_errors=True)
            raise
        except OSError as e:
            log.warning("fake caliband: launching agent %s failed: %s", agent_id, e)
            record.status = AgentStatus.failed
            record.endpoint = self._placeholder_endpoint(agent_id)
            self.workers.pop(agent_id, None)
            self.acp_listeners.pop(agent_id, None)
            worker = None
            agent.worker = None
            agent.acp = None
            self._schedule_cleanup(agent)
        if replacing is not None:
            self._agents.pop(replacing, None)
        self._agents[agent_id] = agent
        if worker is not None:
            self._set_status(agent, AgentStatus.running)
            if isinstance(worker, FakeAgentWorker):
                if self.start_paused:
                    worker.pause()
                worker.start()
        agent.write_manifest()
        return record

    def _schedule_cleanup(self, agent: AgentEntry) -> None:
        if agent.cleaned or agent.worktree is None:
            return
        agent.cleaned = True
        t = asyncio.get_running_loop().create_task(remove_worktree(agent))
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)

    # --- workers ----------------------------------------------------------------------------

    def _make_worker(
        self,
        agent: AgentEntry,
        script: list[dict[str, Any] | str],
        *,
        line_delay: float | None = None,
        ring_size: int | None = None,
    ) -> FakeAgentWorker:
        rec = agent.record
        worker = FakeAgentWorker(
            rec.id,
            script,
            interactive=rec.spec.interactive,
            ring_size=ring_size if ring_size is not None else self.ring_size,
            line_delay=line_delay if line_delay is not None else self.line_delay,
            on_status=lambda s: self._on_worker_status(agent, s),
            on_exit=lambda code: self._on_worker_exit(agent, code),
            transcript_path=Path(rec.session_dir) / "stdout.ndjson" if rec.session_dir else None,
            linger=self.linger,
            fault_plan=self.fault_plan_for(rec.spec),
        )
        agent.worker = worker
        self.workers[rec.id] = worker
        return worker

    def _make_acp_listener(
        self, agent: AgentEntry, script: AcpScript | None = None
    ) -> AcpAgentListener:
        """An ACP agent's listener: scripted peer, or the `acp_command` bridge."""
        from prospero.testkit.fake_acp import FakeAcpAgent
        from prospero.testkit.fake_acp_listener import AcpAgentListener

        rec = agent.record
        on_exit = lambda code: self._on_worker_exit(agent, code)  # noqa: E731
        cwd = rec.working_dir or None
        listener: AcpAgentListener
        if self.acp_command is not None:
            listener = AcpAgentListener(
                rec.id, command=self.acp_command, on_exit=on_exit, cwd=cwd, linger=self.linger
            )
        else:
            acp_script = script if script is not None else self.acp_script_for(rec.spec)
            model = rec.spec.model
            load, close = self.acp_load_session, self.acp_close_session
            listener = AcpAgentListener(
                rec.id,
                agent_factory=lambda: FakeAcpAgent(
                    acp_script, load_session=load, close_session=close, model=model
                ),
                on_exit=on_exit,
                linger=self.linger,
            )
        agent.acp = listener
        self.acp_listeners[rec.id] = listener
        return listener

    async def _serve_worker(self, worker: FakeAgentWorker | AcpAgentListener) -> Endpoint:
        if self._tcp_host is None:
            assert self._unix_path is not None or self._endpoint is not None
            ctl = (
                self._endpoint.path
                if isinstance(self._endpoint, UnixEndpoint)
                else str(self.data_dir / "ctl.sock")
            )
            path = str(Path(ctl).parent / "agents" / f"{uuid.uuid4().hex[:8]}-agent.sock")
            return await worker.serve_unix(path)
        port = 0
        if self._next_port is not None:
            if self._next_port > 65535:
                raise SpawnFailed("agent port range exhausted")
            port = self._next_port
            self._next_port += 1
        ep = await worker.serve_tcp(self._tcp_host, port, self._ssl, self._token)
        _, bound = ep.host_port()
        return TcpEndpoint(addr=tcp_addr(self.advertise_host or self._tcp_host, bound))

    def _placeholder_endpoint(self, agent_id: str) -> Endpoint:
        if self._tcp_host is None:
            return UnixEndpoint(path=str(self.data_dir / f"dead-{agent_id}.sock"))
        return TcpEndpoint(addr=tcp_addr(self.advertise_host or self._tcp_host, 1))

    def _on_worker_status(self, agent: AgentEntry, status: str) -> None:
        if self._agents.get(agent.record.id) is not agent:
            return
        new = AgentStatus(status)
        if agent.record.status in FLIPPABLE and new in FLIPPABLE:
            self._set_status(agent, new)

    def _on_worker_exit(self, agent: AgentEntry, code: int) -> None:
        if self._agents.get(agent.record.id) is agent and agent.record.status in ACTIVE:
            self._set_status(agent, AgentStatus.done if code == 0 else AgentStatus.failed)
        self._schedule_cleanup(agent)

    # --- records ----------------------------------------------------------------------------

    def _set_status(self, agent: AgentEntry, status: AgentStatus) -> None:
        if agent.record.status != status:
            agent.record.status = status
            agent.write_manifest()

    def _new_id(self) -> str:
        while True:
            agent_id = uuid.uuid4().hex[:12]
            if agent_id not in self._agents and agent_id not in self.workers:
                return agent_id

    def _make_session_dir(self, agent_id: str) -> Path:
        d = self.data_dir / "agents" / agent_id
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _now(self) -> str:
        """RFC 3339 UTC, strictly increasing so `list` order is deterministic."""
        now = dt.datetime.now(dt.UTC)
        if self._last_started_at is not None and now <= self._last_started_at:
            now = self._last_started_at + dt.timedelta(microseconds=1)
        self._last_started_at = now
        return now.isoformat()


if __name__ == "__main__":
    from prospero.testkit.fake_caliband_cli import main

    sys.exit(main())
