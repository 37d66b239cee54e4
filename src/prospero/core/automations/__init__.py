"""Automations: stored spawn templates fired on a cron schedule, by a signed webhook or by
hand (docs/automations.md). `template.py` (the prompt placeholders), `cron.py` (schedules),
`signing.py` (webhook signatures), `service.py` (CRUD and firing), `scheduler.py` (the
schedule loop under the `automations` lease)."""

from prospero.core.automations.scheduler import Scheduler
from prospero.core.automations.service import AutomationService

__all__ = ["AutomationService", "Scheduler"]
