"""The ACP session of one connection: handshake (`initialize`, `session/new` or
`session/load`, `authenticate` when required) and the prompt turns, as a mixin of `AcpDriver`
(driver.py holds the lifecycle, the end of the history and persistence).

Turns: the spawn prompt first (only to an agent spawned here, only while the stored state says
it was never sent), then queued `send_input` texts. A turn's begin is committed (state mark,
drained, `commit()`) before its `session/prompt` is written, so a crash can lose a turn but
never drive it twice. A connection lost mid-turn records `turn_lost` (open calls closed
first) — at once when the driver has no agent status to consult (standalone), else when the
cause is known: the next session (rejoined, or found not resumable) or the end of the run
records it; a worker caliband reports killed or crashed concludes the run with that outcome
instead (`agent_finished{killed}`, never "connection lost").

Authentication (acp.md §1): `-32000` on `session/new` / `session/load` → one `authenticate`
with a method the workspace has credentials for (`auth.pick_method`), then one retry; else
the agent finishes at once with `agent_finished{outcome: "auth_required"}`. A prompt refused
with `-32000` ends its turn `error`; then the same: authenticate once and send the text again
as the next turn, else finish `auth_required`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Coroutine
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _pkg_version
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import acp
from acp import schema as s
from pydantic import ValidationError

from prospero import DISTRIBUTION
from prospero.core.aio import wait_for
from prospero.core.drivers.acp import auth
from prospero.core.drivers.acp.mapping import AcpMapper, outcome_for, usage_from
from prospero.core.drivers.acp.output import OutputPump, OutputQueue
from prospero.core.drivers.base import DriverTarget
from prospero.core.metrics import Metrics
from prospero.types.model import AgentStatus

log = logging.getLogger(__name__)

T = TypeVar("T")

ACP_PROMPT_ERRORS = "acp_prompt_errors"
NOT_RESUMED = "history stays readable, session not resumed"
NOT_RESUMABLE_DETAIL = f"agent does not support session/load; {NOT_RESUMED}"
PROTOCOL_VERSION = 1
CLIENT_NAME = "prospero"


def _client_version() -> str:
    try:
        return _pkg_version(DISTRIBUTION)
    except PackageNotFoundError:
        return "0"


CLIENT_VERSION = _client_version()

# The names (never the values) of the environment variables the agent's environment holds: the
# workspace's provider configuration (sync or async).
Credentials = Callable[[DriverTarget], Collection[str] | Awaitable[Collection[str]]]
AuthResult = Literal["ok", "no_method", "refused", "failed"]


def receive_task(conn: acp.ClientSideConnection) -> asyncio.Task[Any] | None:
    inner = getattr(conn, "_conn", None)
    task = getattr(inner, "_recv_task", None)
    return task if isinstance(task, asyncio.Task) else None


class End:
    """end_input marker in the input queue."""


END = End()


class SessionOver(Exception):
    """The session cannot go on (finished, not resumable, auth required)."""


class AcpSession:
    """Handshake and turns of `AcpDriver` (see the module docstring)."""

    if TYPE_CHECKING:
        target: DriverTarget
        metrics: Metrics
        mapper: AcpMapper
        queue: OutputQueue
        pump: OutputPump
        credentials: Credentials | None
        auth_method: str | None
        handshake_timeout: float
        close_timeout: float
        resumed: int
        _closing: bool
        _close_event: asyncio.Event
        _retry_now: asyncio.Event
        _last_error: str | None
        _conclude_request: tuple[str, str] | None
        _pending_loss: str | None
        _auth_refused_prompt: str | None
        _auth_prompt_tried: bool
        _session_id: str | None
        _turns: int
        _initial_sent: bool
        _spawned_here: bool
        _prompt_queued: bool
        _caps: s.AgentCapabilities | None
        _auth_methods: list[Any]
        _reader: asyncio.StreamReader | None
        _turn_cancel: asyncio.Event
        _inputs: deque[str | End]
        _input_event: asyncio.Event

        def agent_status(self) -> AgentStatus | None: ...
        def _cwd(self) -> str: ...
        async def _drain(self) -> None: ...
        async def _send_cancel(
            self, conn: acp.ClientSideConnection, sid: str, limit: float
        ) -> None: ...
        async def _finish(self, outcome: str, detail: str | None) -> None: ...
        async def _finish_not_resumable(self, detail: str) -> None: ...

    async def _bounded(self, coro: Coroutine[Any, Any, T], what: str, limit: float) -> T | None:
        """Await an SDK request; None (logged, `_last_error` set) on failure."""
        try:
            return await wait_for(coro, limit)
        except TimeoutError:
            self._last_error = f"{what}: no answer within {limit:g}s"
        except ConnectionError as e:
            hint = " (wrong token?)" if what == "initialize" else ""
            self._last_error = f"{what}: the connection closed{hint}: {e}"
        except OSError as e:
            self._last_error = f"{what}: {e}"
        except acp.RequestError as e:
            self._last_error = f"{what} refused: {e} (code {e.code})"
        except ValidationError as e:
            self._last_error = f"{what}: malformed answer: {e.error_count()} validation errors"
        if not self._closing:
            log.warning("agent %s: ACP %s", self.target.agent_id, self._last_error)
        return None

    async def _open_session(self, conn: acp.ClientSideConnection) -> bool:
        """initialize, then session/new or session/load (authenticating once if required).
        False: a failed connection. Raises SessionOver when the agent finished meanwhile."""
        agent = self.target.agent_id
        init = await self._bounded(
            conn.initialize(
                protocol_version=PROTOCOL_VERSION,
                client_capabilities=s.ClientCapabilities(
                    fs=s.FileSystemCapabilities(read_text_file=False, write_text_file=False),
                    terminal=False,
                ),
                client_info=s.Implementation(
                    name=CLIENT_NAME, title="Prospero", version=CLIENT_VERSION
                ),
            ),
            "initialize",
            self.handshake_timeout,
        )
        if init is None:
            return False
        if init.protocol_version != PROTOCOL_VERSION:
            self._last_error = (
                f"the agent speaks ACP protocol version {init.protocol_version}, "
                f"Prospero speaks {PROTOCOL_VERSION}"
            )
            log.warning("agent %s: %s", agent, self._last_error)
            return False
        self._caps = init.agent_capabilities or s.AgentCapabilities()
        self._auth_methods = list(init.auth_methods or [])
        if self._session_id is not None and not self._caps.load_session:
            log.warning("agent %s: %s", agent, NOT_RESUMABLE_DETAIL)
            await self._finish_not_resumable(NOT_RESUMABLE_DETAIL)
            raise SessionOver()
        authenticated = False
        while True:
            try:
                if self._session_id is None:
                    await self._new_session(conn)
                else:
                    await self._load_session(conn)
                return True
            except acp.RequestError as e:
                if e.code != auth.AUTH_REQUIRED_CODE:
                    if self._session_id is None:
                        self._last_error = f"session/new refused: {e} (code {e.code})"
                        log.warning("agent %s: ACP %s", agent, self._last_error)
                        return False
                    detail = f"the agent refused session/load ({e}, code {e.code}); {NOT_RESUMED}"
                    log.warning("agent %s: %s", agent, detail)
                    await self._finish_not_resumable(detail)
                    raise SessionOver() from None
                result: AuthResult = "refused" if authenticated else await self._authenticate(conn)
                if result == "failed":
                    return False  # the connection broke: an ordinary failed connection
                if result != "ok":
                    await self._finish_auth_required(result == "refused")
                    raise SessionOver() from None
                authenticated = True
            except (ConnectionError, OSError, TimeoutError, ValidationError) as e:
                what = "session/new" if self._session_id is None else "session/load"
                self._last_error = f"{what}: {e or type(e).__name__}"
                if not self._closing:
                    log.warning("agent %s: ACP %s", agent, self._last_error)
                return False

    async def _new_session(self, conn: acp.ClientSideConnection) -> None:
        new = await wait_for(
            conn.new_session(cwd=self._cwd(), mcp_servers=[]), self.handshake_timeout
        )
        self._session_id = new.session_id
        log.info("agent %s: ACP session %s started", self.target.agent_id, new.session_id)
        self.mapper.session_started(new.session_id, new.config_options)
        await self._drain()

    async def _load_session(self, conn: acp.ClientSideConnection) -> None:
        sid = self._session_id
        assert sid is not None
        self.mapper.loading = True
        try:
            loaded = await wait_for(
                conn.load_session(cwd=self._cwd(), session_id=sid, mcp_servers=[]),
                self.handshake_timeout,
            )
        finally:
            self.mapper.loading = False
        self.resumed += 1
        if loaded is not None:
            self.mapper.session_loaded(loaded.config_options)
        log.info(
            "agent %s: rejoined ACP session %s after %d turns (%d replayed updates skipped)",
            self.target.agent_id,
            sid,
            self._turns,
            self.mapper.replayed_updates,
        )

    async def _authenticate(self, conn: acp.ClientSideConnection) -> AuthResult:
        agent = self.target.agent_id
        names: Collection[str] = ()
        if self.credentials is not None:
            try:
                found = self.credentials(self.target)
                names = await found if inspect.isawaitable(found) else found
            except Exception as e:
                log.warning("agent %s: cannot read the workspace's credentials: %s", agent, e)
        method = auth.pick_method(self._auth_methods, names, self.auth_method)
        if method is None:
            return "no_method"
        log.info("agent %s: authenticating with ACP method %r", agent, method)
        try:
            await wait_for(conn.authenticate(method_id=method), self.handshake_timeout)
        except acp.RequestError as e:
            self._last_error = f"authenticate ({method}) refused: {e} (code {e.code})"
            log.warning("agent %s: ACP %s", agent, self._last_error)
            return "refused"
        except (ConnectionError, OSError, TimeoutError, ValidationError) as e:
            self._last_error = f"authenticate: {e or type(e).__name__}"
            log.warning("agent %s: ACP %s", agent, self._last_error)
            return "failed"
        return "ok"

    # ---- turns -------------------------------------------------------------------------------

    async def _drive(self, conn: acp.ClientSideConnection) -> None:
        while not self._closing and self._conclude_request is None:
            prompt = self._next_prompt()
            if prompt is None:
                if self._should_end():
                    await self._end_session(conn)
                    return
                if not await self._wait_input(conn):
                    self._last_error = "the agent closed the connection"
                    log.info("agent %s: the ACP connection ended while idle", self.target.agent_id)
                    return
                continue
            text, initial = prompt
            if not self._alive(conn):
                # Not sent: keep a queued text for the next connection (the spawn prompt is
                # picked again by itself while it was never sent).
                if not initial:
                    self._inputs.appendleft(text)
                self._last_error = "the agent closed the connection"
                return
            if await self._turn(conn, text, initial):
                return
            if self._auth_refused_prompt is not None and not await self._auth_for_prompt(conn):
                return

    async def _auth_for_prompt(self, conn: acp.ClientSideConnection) -> bool:
        """The prompt was refused with -32000 (claude-agent-acp without a key): authenticate
        once and send the same text again as the next turn (the agent did nothing with it),
        else finish at once `auth_required`. False: the session is over."""
        text, self._auth_refused_prompt = self._auth_refused_prompt, None
        result: AuthResult = "refused"
        if not self._auth_prompt_tried:
            self._auth_prompt_tried = True
            result = await self._authenticate(conn)
        if result == "ok" and text is not None:
            self._inputs.appendleft(text)
            return True
        if result == "failed":
            return False  # the connection broke
        await self._finish_auth_required(result == "refused")
        return False

    def _initial_prompt(self) -> str | None:
        meta = self.target.meta
        if meta is not None and meta.prompt:
            return meta.prompt
        return self.target.prompt or None

    def _next_prompt(self) -> tuple[str, bool] | None:
        if not self._initial_sent and self._spawned_here:
            text = self._initial_prompt()
            if text:
                return text, True
        if self._inputs and isinstance(self._inputs[0], str):
            queued = self._inputs.popleft()
            assert isinstance(queued, str)
            return queued, False
        return None

    def _should_end(self) -> bool:
        if self._inputs and isinstance(self._inputs[0], End):
            self._inputs.popleft()
            return True
        # An adopted agent was not given its task by us: it waits for input like an
        # interactive one.
        return not self.target.interactive and self._spawned_here and not self._inputs

    async def _wait_input(self, conn: acp.ClientSideConnection) -> bool:
        """Wait for queued input or close(). False if the connection ended meanwhile."""
        recv = receive_task(conn)
        while not self._inputs and not self._closing and self._conclude_request is None:
            self._input_event.clear()
            waiters: set[asyncio.Future[Any]] = {
                asyncio.ensure_future(self._input_event.wait()),
                asyncio.ensure_future(self._close_event.wait()),
                asyncio.ensure_future(self._retry_now.wait()),
            }
            try:
                await asyncio.wait(
                    waiters | ({recv} if recv is not None else set()),
                    return_when=asyncio.FIRST_COMPLETED,
                    timeout=None if recv is not None else 0.5,
                )
            finally:
                for w in waiters:
                    w.cancel()
            if not self._alive(conn):
                return False
            if self._retry_now.is_set() and self._conclude_request is None:
                self._retry_now.clear()  # a status change while idle: nothing to do
        return True

    def _alive(self, conn: acp.ClientSideConnection) -> bool:
        recv = receive_task(conn)
        if recv is not None:
            return not recv.done()
        reader = self._reader
        return reader is not None and not reader.at_eof()

    async def _turn(self, conn: acp.ClientSideConnection, text: str, initial: bool) -> bool:
        """One prompt turn. True if the turn (or the connection) was lost."""
        sid = self._session_id
        assert sid is not None
        turn = self._turns
        self._turns += 1
        if initial:
            self._initial_sent = True
        self._prompt_queued = False
        self._turn_cancel = asyncio.Event()
        self.mapper.begin_turn(turn)
        self.queue.mark(lambda st: st.begin_turn(turn, initial=initial))
        # The turn's begin is stored before its prompt goes out: at most once.
        await self._drain()
        await self.pump.commit()
        agent = self.target.agent_id
        prompt = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[acp.text_block(text)]))
        try:
            # One loop turn: the SDK has queued the request in its (FIFO) sender, so a
            # session/cancel sent from now on reaches the agent after the prompt.
            await asyncio.sleep(0)
            if self.mapper.turn == turn:
                self._prompt_queued = True
                if self.mapper.cancel_sent and not prompt.done():
                    await self._send_cancel(conn, sid, self.close_timeout)
            resp = await prompt
        except asyncio.CancelledError:
            prompt.cancel()
            raise
        except acp.RequestError as e:
            self.metrics.inc(ACP_PROMPT_ERRORS)
            log.warning("agent %s: turn %d failed: %s (code %s)", agent, turn, e, e.code)
            self.mapper.end_turn(turn, "error", None, detail=f"{e} (code {e.code})")
            if e.code == auth.AUTH_REQUIRED_CODE:
                self._auth_refused_prompt = text  # the agent did no work: see _drive
        except ValidationError:
            # Unknown stop reason (pitfall 4): the observer has ended the turn from the raw
            # response; this only covers a response the observer could not attribute.
            self.mapper.end_turn(turn, "unknown", None)
        except (ConnectionError, OSError) as e:
            self._last_error = f"connection lost: {e or type(e).__name__}"
            if self.mapper.turn == turn and self._conclude_request is None:
                if self._closing:
                    self.mapper.lose_turn(
                        turn,
                        "the driver was closed (prosperod stopping) while the turn was in flight",
                    )
                else:
                    reason = (
                        f"the connection to the agent was lost mid-turn: {e or type(e).__name__}"
                    )
                    if self.agent_status() is None:
                        self.mapper.lose_turn(turn, reason)  # no status to learn the cause from
                    else:
                        # Why the turn ended is known only later: a rejoin (or a spent
                        # budget) records it lost; a worker caliband reports killed or
                        # crashed concludes the run with that outcome instead.
                        self._pending_loss = reason
            await self._drain()
            return True
        else:
            self.mapper.end_turn(turn, resp.stop_reason, usage_from(resp.usage))
        self._prompt_queued = False
        await self._drain()
        return False

    async def _end_session(self, conn: acp.ClientSideConnection) -> None:
        caps, sid = self._caps, self._session_id
        if (
            sid is not None
            and caps is not None
            and caps.session_capabilities is not None
            and caps.session_capabilities.close is not None
        ):
            await self._bounded(
                conn.close_session(session_id=sid), "session/close", self.close_timeout
            )
        outcome, detail = outcome_for(self.mapper.last_stop)
        await self._finish(outcome, detail or self.mapper.last_detail)

    async def _finish_auth_required(self, tried: bool) -> None:
        methods = auth.describe_methods(self._auth_methods)
        detail = (
            "the agent requires ACP authentication and "
            + ("rejected the method Prospero used for" if tried else "no advertised method matches")
            + f" the workspace's credentials; advertised methods: {methods}"
        )
        log.warning("agent %s: %s", self.target.agent_id, detail)
        await self._finish(auth.AUTH_REQUIRED_OUTCOME, detail)
