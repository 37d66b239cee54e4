"""DecisionService: the PermissionBroker prosperod gives its ACP drivers, the decisions API
and the one way a decision leaves `pending` (see the package docstring for the order in which
a request is answered, and for restarts)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prospero.core.aio import wait_for
from prospero.core.decisions.errors import DecisionConflict, DecisionNotFound, UnknownOption
from prospero.core.decisions.names import (
    AUTONOMOUS_NOTE,
    AUTONOMOUS_RULE,
    BY_CANCEL,
    BY_POLICY,
    BY_RESTART,
    BY_RULE,
    BY_TAKEOVER,
    BY_TIMEOUT,
    CANCELLED_NOTE,
    DECISION_STORE_FAILURES,
    DECISIONS_ASKED,
    DECISIONS_AUTOMATIC,
    DECISIONS_CANCELLED,
    DECISIONS_PENDING,
    DECISIONS_REQUESTED,
    DECISIONS_TIMED_OUT,
    DEFAULT_POSTURE,
    RESTART_NOTE,
    TIMED_OUT,
)
from prospero.core.decisions.policy import WorkspacePolicies, evaluate_policy
from prospero.core.decisions.session_rules import SessionRules, rule_of_answer
from prospero.core.decisions.views import outcome_of, pending_event, resolved_event
from prospero.core.decisions.waiting import (
    LiveDecision,
    deadline_after,
    raise_if_cancel_requested,
    wait_for_answer,
)
from prospero.core.decisions.webhooks import WebhookNotifier
from prospero.core.errors import StoreError
from prospero.core.metrics import Metrics
from prospero.core.permissions import PermissionOutcome, PermissionRequest
from prospero.core.store.decisions import DecisionStore, SessionRule
from prospero.types.decisions import (
    Decision,
    DecisionState,
    PolicyPatch,
    WorkspacePolicy,
    option_for,
)
from prospero.types.events import DecisionOption, DecisionToolCall, EventKind, now_ts
from prospero.types.model import Posture

log = logging.getLogger(__name__)


class EmitterLike(Protocol):
    async def emit(self, repo: str, agent_id: str, kind: EventKind) -> Any: ...


# (decision, option id, decided by, note) -> the resolution, or None when this replica is the
# one its request would wait on.
RemoteAnswer = Callable[[Decision, str, str, str | None], Awaitable[Decision | None]]


def new_decision_id() -> str:
    return f"dec-{uuid.uuid4().hex[:16]}"


@dataclass
class DecisionConfig:
    webhooks: Sequence[str] = ()
    # How long a decision left pending by a previous prosperod waits for its rejoined session
    # to ask again before it is cancelled.
    rejoin_grace: float = 30.0
    # Several replicas share the decision store (clustered prosperod, ADR 0012): a decision
    # pending in the store may be live on another replica, so none is taken for an orphan at
    # start, policies are read through to the store, and a replica that takes an agent over
    # cancels what its previous owner left pending (`cancel_stored`).
    clustered: bool = False
    # Posture of agents whose spawn and workspace say nothing.
    default_posture: Posture = DEFAULT_POSTURE
    webhook_attempts: int = 4
    webhook_backoff: float = 0.5
    webhook_timeout: float = 5.0


class DecisionService:
    """PermissionBroker + decisions API + policy (see the package docstring)."""

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
        self.policies = WorkspacePolicies(store, cache=not self.config.clustered)
        self.session_rules = SessionRules(store)
        # Clustered: answers a decision whose request waits on another replica (its owner);
        # None when that would be this replica (`core/relay/routing.py`).
        self.remote: RemoteAnswer | None = None
        self._live: dict[str, LiveDecision] = {}
        self._orphans: dict[str, Decision] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._grace_task: asyncio.Task[None] | None = None
        self._closing = False
        self._started = False

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store, take over decisions a previous prosperod left pending, start the
        webhooks. Clustered, the store's pending decisions are not taken over: they may be
        waiting on live replicas; those of an agent whose replica died are cancelled by the
        replica that takes the agent over (`cancel_stored`)."""
        if self._started:
            return
        self._started = True
        await self.store.open()
        self.webhooks.start()
        if self.config.clustered:
            return
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
        return await self.policies.get(workspace)

    async def set_policy(self, workspace: str, policy: WorkspacePolicy) -> WorkspacePolicy:
        return await self.policies.set(workspace, policy)

    async def patch_policy(self, workspace: str, patch: PolicyPatch) -> WorkspacePolicy:
        return await self.policies.patch(workspace, patch)

    async def default_posture(self, workspace: str) -> Posture | None:
        """The workspace's default posture (None = not set)."""
        return await self.policies.default_posture(workspace)

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
        srule = await self.session_rules.find(request.agent_id, request.session_id, tc)
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
            return await self._auto(request, base, "reject", BY_POLICY, rule, AUTONOMOUS_NOTE)
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
        deadline = deadline_after(policy.timeout_s)
        live: LiveDecision | None = None
        orphan = self._take_orphan(request.agent_id, request.session_id, base.tool_call.id)
        if orphan is not None:
            live = LiveDecision.waiting(orphan)
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
            live = LiveDecision.waiting(d)
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
        self.metrics.add_gauge(DECISIONS_PENDING, 1, (d.workspace,))
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
            raise_if_cancel_requested()
            final = await wait_for_answer(live, self._expire)
        except asyncio.CancelledError:
            if not self._closing and not live.future.done():
                self._spawn(self._cancel_after(d.id, None), f"decision-cancel-{d.id}")
            raise
        finally:
            live.announced.set()
            if self._live.get(d.id) is live:
                del self._live[d.id]
            self.metrics.add_gauge(DECISIONS_PENDING, -1, (d.workspace,))
        return outcome_of(final)

    async def _expire(self, d: Decision) -> None:
        """The decision's deadline passed: answer the agent's reject option."""
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
        self,
        decision_id: str,
        option_id: str,
        *,
        by: str,
        note: str | None = None,
        local: bool = False,
    ) -> Decision:
        """Answer a pending decision with one of its options. Raises DecisionNotFound,
        DecisionConflict (not pending any more, someone else won, or its request is not
        live) or UnknownOption. In a cluster, a decision whose request waits on another
        replica (the agent's owner) is answered there, through `remote` (`core/relay`), with
        the same exactly-one-wins rule; `local` (a call relayed here) never relays again."""
        d = await self.get(decision_id)
        if d.state != "pending":
            raise self._conflict(d)
        if d.option(option_id) is None:
            offered = ", ".join(f"{o.id} ({o.kind})" for o in d.options) or "none"
            raise UnknownOption(
                f"decision '{decision_id}' has no option '{option_id}' (offered: {offered})"
            )
        if decision_id not in self._live and self.remote is not None and not local:
            text = (note or "").strip() or None
            answered = await self.remote(d, option_id, by, text)
            if answered is not None:
                return answered
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
            srule = rule_of_answer(updated, opt, decided_at)
            if srule is not None:
                # In place before the agent hears the answer (it may ask again at once).
                self.session_rules.remember(srule)
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

    async def cancel_stored(self, agent_id: str, reason: str) -> int:
        """The agent's driver starts from its stored state (`core.permissions.StoredDecisions`):
        settle the agent's decisions that are pending in the store but not live here.

        Clustered: this replica now owns the agent (it took it over, or drives it again), so
        such a decision was asked through the previous owner's connection, which is gone. Each
        is resolved `cancelled` by `takeover` with `reason`, through the store's conditional
        resolve (exactly one resolver wins, also against an old owner resolving its own), and
        announced as usual (`decision_resolved`, webhooks). The agent's cached session rules
        are forgotten too, so those the previous owner stored are read.

        Standalone: nothing (0). The decisions a previous prosperod left pending are this
        service's orphans: held for `rejoin_grace` in case the rejoined session asks again for
        the same tool call, else cancelled by `restart` (or at once by `cancel_agent`)."""
        if not self.config.clustered:
            return 0
        self.session_rules.forget_agent(agent_id)
        stored = await self.store.query(state="pending", agent_id=agent_id)
        n = 0
        for d in stored:
            if d.id in self._live:
                continue
            if await self._resolve(d.id, "cancelled", by=BY_TAKEOVER, note=reason) is not None:
                n += 1
        if n:
            log.info(
                "agent %s: %d decision(s) its previous owner left pending cancelled: %s",
                agent_id,
                n,
                reason,
            )
        return n

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
