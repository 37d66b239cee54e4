"""Control-plane client: one request per connection, one reply line (caliband-wire.md §1.4)."""

from __future__ import annotations

import builtins
from typing import TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from prospero.core.aio import wait_for
from prospero.core.errors import (
    AgentNotFound,
    CalibandUnreachable,
    InvalidState,
    ProtocolError,
    TransportError,
)
from prospero.core.transport import (
    NetworkSecurity,
    OversizedLine,
    close_writer,
    describe,
    open_endpoint,
    read_line,
)
from prospero.core.wire.control import (
    CTL_REPLY_ADAPTER,
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
    RespawnedReply,
    RespawnReq,
    RmReq,
    ShutdownAckReply,
    ShutdownReq,
    SpawnedReply,
    SpawnReq,
    SpawnSpec,
    StatusReply,
    StatusReq,
    encode_request,
)

R = TypeVar("R", bound=BaseModel)


class CalibandClient:
    """Talks to one caliband control endpoint. Stateless: every call dials afresh."""

    def __init__(
        self,
        endpoint: Endpoint,
        security: NetworkSecurity | None = None,
        *,
        timeout: float = 10.0,
    ) -> None:
        self.endpoint = endpoint
        self.security = security
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"CalibandClient({describe(self.endpoint)})"

    async def _call(self, req: BaseModel, expect: type[R]) -> R:
        return self._decode(await self._exchange(req), expect)

    async def _exchange(self, req: BaseModel) -> bytes:
        """Dial, send `req`, return the reply line as received."""
        try:
            reader, writer = await open_endpoint(self.endpoint, self.security)
        except TransportError as e:
            raise CalibandUnreachable(f"caliband unreachable at {describe(self.endpoint)}: {e}") from e
        try:
            writer.write(encode_request(req))
            await writer.drain()
            line = await wait_for(read_line(reader), self.timeout)
        except TimeoutError as e:
            raise CalibandUnreachable(
                f"caliband at {describe(self.endpoint)} did not answer within {self.timeout:g}s"
            ) from e
        except OversizedLine as e:
            raise ProtocolError(f"caliband reply too long ({e.size} bytes)") from e
        except OSError as e:
            raise CalibandUnreachable(f"caliband connection failed: {e}") from e
        finally:
            await close_writer(writer)
        if line is None:
            raise CalibandUnreachable(
                f"caliband at {describe(self.endpoint)} closed the connection before replying "
                "(wrong token or TLS trust?)"
            )
        return line

    def _decode(self, line: bytes, expect: type[R]) -> R:
        try:
            reply = CTL_REPLY_ADAPTER.validate_python(orjson.loads(line))
        except (orjson.JSONDecodeError, ValidationError) as e:
            raise ProtocolError(f"bad caliband reply: {line[:200]!r}") from e
        if isinstance(reply, ErrorReply):
            err = reply.error
            if isinstance(err, NotFoundErr):
                raise AgentNotFound(err.id)
            if isinstance(err, InvalidStateErr):
                raise InvalidState(err.op, err.id, err.status)
            assert isinstance(err, InternalErr)
            raise ProtocolError(f"caliband internal error: {err.message}")
        if not isinstance(reply, expect):
            raise ProtocolError(f"caliband answered {reply.kind!r} where {expect.__name__} was due")
        return reply

    async def list(self) -> list[AgentRecord]:
        return (await self._call(ListReq(), ListedReply)).agents

    async def list_unless(
        self, previous: bytes | None
    ) -> tuple[bytes, builtins.list[AgentRecord] | None]:
        """The `list` reply line and its agents; None instead of the agents when the line is
        byte-identical to `previous` (nothing changed: no decoding)."""
        line = await self._exchange(ListReq())
        if previous is not None and line == previous:
            return line, None
        return line, self._decode(line, ListedReply).agents

    async def spawn(self, spec: SpawnSpec) -> SpawnedReply:
        return await self._call(SpawnReq(spec=spec), SpawnedReply)

    async def attach(self, agent_id: str) -> Endpoint:
        return (await self._call(AttachReq(id=agent_id), AttachAckReply)).endpoint

    async def kill(self, agent_id: str) -> None:
        await self._call(KillReq(id=agent_id), KilledReply)

    async def respawn(self, agent_id: str) -> str:
        return (await self._call(RespawnReq(id=agent_id), RespawnedReply)).id

    async def rm(self, agent_id: str, force: bool = False) -> None:
        await self._call(RmReq(id=agent_id, force=force), RemovedReply)

    async def status(self) -> StatusReply:
        return await self._call(StatusReq(), StatusReply)

    async def shutdown(self) -> None:
        await self._call(ShutdownReq(), ShutdownAckReply)
