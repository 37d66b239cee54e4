"""The control protocol of the fake caliband (caliband-wire.md §1-§2): a connection's NDJSON
request lines (after the bearer preamble on TCP) validated as caliband's serde does (unknown
spec keys dropped), dispatched to the fake's registry, answered as caliband's serializer
writes replies (listed specs always carry `source`). `ControlProtocol` is FakeCaliband's
base class; it names the state of the fake it uses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import ssl
import time
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from prospero.core.aio import wait_for
from prospero.core.transport import MAX_LINE
from prospero.core.wire.control import (
    CALIBAND_SPEC_FIELDS,
    CTL_REQUEST_ADAPTER,
    AgentRecord,
    AttachAckReply,
    AttachReq,
    Endpoint,
    ErrorReply,
    InternalErr,
    InvalidStateErr,
    KilledReply,
    KillReq,
    ListedReply,
    ListReq,
    NotFoundErr,
    RemovedReply,
    ReportStatusReq,
    RespawnedReply,
    RespawnReq,
    RmReq,
    ShutdownAckReply,
    ShutdownReq,
    SpawnedReply,
    SpawnReq,
    SpawnSpec,
    StatusReply,
    StatusReportedReply,
    StatusReq,
    encode_reply,
)
from prospero.testkit.fake_caliband_records import FLIPPABLE, AgentEntry, SpawnFailed
from prospero.testkit.listener import admit
from prospero.types.model import AgentStatus

log = logging.getLogger(__name__)

REQUEST_KINDS = (
    "list",
    "spawn",
    "attach",
    "kill",
    "respawn",
    "rm",
    "status",
    "shutdown",
    "report_status",
)


class ControlProtocol:
    """Serves control connections for FakeCaliband (which provides the state below)."""

    _agents: dict[str, AgentEntry]
    _conns: dict[asyncio.Task[Any], asyncio.StreamWriter]
    _token: str | None
    _shutdown: asyncio.Event
    _started: float
    requests: list[BaseModel]
    bad_requests: list[bytes]
    received_specs: list[SpawnSpec]
    received_spec_keys: list[list[str]]
    received_attach_ids: list[str]
    list_count: int
    shutdown_count: int
    auth_failures: int
    oversized_requests: int
    connections_total: int

    @property
    def endpoint(self) -> Endpoint:
        raise NotImplementedError

    def _stop_accepting(self) -> None:
        raise NotImplementedError

    def _set_status(self, agent: AgentEntry, status: AgentStatus) -> None:
        raise NotImplementedError

    async def _spawn(self, spec: SpawnSpec, replacing: str | None = None) -> AgentRecord:
        raise NotImplementedError

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns[task] = writer
        self.connections_total += 1
        shutdown = False
        try:
            if not await admit(reader, writer, self._token):  # shared with every fake
                self.auth_failures += 1
                log.info("fake caliband: dropped a connection (bad bearer preamble)")
                return
            while True:
                last = False
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError as e:
                    line, last = e.partial, True
                except asyncio.LimitOverrunError:
                    self.oversized_requests += 1
                    log.warning("fake caliband: request line over %d bytes, closing", MAX_LINE)
                    break
                if line.strip():
                    reply, shutdown = await self._handle_line(line.strip())
                    writer.write(encode_ctl_reply(reply))
                    await writer.drain()
                if last or shutdown:
                    break
        except (OSError, ssl.SSLError):
            pass
        except Exception:
            log.exception("fake caliband: connection handler failed")
        except asyncio.CancelledError:
            # Outermost frame of a server-owned task: end quietly (a re-raised cancel makes
            # Python 3.11's stream callback log a spurious traceback at loop teardown).
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
                await wait_for(writer.wait_closed(), 1.0)
            self._conns.pop(task, None)
            if shutdown:
                self._stop_accepting()
                self._shutdown.set()

    async def _handle_line(self, line: bytes) -> tuple[BaseModel, bool]:
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            return self._bad(line, str(e)), False
        if not isinstance(obj, dict):
            return self._bad(
                line,
                f"invalid type: {type(obj).__name__}, expected internally tagged enum CtlRequest",
            ), False
        if "kind" not in obj:
            return self._bad(line, "missing field `kind`"), False
        kind = obj["kind"]
        if kind not in REQUEST_KINDS:
            expected = ", ".join(f"`{k}`" for k in REQUEST_KINDS)
            return self._bad(line, f"unknown variant `{kind}`, expected one of {expected}"), False
        if kind == "spawn" and isinstance(obj.get("spec"), dict):
            # Like caliband's serde: spec keys it does not know are dropped, never stored, so
            # `listed` echoes only caliband's own fields (a Prospero-only key such as
            # `permission_posture` does not come back).
            self.received_spec_keys.append(sorted(obj["spec"]))
            spec = {k: v for k, v in obj["spec"].items() if k in CALIBAND_SPEC_FIELDS}
            obj = {**obj, "spec": spec}
        try:
            req = CTL_REQUEST_ADAPTER.validate_python(obj)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ()))
            return self._bad(line, f"{err.get('msg', 'invalid')} at `{where}`"), False
        self.requests.append(req)
        try:
            return await self._dispatch(req), isinstance(req, ShutdownReq)
        except Exception as e:  # never let a handler bug kill the connection
            log.exception("fake caliband: %s failed", kind)
            return ErrorReply(error=InternalErr(message=f"{kind}: {e}")), False

    def _bad(self, line: bytes, why: str) -> ErrorReply:
        self.bad_requests.append(line)
        log.info("fake caliband: bad request: %s", why)
        return ErrorReply(error=InternalErr(message=f"bad request: {why}"))

    async def _dispatch(self, req: BaseModel) -> BaseModel:
        if isinstance(req, ListReq):
            self.list_count += 1
            records = sorted((a.record for a in self._agents.values()), key=lambda r: r.started_at)
            # No copies: the reply is encoded (encode_ctl_reply) before the next await, so
            # nothing can change a record under it (a deep copy per record per poll was a
            # tenth of the randomised fault suite's CPU).
            return ListedReply(agents=records)
        if isinstance(req, SpawnReq):
            self.received_specs.append(req.spec)
            try:
                rec = await self._spawn(req.spec)
            except SpawnFailed as e:
                return ErrorReply(error=InternalErr(message=str(e)))
            return SpawnedReply(id=rec.id, endpoint=rec.endpoint)
        if isinstance(req, AttachReq):
            self.received_attach_ids.append(req.id)
            a = self._agents.get(req.id)
            if a is None:
                return ErrorReply(error=NotFoundErr(id=req.id))
            return AttachAckReply(endpoint=a.record.endpoint)
        if isinstance(req, KillReq):
            a = self._agents.get(req.id)
            if a is None:
                return ErrorReply(error=NotFoundErr(id=req.id))
            self._set_status(a, AgentStatus.killed)
            if a.worker is not None:
                await a.worker.stop()
            if a.acp is not None:
                await a.acp.stop()
            return KilledReply()
        if isinstance(req, RespawnReq):
            old = self._agents.get(req.id)
            if old is None:
                return ErrorReply(error=NotFoundErr(id=req.id))
            try:
                rec = await self._spawn(old.record.spec.model_copy(deep=True), replacing=req.id)
            except SpawnFailed as e:
                return ErrorReply(error=InternalErr(message=str(e)))
            return RespawnedReply(id=rec.id)
        if isinstance(req, RmReq):
            a = self._agents.get(req.id)
            if a is None:
                return ErrorReply(error=NotFoundErr(id=req.id))
            if a.record.status not in (
                AgentStatus.killed,
                AgentStatus.done,
                AgentStatus.failed,
                AgentStatus.crashed,
            ):
                if not req.force:
                    return ErrorReply(
                        error=InvalidStateErr(op="rm", id=req.id, status=a.record.status.value)
                    )
                if a.worker is not None:
                    await a.worker.stop()
                if a.acp is not None:
                    await a.acp.stop()
            self._agents.pop(req.id, None)
            shutil.rmtree(a.record.session_dir, ignore_errors=True)
            return RemovedReply()
        if isinstance(req, StatusReq):
            return StatusReply(
                pid=os.getpid(),
                agents=len(self._agents),
                uptime_secs=int(time.monotonic() - self._started),
                endpoint=self.endpoint,
            )
        if isinstance(req, ShutdownReq):
            self.shutdown_count += 1
            return ShutdownAckReply()
        if isinstance(req, ReportStatusReq):
            a = self._agents.get(req.id)
            if a is not None and a.record.status in FLIPPABLE and req.status in FLIPPABLE:
                self._set_status(a, req.status)
            return StatusReportedReply()
        raise AssertionError(f"unhandled request {req!r}")


def encode_ctl_reply(reply: BaseModel) -> bytes:
    """Like caliband's serializer: listed specs always carry `source` (null when unset)."""
    if isinstance(reply, ListedReply):
        agents = []
        for a in reply.agents:
            spec = a.spec.to_wire()
            spec.setdefault("source", None)
            agents.append({**a.model_dump(mode="json", exclude={"spec"}), "spec": spec})
        return orjson.dumps({"kind": "listed", "agents": agents}) + b"\n"
    return encode_reply(reply)
