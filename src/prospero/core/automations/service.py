"""`AutomationService`: create, change and fire automations (docs/automations.md).

Every fire — scheduled, webhook or manual — goes through `fire`: the run is claimed in the
store first (unique per automation and tick), then the prompt template is rendered and the
agent spawned through `FleetManager.spawn`, the same operation `POST
/api/workspaces/{ws}/agents` runs. A refused spawn (unknown workspace, budget reached, ACP
disabled, an invalid rendered prompt) is a `failed` run carrying the error, never an
exception out of the scheduler.
"""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import orjson
from pydantic import ValidationError

from prospero.core.automations import cron
from prospero.core.automations.signing import SignatureRejected, verify
from prospero.core.automations.template import TemplateError, parse, render
from prospero.core.errors import Conflict, InvalidConfig, NotFound, ProsperoError
from prospero.core.fleet.manager import FleetManager
from prospero.core.metrics import Metrics
from prospero.core.store.automations import AutomationStore
from prospero.types.api import SpawnRequest
from prospero.types.automations import (
    Automation,
    AutomationCreate,
    AutomationCreated,
    AutomationPatch,
    AutomationRun,
    Trigger,
)

log = logging.getLogger(__name__)

FIRES = "automation_fires"
FIRE_FAILURES = "automation_fire_failures"
WEBHOOK_REJECTIONS = "automation_webhook_rejections"
REPLAY_WINDOW = 300.0
# A run still `firing` this long after it fired was being spawned by a replica that died
# (a spawn is answered, or refused, within tens of seconds: caliband's start-up and request
# timeouts); the scheduler's pass marks it failed.
STALE_RUN = 600.0
INTERRUPTED = (
    "interrupted: the prosperod firing this run stopped before the spawn was answered "
    "(an agent may have started anyway: see the workspace's agents)"
)
MAX_ERROR = 2000


class AutomationNotFound(NotFound):
    def __init__(self, ref: str) -> None:
        super().__init__(f"no automation {ref!r}")


class AutomationDisabled(Conflict):
    kind = "disabled"

    def __init__(self, name: str) -> None:
        super().__init__(f"automation {name!r} is disabled")


class Replayed(Conflict):
    kind = "replayed"

    def __init__(self) -> None:
        super().__init__("this webhook signature was already used within the replay window")


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat(timespec="microseconds")


def _checked_schedule(expr: str | None) -> str | None:
    if expr is None:
        return None
    try:
        return cron.validate(expr)
    except cron.CronError as e:
        raise InvalidConfig(str(e)) from e


def _checked_template(spawn: SpawnRequest) -> None:
    try:
        parse(spawn.prompt)
    except TemplateError as e:
        raise InvalidConfig(f"spawn.prompt: {e}") from e


class AutomationService:
    def __init__(
        self,
        store: AutomationStore,
        manager: FleetManager,
        metrics: Metrics,
        *,
        replay_window: float = REPLAY_WINDOW,
    ) -> None:
        self.store = store
        self.manager = manager
        self.metrics = metrics
        self.replay_window = replay_window

    # ---- views -------------------------------------------------------------------------

    def view(self, a: Automation, now: datetime | None = None) -> Automation:
        nxt = None
        if a.enabled and a.schedule:
            tick = cron.next_tick(a.schedule, now or datetime.now(UTC))
            nxt = _iso(tick) if tick is not None else None
        return a.model_copy(update={"next_fire": nxt})

    async def find(self, ref: str) -> Automation | None:
        """By id, else by name."""
        return await self.store.get(ref) or await self.store.by_name(ref)

    async def resolve(self, ref: str) -> Automation:
        """By id, else by name; AutomationNotFound when neither."""
        a = await self.find(ref)
        if a is None:
            raise AutomationNotFound(ref)
        return a

    async def list_all(self) -> list[Automation]:
        now = datetime.now(UTC)
        return [self.view(a, now) for a in await self.store.all()]

    async def runs(self, ref: str, limit: int) -> list[AutomationRun]:
        a = await self.resolve(ref)
        return await self.store.runs(a.id, limit)

    # ---- configuration -----------------------------------------------------------------

    def _check_workspace(self, workspace: str) -> None:
        if workspace not in {w.name for w in self.manager.list_workspaces()}:
            raise InvalidConfig(f"unknown workspace {workspace!r}")

    async def create(self, body: AutomationCreate) -> AutomationCreated:
        schedule = _checked_schedule(body.schedule)
        _checked_template(body.spawn)
        self._check_workspace(body.workspace)
        now = _iso(datetime.now(UTC))
        a = Automation(
            id=f"au-{uuid.uuid4().hex[:12]}",
            name=body.name,
            enabled=body.enabled,
            workspace=body.workspace,
            spawn=body.spawn,
            schedule=schedule,
            labels=dict(body.labels),
            created_at=now,
            armed_at=now,
        )
        secret = secrets.token_hex(32) if body.webhook else None
        await self.store.create(a, secret)
        stored = await self.resolve(a.id)
        return AutomationCreated(automation=self.view(stored), secret=secret)

    async def patch(self, ref: str, body: AutomationPatch) -> Automation:
        a = await self.resolve(ref)
        changes: dict[str, Any] = {}
        sent = body.model_fields_set
        if "name" in sent and body.name is not None:
            changes["name"] = body.name
        if "workspace" in sent and body.workspace is not None:
            self._check_workspace(body.workspace)
            changes["workspace"] = body.workspace
        if "spawn" in sent and body.spawn is not None:
            _checked_template(body.spawn)
            changes["spawn"] = body.spawn
        if "schedule" in sent:
            schedule = _checked_schedule(body.schedule)
            if schedule != a.schedule:
                changes["schedule"] = schedule
                changes["armed_at"] = _iso(datetime.now(UTC))
        if "labels" in sent and body.labels is not None:
            changes["labels"] = dict(body.labels)
        return await self._update(a, changes)

    async def _update(self, a: Automation, changes: dict[str, Any]) -> Automation:
        if changes:
            updated = a.model_copy(update=changes)
            if not await self.store.update(updated):
                raise AutomationNotFound(a.id)
        return self.view(await self.resolve(a.id))

    async def set_enabled(self, ref: str, enabled: bool) -> Automation:
        a = await self.resolve(ref)
        changes: dict[str, Any] = {}
        if a.enabled != enabled:
            changes["enabled"] = enabled
            if enabled:  # the ticks it was off for are not replayed
                changes["armed_at"] = _iso(datetime.now(UTC))
        return await self._update(a, changes)

    async def delete(self, ref: str) -> None:
        a = await self.resolve(ref)
        if not await self.store.delete(a.id):
            raise AutomationNotFound(ref)

    async def rotate_secret(self, ref: str) -> AutomationCreated:
        a = await self.resolve(ref)
        secret = secrets.token_hex(32)
        if not await self.store.set_secret(a.id, secret):
            raise AutomationNotFound(ref)
        return AutomationCreated(automation=self.view(await self.resolve(a.id)), secret=secret)

    # ---- firing ------------------------------------------------------------------------

    async def run_now(self, ref: str) -> AutomationRun:
        a = await self.resolve(ref)
        if not a.enabled:
            raise AutomationDisabled(a.name)
        run = await self.fire(a, "manual")
        assert run is not None  # a manual tick is its fresh run id
        return run

    async def webhook(
        self,
        ref: str,
        body: bytes,
        signature: str | None,
        timestamp: str | None,
        now: float | None = None,
    ) -> AutomationRun:
        """Verify, then fire. SignatureRejected (401; also for an unknown automation or one
        without a webhook), AutomationDisabled / Replayed (409),
        InvalidConfig for a body that is not a JSON object (400); nothing fires on any."""
        now = time.time() if now is None else now
        try:
            a = await self.find(ref)
            secret = await self.store.secret(a.id) if a is not None else None
            if a is None or secret is None:
                # The route is open: an unknown automation, or one without a webhook, is
                # refused exactly as a forged signature is (checked against a throwaway
                # secret), so that a caller without a secret learns no automation's name.
                _unknown(body, signature, timestamp, now, self.replay_window)
            digest = verify(secret, body, signature, timestamp, now=now, window=self.replay_window)
            if not a.enabled:
                raise AutomationDisabled(a.name)
            payload = _payload(body)
            if not await self.store.claim_signature(a.id, digest, now, self.replay_window):
                raise Replayed()
        except ProsperoError as e:
            reason = getattr(e, "reason", None) or e.kind
            self.metrics.inc(WEBHOOK_REJECTIONS, labels=(reason,))
            raise
        run = await self.fire(a, "webhook", payload=payload)
        if run is None:  # deleted meanwhile
            raise AutomationNotFound(ref)
        return run

    async def abandon_stale(self, now: datetime | None = None) -> int:
        """Fail the runs left `firing` by a replica that died mid-spawn (STALE_RUN)."""
        cut = _iso((now or datetime.now(UTC)) - timedelta(seconds=STALE_RUN))
        n = await self.store.abandon_runs(cut, INTERRUPTED)
        if n:
            log.warning("automations: %d run(s) interrupted mid-spawn marked failed", n)
        return n

    async def fire(
        self,
        a: Automation,
        trigger: Trigger,
        *,
        payload: dict[str, Any] | None = None,
        tick: str | None = None,
        now: datetime | None = None,
    ) -> AutomationRun | None:
        """Claim the run (None when this tick already fired, or the automation is gone), then
        spawn; the run ends `spawned` with the agent id or `failed` with the error."""
        at = now or datetime.now(UTC)
        run_id = f"run-{uuid.uuid4().hex[:16]}"
        run = AutomationRun(
            id=run_id,
            automation_id=a.id,
            trigger=trigger,
            tick=tick or run_id,
            fired_at=_iso(at),
        )
        if not await self.store.claim_run(run):
            return None
        self.metrics.inc(FIRES, labels=(trigger,))
        context = {
            "trigger": trigger,
            "now": _iso(at),
            "run": {"id": run_id},
            "automation": {"id": a.id, "name": a.name, "workspace": a.workspace},
            "payload": payload or {},
        }
        agent_id: str | None = None
        error: str | None = None
        try:
            prompt = render(parse(a.spawn.prompt), context)
            data = a.spawn.model_dump(exclude_none=True)
            data.update(prompt=prompt, label=a.spawn.label or a.name)
            req = SpawnRequest.model_validate(data)
            agent_id = (await self.manager.spawn(a.workspace, req)).agent_id
        except ValidationError as e:
            error = "the rendered spawn request is invalid: " + "; ".join(
                f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()[:5]
            )
        except (ProsperoError, TemplateError) as e:
            error = f"{getattr(e, 'kind', 'invalid_config')}: {e}"
        except Exception as e:  # a bug: recorded, logged, never a crashed scheduler
            log.exception("automation %s: spawn failed", a.name)
            error = f"internal: {e}"
        done = run.model_copy(
            update={
                "state": "spawned" if agent_id else "failed",
                "agent_id": agent_id,
                "error": error[:MAX_ERROR] if error else None,
            }
        )
        if error:
            self.metrics.inc(FIRE_FAILURES, labels=(trigger,))
            log.warning("automation %s (%s): spawn refused: %s", a.name, trigger, error)
        await self.store.finish_run(run_id, done.state, agent_id=done.agent_id, error=done.error)
        return done


def _unknown(
    body: bytes, signature: str | None, timestamp: str | None, now: float, window: float
) -> NoReturn:
    try:
        verify(secrets.token_hex(32), body, signature, timestamp, now=now, window=window)
    except SignatureRejected as e:
        if e.reason == "forged":
            e.reason = "unknown"  # the metric's label; the answer is the forged one
        raise
    raise SignatureRejected("unknown", "webhook signature does not match")  # a 2^-256 match


def _payload(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise InvalidConfig(f"the webhook body is not JSON: {e}") from e
    if not isinstance(value, dict):
        raise InvalidConfig("the webhook body must be a JSON object (or empty)")
    return value
