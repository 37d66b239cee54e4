"""Automations (docs/automations.md): stored spawn templates fired by a cron schedule, a
signed webhook or by hand, and the history of their runs.

An automation's `spawn` is the REST spawn body itself (`SpawnRequest`), its `prompt` being the
template (placeholders `{{...}}`, core/automations/template.py) rendered at each fire.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from prospero.types.api import SpawnRequest

AUTOMATION_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
LABEL_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]*$"

Trigger = Literal["schedule", "webhook", "manual"]
RunState = Literal["firing", "spawned", "failed"]
LabelKey = Annotated[
    str, StringConstraints(min_length=1, max_length=100, pattern=LABEL_KEY_PATTERN)
]
LabelValue = Annotated[str, StringConstraints(max_length=200, pattern=r"^[^\x00-\x1f]*$")]
Labels = dict[LabelKey, LabelValue]


class Automation(BaseModel):
    """An automation as stored and shown (never its webhook secret)."""

    id: str
    name: str
    enabled: bool = True
    workspace: str
    spawn: SpawnRequest
    # 5-field cron, UTC; None: no schedule.
    schedule: str | None = None
    # A webhook trigger is configured (its secret was shown once, at creation or rotation).
    webhook: bool = False
    labels: dict[str, str] = Field(default_factory=dict)
    created_at: str
    # Ticks of the schedule before this instant are never fired (set at creation, at enable
    # and when the schedule changes): no replay of the ticks an automation was off for.
    armed_at: str
    last_fired: str | None = None
    # The next scheduled fire (UTC), computed for the view; None without a schedule or disabled.
    next_fire: str | None = None


class AutomationCreate(BaseModel):
    """`POST /api/automations`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, pattern=AUTOMATION_NAME_PATTERN)
    workspace: str = Field(min_length=1, max_length=100)
    spawn: SpawnRequest
    schedule: str | None = Field(default=None, max_length=200)
    webhook: bool = False
    enabled: bool = True
    labels: Labels = Field(default_factory=dict, max_length=50)


class AutomationPatch(BaseModel):
    """`PATCH /api/automations/{id}`: only the fields sent change (`schedule: null` removes
    the schedule; `spawn` replaces the whole template)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(
        default=None, min_length=1, max_length=100, pattern=AUTOMATION_NAME_PATTERN
    )
    workspace: str | None = Field(default=None, min_length=1, max_length=100)
    spawn: SpawnRequest | None = None
    schedule: str | None = Field(default=None, max_length=200)
    labels: Labels | None = Field(default=None, max_length=50)


class AutomationCreated(BaseModel):
    """The answer to a create or a secret rotation: the automation and, when it has a webhook
    trigger, its secret — shown this once, never again."""

    automation: Automation
    secret: str | None = None


class AutomationRun(BaseModel):
    """One fire of an automation: the agent it spawned, or why the spawn was refused."""

    id: str
    automation_id: str
    trigger: Trigger
    # Schedule runs: the cron tick fired (unique per automation); otherwise the run id.
    tick: str
    fired_at: str
    state: RunState = "firing"
    agent_id: str | None = None
    error: str | None = None
