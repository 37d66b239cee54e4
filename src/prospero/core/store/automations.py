"""The AutomationStore seam (docs/automations.md): automations, their webhook secrets, their
run history and the webhook signatures seen within the replay window. SQLite
(`sqlite.automations`, tables in `events.db`) standalone, PostgreSQL
(`postgres.automations`) shared by the replicas of a cluster.

Two operations must be atomic across replicas:

- `claim_run`: a run is inserted only if no run of the same automation has the same `tick`
  (a unique row). A schedule's tick is its cron minute, so a tick fires once even when two
  replicas both think they hold the scheduler lease at a handover;
- `claim_signature`: a webhook signature is accepted once within the replay window.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from prospero.core.errors import Conflict
from prospero.types.automations import Automation, AutomationRun, RunState

# Runs kept per automation (the oldest beyond it are dropped when a run is claimed).
RUN_HISTORY = 200


class DuplicateName(Conflict):
    def __init__(self, name: str) -> None:
        super().__init__(f"an automation named {name!r} already exists")


@runtime_checkable
class AutomationStore(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def create(self, automation: Automation, secret: str | None) -> None:
        """DuplicateName when the name is taken (ids are fresh)."""
        ...

    async def get(self, automation_id: str) -> Automation | None: ...

    async def by_name(self, name: str) -> Automation | None: ...

    async def all(self) -> list[Automation]:
        """By name."""
        ...

    async def update(self, automation: Automation) -> bool:
        """Replace the stored automation of that id (not its secret nor `last_fired`); False
        when it is gone; DuplicateName when renamed onto another's name."""
        ...

    async def delete(self, automation_id: str) -> bool:
        """The automation, its runs and seen signatures."""
        ...

    async def secret(self, automation_id: str) -> str | None: ...

    async def set_secret(self, automation_id: str, secret: str | None) -> bool:
        """Set (or, None, remove) the webhook secret; `webhook` follows. False when gone."""
        ...

    async def claim_run(self, run: AutomationRun, history: int = RUN_HISTORY) -> bool:
        """Insert `run` unless the automation has a run with the same tick (False then, and
        nothing changes) or is gone (False). Sets the automation's `last_fired` to the run's
        `fired_at` and keeps its newest `history` runs."""
        ...

    async def finish_run(
        self, run_id: str, state: RunState, *, agent_id: str | None, error: str | None
    ) -> None: ...

    async def abandon_runs(self, fired_before: str, error: str) -> int:
        """Every run still `firing` that was fired before `fired_before` (ISO-8601 UTC, the
        format of `fired_at`) becomes `failed` with `error`: its replica died mid-spawn.
        The number changed."""
        ...

    async def get_run(self, run_id: str) -> AutomationRun | None: ...

    async def runs(self, automation_id: str, limit: int = RUN_HISTORY) -> list[AutomationRun]:
        """Newest first."""
        ...

    async def claim_signature(
        self, automation_id: str, signature: str, now: float, window: float
    ) -> bool:
        """True the first time `signature` is seen for the automation within `window` seconds
        before `now` (unix seconds); records it. Entries older than the window are dropped."""
        ...
