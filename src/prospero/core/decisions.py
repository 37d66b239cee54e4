"""Permission decisions: the PermissionBroker prosperod gives its ACP drivers (ADR 0006).

Every `session/request_permission` of an agent becomes a durable *decision* (the
`DecisionStore`; SQLite tables in `events.db`). `DecisionService.decide()` answers it, in
this order:

1. the workspace *policy* (an ordered rule list: allow / deny / ask by tool kind, title glob,
   command glob, path glob; the first matching rule wins) — `allow` / `deny` answer at once,
   recorded as decided by `policy` with the rule's name;
2. the agent session's *always rules*: a human's earlier `allow_always` / `reject_always`
   answer for the same tool kind and title in the same ACP session answers at once, recorded
   as decided by `rule` (`session:<decision id>`);
3. the *posture* (the spawn's, else the workspace default, else `autonomous`): an
   autonomous agent has nobody to ask, so the request is denied by policy
   (rule `autonomous-default-deny`, or the `ask` rule that matched);
4. a supervised agent's request waits for a human: a `decision_pending` event on the agent's
   stream (and fleet SSE), optional webhooks, `GET /api/decisions?state=pending`. The first
   `decide_by_human()` wins (an atomic conditional update in the store, then the in-process
   future the driver awaits); everyone after gets a conflict. A workspace timeout answers with
   the agent's reject option (`expired`, by `timeout`, note "timed out"); a cancelled turn, a
   killed agent or a lost connection resolves it `cancelled`.

Every resolution is stored (who, when, option, note, rule) and announced as a
`decision_resolved` event, so the agent's history carries the audit.

Restarts: a decision still pending when prosperod stops stays pending in the store (its
JSON-RPC request belonged to the old connection and cannot be answered any more). The next
prosperod holds it for `rejoin_grace` seconds: if the rejoined session asks again for the same
tool call, the new request takes the decision over (same id, still pending); otherwise it is
resolved `cancelled` by `restart`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import httpx

from prospero.core.aio import wait_for
from prospero.core.errors import Conflict, NotFound, ProsperoError, StoreError
from prospero.core.metrics import Metrics
from prospero.core.permissions import (
    DecidedBy,
    PermissionOutcome,
    PermissionRequest,
)
from prospero.core.store.decisions import DecisionStore, SessionRule
from prospero.types.decisions import (
    Decision,
    DecisionState,
    PolicyPatch,
    PolicyRule,
    WorkspacePolicy,
)
from prospero.types.events import (
    DecisionOption,
    DecisionPending,
    DecisionResolved,
    DecisionToolCall,
    EventKind,
    now_ts,
)
from prospero.types.model import Posture

log = logging.getLogger(__name__)

# Metric names.
DECISIONS_REQUESTED = "decisions_requested"
DECISIONS_ASKED = "decisions_asked"
DECISIONS_AUTOMATIC = "decisions_automatic"
DECISIONS_TIMED_OUT = "decisions_timed_out"
DECISIONS_CANCELLED = "decisions_cancelled"
DECISIONS_PENDING = "decisions_pending"  # gauge
DECISION_STORE_FAILURES = "decision_store_failures"
DECISION_WEBHOOK_DELIVERIES = "decision_webhook_deliveries"
DECISION_WEBHOOK_RETRIES = "decision_webhook_retries"
DECISION_WEBHOOK_FAILURES = "decision_webhook_failures"
DECISION_WEBHOOK_DROPPED = "decision_webhook_dropped"

# Who resolved a decision, besides an API token name.
BY_POLICY = "policy"
BY_RULE = "rule"
BY_TIMEOUT = "timeout"
BY_CANCEL = "cancel"
BY_RESTART = "restart"
ANONYMOUS = "anonymous"

AUTONOMOUS_RULE = "autonomous-default-deny"
DEFAULT_POSTURE: Posture = "autonomous"
TIMED_OUT = "timed out"
CANCELLED_NOTE = (
    "the agent's request ended before a decision (turn cancelled, connection lost or driver "
    "stopped)"
)
RESTART_NOTE = (
    "prosperod restarted while the decision was pending and the rejoined session did not ask again"
)


class DecisionNotFound(NotFound):
    def __init__(self, decision_id: str) -> None:
        super().__init__(f"decision '{decision_id}' not found")
        self.decision_id = decision_id


class DecisionConflict(Conflict):
    """The decision cannot be decided (any more): someone else answered, it expired or was
    cancelled, or its request is not live in this process."""


class UnknownOption(ProsperoError):
    """The option id is not one the agent offered (the API answers 400)."""

    kind = "invalid_option"


class EmitterLike(Protocol):
    async def emit(self, repo: str, agent_id: str, kind: EventKind) -> Any: ...


# ---- policy ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyMatch:
    rule: PolicyRule
    name: str

    @property
    def action(self) -> str:
        return self.rule.action


def _glob(value: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern)


def command_of(value: Any) -> str | None:
    """`rawInput.command` (or `cmd`) as one string; an argv list is joined with spaces."""
    if not isinstance(value, dict):
        return None
    for key in ("command", "cmd"):
        cmd = value.get(key)
        if isinstance(cmd, str):
            return cmd
        if isinstance(cmd, list) and all(isinstance(p, str) for p in cmd):
            return " ".join(cmd)
    return None


def paths_of(value: Any) -> list[str]:
    """The file paths a tool input names (`path`, `file_path`, `filePath`, `notebook_path`,
    `paths`)."""
    if not isinstance(value, dict):
        return []
    out: list[str] = []
    for key in ("path", "file_path", "filePath", "notebook_path"):
        p = value.get(key)
        if isinstance(p, str) and p:
            out.append(p)
    many = value.get("paths")
    if isinstance(many, list):
        out.extend(p for p in many if isinstance(p, str) and p)
    return out


def rule_matches(rule: PolicyRule, tc: DecisionToolCall) -> bool:
    if rule.kind is not None and not _glob(tc.kind or "other", rule.kind):
        return False
    if rule.title is not None and not _glob(tc.title, rule.title):
        return False
    if rule.command is not None:
        cmd = command_of(tc.input)
        if cmd is None or not _glob(cmd, rule.command):
            return False
    if rule.path is not None:
        pattern = rule.path
        if not any(_glob(p, pattern) for p in paths_of(tc.input)):
            return False
    return True


def rule_name(workspace: str, index: int, rule: PolicyRule) -> str:
    return rule.name or f"{workspace}#{index + 1}"


def evaluate_policy(
    policy: WorkspacePolicy, workspace: str, tc: DecisionToolCall
) -> PolicyMatch | None:
    """The first rule of the workspace's ordered list that matches the tool call."""
    for i, rule in enumerate(policy.rules):
        if rule_matches(rule, tc):
            return PolicyMatch(rule, rule_name(workspace, i, rule))
    return None


def option_for(
    options: Sequence[DecisionOption], action: str, prefer: str | None = None
) -> DecisionOption | None:
    """The option that answers `allow` / `reject`: `prefer` (an option kind) if offered, else
    the `*_once` one, else the `*_always` one, else any option of that family."""
    kinds = [k for k in (prefer, f"{action}_once", f"{action}_always") if k]
    for kind in kinds:
        for opt in options:
            if opt.kind == kind:
                return opt
    for opt in options:
        if opt.kind.startswith(f"{action}_"):
            return opt
    return None


def _deadline(timeout: float | None) -> str | None:
    if timeout is None:
        return None
    at = datetime.now(UTC) + timedelta(seconds=timeout)
    return at.isoformat(timespec="microseconds")


def _seconds_until(deadline: str) -> float:
    try:
        at = datetime.fromisoformat(deadline)
    except ValueError:
        return 0.0
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return (at - datetime.now(UTC)).total_seconds()


def new_decision_id() -> str:
    return f"dec-{uuid.uuid4().hex[:16]}"


def pending_event(d: Decision) -> DecisionPending:
    return DecisionPending(
        id=d.id,
        tool_call=d.tool_call,
        options=list(d.options),
        created_at=d.created_at,
        deadline=d.deadline,
        posture=d.posture,
    )


def _raise_if_cancel_requested() -> None:
    """Raise CancelledError when this task was asked to cancel but an await on the way here
    swallowed the request (Python 3.11's wait_for does when its inner future completes at the
    same time); `Task.cancelling()` still counts it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def resolved_event(d: Decision) -> DecisionResolved:
    opt = d.option(d.option_id)
    return DecisionResolved(
        id=d.id,
        tool_call=d.tool_call,
        state=d.state,
        option_id=d.option_id,
        option_kind=opt.kind if opt is not None else None,
        option_label=opt.label if opt is not None else None,
        by=d.decided_by,
        note=d.note,
        rule=d.rule,
        decided_at=d.decided_at,
    )


def _by_literal(by: str | None) -> DecidedBy:
    if by in (BY_POLICY, BY_RULE, BY_TIMEOUT, BY_CANCEL, BY_RESTART):
        return by  # type: ignore[return-value]
    return "user"


def outcome_of(d: Decision) -> PermissionOutcome:
    by = _by_literal(d.decided_by)
    if d.state in ("decided", "expired") and d.option_id is not None:
        return PermissionOutcome.select(d.option_id, by)
    return PermissionOutcome.cancelled(by)


def summary_of(d: Decision) -> str:
    what = d.tool_call.title or d.tool_call.kind or "a tool call"
    if d.state == "pending":
        return f"agent {d.agent_id} ({d.workspace}) asks permission: {what}"
    opt = d.option(d.option_id)
    answer = opt.kind if opt is not None else d.state
    return f"agent {d.agent_id} ({d.workspace}): {what}: {answer} by {d.decided_by}"


# ---- webhooks -------------------------------------------------------------------------------


class WebhookNotifier:
    """POSTs `{"event", "summary", "decision", "sent_at"}` to every URL when a decision
    becomes pending and when it is resolved. One FIFO worker per URL (order kept per URL);
    bounded retries with exponential backoff on network errors, 5xx, 408 and 429; other
    answers fail at once. Never blocks the caller: `notify` only enqueues (a full queue drops
    the notification, counted). Failures are logged and counted."""

    def __init__(
        self,
        urls: Sequence[str],
        metrics: Metrics,
        *,
        attempts: int = 4,
        backoff: float = 0.5,
        backoff_cap: float = 30.0,
        timeout: float = 5.0,
        max_queue: int = 1000,
    ) -> None:
        self.urls = [u for u in urls if u]
        self.metrics = metrics
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.backoff_cap = backoff_cap
        self.timeout = timeout
        self.max_queue = max_queue
        self._queues: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._client: httpx.AsyncClient | None = None

    def start(self) -> None:
        if not self.urls or self._client is not None:
            return
        self._client = httpx.AsyncClient(
            timeout=self.timeout,
            trust_env=False,
            headers={"User-Agent": "prosperod", "Content-Type": "application/json"},
        )
        for url in self.urls:
            q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=self.max_queue)
            self._queues[url] = q
            self._workers.append(asyncio.create_task(self._worker(url, q), name="decision-webhook"))

    def notify(self, event: str, decision: Decision) -> None:
        if not self._queues:
            return
        body = {
            "event": event,
            "summary": summary_of(decision),
            "decision": decision.model_dump(mode="json"),
            "sent_at": now_ts(),
        }
        for url, q in self._queues.items():
            try:
                q.put_nowait(body)
            except asyncio.QueueFull:
                self.metrics.inc(DECISION_WEBHOOK_DROPPED)
                log.warning("decision webhook %s: queue full, notification dropped", url)

    async def _worker(self, url: str, q: asyncio.Queue[dict[str, Any]]) -> None:
        while True:
            body = await q.get()
            try:
                await self._deliver(url, body)
            except asyncio.CancelledError:
                raise
            except Exception:  # a worker must survive anything
                self.metrics.inc(DECISION_WEBHOOK_FAILURES)
                log.exception("decision webhook %s: delivery failed", url)
            finally:
                q.task_done()

    async def _deliver(self, url: str, body: dict[str, Any]) -> None:
        client = self._client
        assert client is not None
        last = ""
        for attempt in range(self.attempts):
            if attempt:
                self.metrics.inc(DECISION_WEBHOOK_RETRIES)
                await asyncio.sleep(min(self.backoff_cap, self.backoff * 2 ** (attempt - 1)))
            try:
                resp = await client.post(url, json=body)
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if resp.status_code < 300:
                self.metrics.inc(DECISION_WEBHOOK_DELIVERIES)
                return
            last = f"HTTP {resp.status_code}"
            if resp.status_code < 500 and resp.status_code not in (408, 429):
                break
        self.metrics.inc(DECISION_WEBHOOK_FAILURES)
        log.warning(
            "decision webhook %s: giving up on %s for decision %s: %s",
            url,
            body.get("event"),
            (body.get("decision") or {}).get("id"),
            last,
        )

    async def close(self, drain: float = 3.0) -> None:
        """Deliver what is queued (bounded by `drain` seconds), then stop."""
        if self._queues:
            with contextlib.suppress(TimeoutError):
                await wait_for(
                    asyncio.gather(*(q.join() for q in self._queues.values())), drain
                )
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()
        self._queues.clear()
        if self._client is not None:
            await self._client.aclose()
            self._client = None


# ---- the service ----------------------------------------------------------------------------


@dataclass
class DecisionConfig:
    webhooks: Sequence[str] = ()
    # How long a decision left pending by a previous prosperod waits for its rejoined session
    # to ask again before it is cancelled.
    rejoin_grace: float = 30.0
    # Posture of agents whose spawn and workspace say nothing.
    default_posture: Posture = DEFAULT_POSTURE
    webhook_attempts: int = 4
    webhook_backoff: float = 0.5
    webhook_timeout: float = 5.0


@dataclass
class _Live:
    """A decision whose agent request is waiting in this process."""

    decision: Decision
    future: asyncio.Future[Decision]
    announced: asyncio.Event = field(default_factory=asyncio.Event)


_SessionKey = tuple[str, str]


class DecisionService:
    """PermissionBroker + decisions API + policy (see the module docstring)."""

    def __init__(
        self,
        store: DecisionStore,
        emitter: EmitterLike | None,
        metrics: Metrics | None = None,
        config: DecisionConfig | None = None,
    ) -> None:
        self.store = store
        self.emitter = emitter
        self.metrics = metrics or Metrics()
        self.config = config or DecisionConfig()
        self.webhooks = WebhookNotifier(
            self.config.webhooks,
            self.metrics,
            attempts=self.config.webhook_attempts,
            backoff=self.config.webhook_backoff,
            timeout=self.config.webhook_timeout,
        )
        self._live: dict[str, _Live] = {}
        self._orphans: dict[str, Decision] = {}
        self._rules: dict[_SessionKey, dict[tuple[str, str], SessionRule]] = {}
        self._rules_loaded: set[_SessionKey] = set()
        self._policies: dict[str, WorkspacePolicy] = {}
        self._policy_lock = asyncio.Lock()
        self._background: set[asyncio.Task[Any]] = set()
        self._grace_task: asyncio.Task[None] | None = None
        self._closing = False
        self._started = False

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store, take over decisions a previous prosperod left pending, start the
        webhooks."""
        if self._started:
            return
        self._started = True
        await self.store.open()
        self.webhooks.start()
        try:
            left = await self.store.query(state="pending")
        except StoreError as e:
            log.warning("cannot read pending decisions: %s", e)
            left = []
        for d in left:
            self._orphans[d.id] = d
        if left:
            log.info(
                "%d decision(s) were pending when prosperod stopped; cancelled in %gs unless "
                "their rejoined sessions ask again",
                len(left),
                self.config.rejoin_grace,
            )
            self._grace_task = asyncio.create_task(self._expire_orphans(), name="decision-grace")

    def begin_shutdown(self) -> None:
        """prosperod is stopping: requests the drivers abandon from now on stay pending in the
        store (the next prosperod resolves them), instead of being recorded as cancelled."""
        self._closing = True

    async def close(self) -> None:
        self._closing = True
        if self._grace_task is not None:
            self._grace_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._grace_task
        if self._background:
            await asyncio.wait(set(self._background), timeout=5.0)
        await self.webhooks.close()
        await self.store.close()

    def _spawn(self, coro: Any, name: str) -> None:
        task: asyncio.Task[Any] = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _expire_orphans(self) -> None:
        await asyncio.sleep(self.config.rejoin_grace)
        for decision_id in list(self._orphans):
            try:
                await self._resolve(decision_id, "cancelled", by=BY_RESTART, note=RESTART_NOTE)
            except StoreError as e:
                log.warning("decision %s: cannot cancel it after the restart: %s", decision_id, e)

    # ---- policy ------------------------------------------------------------------------------

    async def policy(self, workspace: str) -> WorkspacePolicy:
        cached = self._policies.get(workspace)
        if cached is not None:
            return cached
        stored = await self.store.get_policy(workspace)
        policy = stored or WorkspacePolicy()
        self._policies[workspace] = policy
        return policy

    async def set_policy(self, workspace: str, policy: WorkspacePolicy) -> WorkspacePolicy:
        async with self._policy_lock:
            return await self._set_policy(workspace, policy)

    async def _set_policy(self, workspace: str, policy: WorkspacePolicy) -> WorkspacePolicy:
        await self.store.put_policy(workspace, policy)
        self._policies[workspace] = policy
        log.info(
            "workspace %s: permission policy set (%d rules, posture %s, timeout %s)",
            workspace,
            len(policy.rules),
            policy.posture or "default",
            policy.timeout_s,
        )
        return policy

    async def patch_policy(self, workspace: str, patch: PolicyPatch) -> WorkspacePolicy:
        async with self._policy_lock:
            return await self._set_policy(workspace, patch.apply(await self.policy(workspace)))

    async def default_posture(self, workspace: str) -> Posture | None:
        """The workspace's default posture (None = not set)."""
        try:
            return (await self.policy(workspace)).posture
        except StoreError as e:
            log.warning("workspace %s: cannot read the permission policy: %s", workspace, e)
            return None

    # ---- queries -----------------------------------------------------------------------------

    async def get(self, decision_id: str) -> Decision:
        d = await self.store.get(decision_id)
        if d is None:
            raise DecisionNotFound(decision_id)
        return d

    async def query(
        self,
        *,
        state: DecisionState | None = None,
        agent_id: str | None = None,
        workspace: str | None = None,
        limit: int | None = None,
    ) -> list[Decision]:
        return await self.store.query(
            state=state, agent_id=agent_id, workspace=workspace, limit=limit
        )

    def pending_count(self) -> int:
        return len(self._live)

    def is_live(self, decision_id: str) -> bool:
        return decision_id in self._live

    # ---- the broker --------------------------------------------------------------------------

    async def decide(self, request: PermissionRequest) -> PermissionOutcome:
        self.metrics.inc(DECISIONS_REQUESTED)
        ws = request.workspace
        try:
            policy = await self.policy(ws)
        except StoreError as e:
            log.warning("workspace %s: cannot read the permission policy: %s", ws, e)
            policy = WorkspacePolicy()
        posture: Posture
        if request.posture == "supervised":
            posture = "supervised"
        elif request.posture == "autonomous":
            posture = "autonomous"
        else:
            posture = policy.posture or self.config.default_posture
        tc = DecisionToolCall(
            id=request.tool_call.id,
            title=request.tool_call.title or "",
            kind=str(request.tool_call.kind) if request.tool_call.kind is not None else None,
            input=request.tool_call.input,
        )
        base = Decision(
            id=new_decision_id(),
            agent_id=request.agent_id,
            workspace=ws,
            session_id=request.session_id,
            turn=request.turn,
            tool_call=tc,
            options=[
                DecisionOption(id=o.option_id, label=o.label, kind=o.kind) for o in request.options
            ],
            created_at=now_ts(),
            posture=posture,
        )
        match = evaluate_policy(policy, ws, tc)
        if match is not None and match.action in ("allow", "deny"):
            action = "allow" if match.action == "allow" else "reject"
            return await self._auto(
                request, base, action, BY_POLICY, match.name, match.rule.describe()
            )
        srule = await self._session_rule(request.agent_id, request.session_id, tc)
        if srule is not None:
            return await self._auto(
                request,
                base,
                srule.action,
                BY_RULE,
                srule.name,
                f"always-{srule.action} for {tc.kind or 'other'} {tc.title!r} in this session "
                f"(decision {srule.decision_id})",
                prefer=srule.option_kind,
            )
        if posture != "supervised":
            rule = match.name if match is not None else AUTONOMOUS_RULE
            return await self._auto(
                request, base, "reject", BY_POLICY, rule, "autonomous posture: nobody to ask"
            )
        return await self._ask(request, base, policy)

    async def _auto(
        self,
        request: PermissionRequest,
        base: Decision,
        action: str,
        by: str,
        rule: str,
        note: str,
        *,
        prefer: str | None = None,
    ) -> PermissionOutcome:
        opt = option_for(base.options, action, prefer)
        if opt is None:
            note = f"{note}; the agent offered no {action} option"
        d = base.model_copy(
            update={
                "state": "decided" if opt is not None else "cancelled",
                "decided_by": by,
                "decided_at": base.created_at,
                "option_id": opt.id if opt is not None else None,
                "note": note,
                "rule": rule,
            }
        )
        self.metrics.inc(DECISIONS_AUTOMATIC)
        try:
            await self.store.insert(d)
        except StoreError as e:
            self.metrics.inc(DECISION_STORE_FAILURES)
            log.warning("decision %s could not be stored: %s", d.id, e)
        await self._flush(request)
        await self._emit(d, resolved_event(d))
        log.info(
            "agent %s: %s %r answered %s by %s (%s)",
            d.agent_id,
            d.tool_call.kind or "other",
            d.tool_call.title,
            opt.kind if opt is not None else "cancelled",
            by,
            rule,
        )
        return outcome_of(d)

    async def _ask(
        self, request: PermissionRequest, base: Decision, policy: WorkspacePolicy
    ) -> PermissionOutcome:
        loop = asyncio.get_running_loop()
        deadline = _deadline(policy.timeout_s)
        live: _Live | None = None
        orphan = self._take_orphan(request.agent_id, request.session_id, base.tool_call.id)
        if orphan is not None:
            live = _Live(orphan, loop.create_future())
            self._live[orphan.id] = live
            try:
                adopted = await self.store.reattach(
                    orphan.id, tool_call=base.tool_call, options=base.options, deadline=deadline
                )
            except StoreError as e:
                self.metrics.inc(DECISION_STORE_FAILURES)
                log.warning("decision %s could not be taken over: %s", orphan.id, e)
                self._orphans[orphan.id] = orphan
                adopted = None
            if adopted is not None:
                live.decision = adopted
                log.info(
                    "agent %s asked again for tool call %s after a restart: decision %s "
                    "stays pending",
                    request.agent_id,
                    base.tool_call.id,
                    adopted.id,
                )
            else:
                self._live.pop(orphan.id, None)
                live = None
        if live is None:
            d = base.model_copy(update={"deadline": deadline, "state": "pending"})
            live = _Live(d, loop.create_future())
            self._live[d.id] = live
            insert = asyncio.ensure_future(self.store.insert(d))
            try:
                await asyncio.shield(insert)
            except asyncio.CancelledError:
                self._live.pop(d.id, None)
                if not self._closing:
                    self._spawn(self._cancel_after(d.id, insert), f"decision-cancel-{d.id}")
                raise
            except StoreError:
                self._live.pop(d.id, None)
                self.metrics.inc(DECISION_STORE_FAILURES)
                raise
        d = live.decision
        self.metrics.inc(DECISIONS_ASKED)
        self.metrics.add_gauge(DECISIONS_PENDING, 1)
        try:
            await self._flush(request)
            await self._emit(d, pending_event(d))
            live.announced.set()
            self.webhooks.notify("decision_pending", d)
            log.info(
                "agent %s asks permission for %s %r: decision %s pending%s",
                d.agent_id,
                d.tool_call.kind or "other",
                d.tool_call.title,
                d.id,
                f" until {d.deadline}" if d.deadline else "",
            )
            _raise_if_cancel_requested()
            final = await self._wait(live)
        except asyncio.CancelledError:
            if not self._closing and not live.future.done():
                self._spawn(self._cancel_after(d.id, None), f"decision-cancel-{d.id}")
            raise
        finally:
            live.announced.set()
            if self._live.get(d.id) is live:
                del self._live[d.id]
            self.metrics.add_gauge(DECISIONS_PENDING, -1)
        return outcome_of(final)

    async def _wait(self, live: _Live) -> Decision:
        d = live.decision
        if d.deadline is not None:
            left = _seconds_until(d.deadline)
            try:
                return await wait_for(asyncio.shield(live.future), max(0.0, left))
            except TimeoutError:
                opt = option_for(d.options, "reject")
                self.metrics.inc(DECISIONS_TIMED_OUT)
                await self._resolve(
                    d.id,
                    "expired",
                    option_id=opt.id if opt is not None else None,
                    by=BY_TIMEOUT,
                    note=TIMED_OUT,
                    in_memory_fallback=True,
                )
        # Shielded: a cancelled caller must not cancel the future (resolutions look at it).
        return await asyncio.shield(live.future)

    async def _cancel_after(self, decision_id: str, insert: asyncio.Future[None] | None) -> None:
        if insert is not None:
            with contextlib.suppress(Exception):
                await insert
        await self._resolve(decision_id, "cancelled", by=BY_CANCEL, note=CANCELLED_NOTE)

    async def _flush(self, request: PermissionRequest) -> None:
        if request.flush is None:
            return
        try:
            await wait_for(request.flush(), 5.0)  # core.aio's: keeps a cancel (ADR 0007)
        except (TimeoutError, Exception) as e:  # ordering is best effort; never fail the ask
            log.debug(
                "agent %s: event flush before a decision event failed: %r", request.agent_id, e
            )

    async def _emit(self, d: Decision, kind: EventKind) -> None:
        if self.emitter is None:
            return
        try:
            await self.emitter.emit(d.workspace, d.agent_id, kind)
        except Exception as e:
            log.warning("decision %s: could not record %s: %s", d.id, kind.kind, e)

    # ---- resolving ---------------------------------------------------------------------------

    async def decide_by_human(
        self, decision_id: str, option_id: str, *, by: str, note: str | None = None
    ) -> Decision:
        """Answer a pending decision with one of its options. Raises DecisionNotFound,
        DecisionConflict (not pending any more, someone else won, or its request is not
        live) or UnknownOption."""
        d = await self.get(decision_id)
        if d.state != "pending":
            raise self._conflict(d)
        if d.option(option_id) is None:
            offered = ", ".join(f"{o.id} ({o.kind})" for o in d.options) or "none"
            raise UnknownOption(
                f"decision '{decision_id}' has no option '{option_id}' (offered: {offered})"
            )
        if decision_id not in self._live:
            raise DecisionConflict(
                f"decision '{decision_id}' cannot be answered: its request ended when "
                "prosperod restarted (it is cancelled unless the agent asks again)"
            )
        text = (note or "").strip() or None
        updated = await self._resolve(decision_id, "decided", option_id=option_id, by=by, note=text)
        if updated is None:
            raise self._conflict(await self.get(decision_id))
        return updated

    def _conflict(self, d: Decision) -> DecisionConflict:
        if d.state == "pending":
            return DecisionConflict(f"decision '{d.id}' was resolved concurrently")
        who = f" by {d.decided_by}" if d.decided_by else ""
        return DecisionConflict(f"decision '{d.id}' is already {d.state}{who}")

    async def cancel_agent(self, agent_id: str, reason: str) -> int:
        """Resolve the agent's pending decisions as cancelled (its turn was cancelled, it was
        killed or removed, or it ended). Returns how many."""
        live = [i for i, x in self._live.items() if x.decision.agent_id == agent_id]
        orphans = [i for i, d in self._orphans.items() if d.agent_id == agent_id]
        n = 0
        for decision_id in live:
            if await self._resolve(
                decision_id, "cancelled", by=BY_CANCEL, note=reason, in_memory_fallback=True
            ):
                n += 1
        for decision_id in orphans:
            # Left pending by a previous prosperod: the restart is what ended its request.
            note = f"prosperod restarted while the decision was pending; {reason}"
            if await self._resolve(decision_id, "cancelled", by=BY_RESTART, note=note):
                n += 1
        return n

    async def _resolve(
        self,
        decision_id: str,
        state: DecisionState,
        *,
        by: str,
        option_id: str | None = None,
        note: str | None = None,
        rule: str | None = None,
        in_memory_fallback: bool = False,
    ) -> Decision | None:
        """The one way out of `pending`: the store's conditional update decides who wins;
        the winner answers the waiting request, records the session rule of an `*_always`
        answer, emits `decision_resolved` and notifies the webhooks."""
        decided_at = now_ts()
        live = self._live.get(decision_id)
        try:
            updated = await self.store.resolve(
                decision_id,
                state=state,
                decided_by=by,
                decided_at=decided_at,
                option_id=option_id,
                note=note,
                rule=rule,
            )
        except StoreError as e:
            self.metrics.inc(DECISION_STORE_FAILURES)
            log.warning("decision %s: could not store its resolution: %s", decision_id, e)
            if not in_memory_fallback or live is None or live.future.done():
                raise
            updated = live.decision.model_copy(
                update={
                    "state": state,
                    "decided_by": by,
                    "decided_at": decided_at,
                    "option_id": option_id,
                    "note": note,
                    "rule": rule,
                }
            )
        if updated is None:
            return None
        self._orphans.pop(decision_id, None)
        live = self._live.get(decision_id)
        srule: SessionRule | None = None
        opt = updated.option(updated.option_id)
        if live is not None and state == "decided" and opt is not None:
            if opt.kind in ("allow_always", "reject_always"):
                srule = SessionRule(
                    agent_id=updated.agent_id,
                    session_id=updated.session_id,
                    tool_kind=updated.tool_call.kind or "",
                    title=updated.tool_call.title,
                    action="allow" if opt.kind == "allow_always" else "reject",
                    option_kind=opt.kind,
                    decision_id=updated.id,
                    created_at=decided_at,
                )
                # In place before the agent hears the answer (it may ask again at once).
                self._remember_rule(srule)
        if state == "cancelled":
            self.metrics.inc(DECISIONS_CANCELLED)
        if srule is not None:
            try:
                await self.store.add_session_rule(srule)
            except StoreError as e:
                self.metrics.inc(DECISION_STORE_FAILURES)
                log.warning("session rule of decision %s not stored: %s", updated.id, e)
        if live is not None:
            with contextlib.suppress(TimeoutError):
                await wait_for(live.announced.wait(), 10.0)
        # Recorded before the agent hears the answer: in the agent's history the answer comes
        # before what the agent does with it (its tool's result, its next ask).
        await self._emit(updated, resolved_event(updated))
        if live is not None and not live.future.done():
            live.future.set_result(updated)
        self.webhooks.notify("decision_resolved", updated)
        log.info(
            "decision %s (agent %s, %r): %s%s by %s%s",
            updated.id,
            updated.agent_id,
            updated.tool_call.title,
            updated.state,
            f" {opt.kind}" if opt is not None else "",
            by,
            f": {note}" if note else "",
        )
        return updated

    # ---- session rules -----------------------------------------------------------------------

    def _remember_rule(self, rule: SessionRule) -> None:
        key = (rule.agent_id, rule.session_id)
        self._rules.setdefault(key, {})[(rule.tool_kind, rule.title)] = rule

    async def _session_rule(
        self, agent_id: str, session_id: str, tc: DecisionToolCall
    ) -> SessionRule | None:
        key = (agent_id, session_id)
        if key not in self._rules_loaded:
            try:
                stored = await self.store.session_rules(agent_id, session_id)
            except StoreError as e:
                log.warning("agent %s: cannot read session rules: %s", agent_id, e)
                stored = []
            else:
                self._rules_loaded.add(key)
            mine = self._rules.setdefault(key, {})
            for r in stored:
                mine.setdefault((r.tool_kind, r.title), r)
        return self._rules.get(key, {}).get((tc.kind or "", tc.title))

    # ---- restart -----------------------------------------------------------------------------

    def _take_orphan(self, agent_id: str, session_id: str, tool_call_id: str) -> Decision | None:
        for decision_id, d in self._orphans.items():
            if (
                d.agent_id == agent_id
                and d.session_id == session_id
                and d.tool_call.id == tool_call_id
            ):
                del self._orphans[decision_id]
                return d
        return None


def decided_by_name(token_name: str | None) -> str:
    """The audit name of an API caller: its token's name, or "anonymous" without auth."""
    return token_name or ANONYMOUS


__all__ = [
    "ANONYMOUS",
    "AUTONOMOUS_RULE",
    "BY_CANCEL",
    "BY_POLICY",
    "BY_RESTART",
    "BY_RULE",
    "BY_TIMEOUT",
    "DecisionConfig",
    "DecisionConflict",
    "DecisionNotFound",
    "DecisionService",
    "UnknownOption",
    "WebhookNotifier",
    "decided_by_name",
    "evaluate_policy",
    "option_for",
]
