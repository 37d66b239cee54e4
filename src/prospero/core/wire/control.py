"""Mirror of caliband's control plane (caliband-wire.md §2-§4).

Every model tolerates unknown keys (forward compatible) and serialises the fields caliband's
own serializer emits. `SpawnSpec` additionally carries `drive_protocol` (caliban >= 0.14 reads
it to pick the ACP worker, ADR 0011; older daemons ignore unknown keys). Nothing else of
Prospero's travels in the spec: caliband drops unknown spec fields, so what Prospero needs to
remember about an agent (posture, requested protocol, spawned here) lives in its own store
(AgentMeta), never in caliband's echo.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from prospero.types.model import AgentStatus, DriveProtocol


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


# --- shared types ---------------------------------------------------------------------------


class UnixEndpoint(_Wire):
    scheme: Literal["unix"] = "unix"
    path: str


class TcpEndpoint(_Wire):
    scheme: Literal["tcp"] = "tcp"
    addr: str  # bare host:port

    def host_port(self) -> tuple[str, int]:
        host, _, port = self.addr.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bad tcp endpoint address {self.addr!r}")
        return host.strip("[]"), int(port)


Endpoint = Annotated[UnixEndpoint | TcpEndpoint, Field(discriminator="scheme")]
ENDPOINT_ADAPTER: TypeAdapter[Endpoint] = TypeAdapter(Endpoint)


# The nine SpawnSpec keys of the golden serialised form (§3.2), always on the wire.
_GOLDEN_SPEC_FIELDS = frozenset(
    {
        "label",
        "frontmatter_path",
        "initial_prompt",
        "model",
        "provider",
        "tool_allowlist",
        "isolation_worktree",
        "inherit_hooks",
        "interactive",
    }
)


class SpawnSpec(_Wire):
    """caliband SpawnSpec. Field order matches the golden serialised form (§3.2)."""

    label: str | None = None
    frontmatter_path: str | None = None
    initial_prompt: str
    model: str | None = None
    provider: str | None = None
    tool_allowlist: list[str] | None = None
    isolation_worktree: bool = False
    inherit_hooks: bool = True
    interactive: bool = False
    # caliban-only keys; `source` is echoed back in `listed`, hooks config only when set.
    inherited_hooks_config: str | None = None
    source: str | None = None
    # caliban >= 0.14 (ADR 0011): omitted on the wire when it is the default so the golden
    # nine-field form stays byte-identical for plain NDJSON spawns.
    drive_protocol: DriveProtocol = "ndjson"

    def to_wire(self) -> dict[str, Any]:
        out = self.model_dump(include=set(_GOLDEN_SPEC_FIELDS))
        if self.inherited_hooks_config is not None:
            out["inherited_hooks_config"] = self.inherited_hooks_config
        if self.source is not None:
            out["source"] = self.source
        if self.drive_protocol != "ndjson":
            out["drive_protocol"] = self.drive_protocol
        return out


# The SpawnSpec keys caliband itself knows (§3.1, plus `drive_protocol` from 0.14 on): the
# only keys it keeps from a spawn request and echoes back in `listed`.
CALIBAND_SPEC_FIELDS = _GOLDEN_SPEC_FIELDS | {"inherited_hooks_config", "source", "drive_protocol"}
# The AgentRecord keys of a `listed` reply (§2.1).
AGENT_RECORD_FIELDS = frozenset(
    {"id", "name", "status", "started_at", "session_dir", "endpoint", "working_dir", "spec"}
)


class AgentRecord(_Wire):
    id: str
    name: str
    status: AgentStatus
    started_at: str
    session_dir: str = ""
    endpoint: Endpoint
    working_dir: str = ""
    spec: SpawnSpec


class DaemonStatus(_Wire):
    pid: int
    agents: int
    uptime_secs: int
    endpoint: Endpoint


# --- requests -------------------------------------------------------------------------------


class ListReq(_Wire):
    kind: Literal["list"] = "list"


class SpawnReq(_Wire):
    kind: Literal["spawn"] = "spawn"
    spec: SpawnSpec


class AttachReq(_Wire):
    kind: Literal["attach"] = "attach"
    id: str


class KillReq(_Wire):
    kind: Literal["kill"] = "kill"
    id: str


class RespawnReq(_Wire):
    kind: Literal["respawn"] = "respawn"
    id: str


class RmReq(_Wire):
    kind: Literal["rm"] = "rm"
    id: str
    force: bool = False


class StatusReq(_Wire):
    kind: Literal["status"] = "status"


class ShutdownReq(_Wire):
    kind: Literal["shutdown"] = "shutdown"


class ReportStatusReq(_Wire):
    kind: Literal["report_status"] = "report_status"
    id: str
    status: AgentStatus


CtlRequest = Annotated[
    ListReq
    | SpawnReq
    | AttachReq
    | KillReq
    | RespawnReq
    | RmReq
    | StatusReq
    | ShutdownReq
    | ReportStatusReq,
    Field(discriminator="kind"),
]
CTL_REQUEST_ADAPTER: TypeAdapter[CtlRequest] = TypeAdapter(CtlRequest)


def request_to_wire(req: BaseModel) -> dict[str, Any]:
    if isinstance(req, SpawnReq):
        return {"kind": "spawn", "spec": req.spec.to_wire()}
    return req.model_dump(mode="json")


def encode_request(req: BaseModel) -> bytes:
    return orjson.dumps(request_to_wire(req)) + b"\n"


# --- errors ---------------------------------------------------------------------------------


class NotFoundErr(_Wire):
    kind: Literal["not_found"] = "not_found"
    id: str = ""


class InvalidStateErr(_Wire):
    kind: Literal["invalid_state"] = "invalid_state"
    op: str = ""
    id: str = ""
    status: str = ""


class InternalErr(_Wire):
    kind: Literal["internal"] = "internal"
    message: str = ""


SupervisorError = Annotated[
    NotFoundErr | InvalidStateErr | InternalErr, Field(discriminator="kind")
]


# --- replies --------------------------------------------------------------------------------


class ListedReply(_Wire):
    kind: Literal["listed"] = "listed"
    agents: list[AgentRecord] = Field(default_factory=list)


class SpawnedReply(_Wire):
    kind: Literal["spawned"] = "spawned"
    id: str
    endpoint: Endpoint


class AttachAckReply(_Wire):
    kind: Literal["attach_ack"] = "attach_ack"
    endpoint: Endpoint


class KilledReply(_Wire):
    kind: Literal["killed"] = "killed"


class RespawnedReply(_Wire):
    kind: Literal["respawned"] = "respawned"
    id: str


class RemovedReply(_Wire):
    kind: Literal["removed"] = "removed"


class StatusReply(_Wire):
    kind: Literal["status"] = "status"
    pid: int
    agents: int
    uptime_secs: int
    endpoint: Endpoint


class ShutdownAckReply(_Wire):
    kind: Literal["shutdown_ack"] = "shutdown_ack"


class StatusReportedReply(_Wire):
    kind: Literal["status_reported"] = "status_reported"


class ErrorReply(_Wire):
    kind: Literal["error"] = "error"
    error: SupervisorError


CtlReply = Annotated[
    ListedReply
    | SpawnedReply
    | AttachAckReply
    | KilledReply
    | RespawnedReply
    | RemovedReply
    | StatusReply
    | ShutdownAckReply
    | StatusReportedReply
    | ErrorReply,
    Field(discriminator="kind"),
]
CTL_REPLY_ADAPTER: TypeAdapter[CtlReply] = TypeAdapter(CtlReply)


def encode_reply(reply: BaseModel) -> bytes:
    if isinstance(reply, ListedReply):
        data: dict[str, Any] = {
            "kind": "listed",
            "agents": [
                {**a.model_dump(mode="json", exclude={"spec"}), "spec": a.spec.to_wire()}
                for a in reply.agents
            ],
        }
        return orjson.dumps(data) + b"\n"
    return orjson.dumps(reply.model_dump(mode="json")) + b"\n"


# --- per-agent inbound ----------------------------------------------------------------------


class UserMessage(_Wire):
    type: Literal["UserMessage"] = "UserMessage"
    text: str


class EndInput(_Wire):
    type: Literal["EndInput"] = "EndInput"


AttachInbound = Annotated[UserMessage | EndInput, Field(discriminator="type")]
ATTACH_INBOUND_ADAPTER: TypeAdapter[AttachInbound] = TypeAdapter(AttachInbound)


class BearerPreamble(_Wire):
    bearer: str
