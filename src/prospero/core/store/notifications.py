"""The NotificationStore seam (docs/notifications.md): notification targets, the delivery log
and the notifier's cursor in the fleet stream. SQLite (`sqlite/notifications.py`) and
PostgreSQL (`postgres/notifications.py`) implement it; tests/conformance/notification_store.py
runs against both.

`claim` is the deliver-once guard: one row per (target, event ordinal), inserted at most once
whoever asks (two replicas around a lease handover, a restart re-reading events it had read):
only the caller whose insert made the row sends the notification."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from prospero.core.errors import Conflict
from prospero.types.notifications import Delivery, DeliveryState, NotificationTarget

# Delivery log rows kept per target (the oldest pruned past it).
DELIVERY_LOG = 500


class DuplicateTarget(Conflict):
    def __init__(self, name: str) -> None:
        super().__init__(f"a notification target named '{name}' exists")
        self.name = name


@runtime_checkable
class NotificationStore(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def create_target(self, target: NotificationTarget) -> None:
        """Raises DuplicateTarget when the name is taken."""
        ...

    async def get_target(self, target_id: str) -> NotificationTarget | None: ...

    async def targets(self) -> list[NotificationTarget]:
        """By name."""
        ...

    async def update_target(self, target: NotificationTarget) -> bool:
        """False when it is gone; DuplicateTarget when the new name is taken."""
        ...

    async def delete_target(self, target_id: str) -> bool:
        """The target and its delivery log."""
        ...

    async def claim(self, delivery: Delivery, keep: int = DELIVERY_LOG) -> int | None:
        """Store a new `pending` delivery; its id, or None when (target, ordinal) already has
        one (a test message, ordinal None, is always new). Prunes the target's log to `keep`."""
        ...

    async def finish(
        self,
        delivery_id: int,
        state: DeliveryState,
        *,
        attempts: int,
        http_status: int | None,
        error: str | None,
        at: str,
    ) -> None: ...

    async def deliveries(self, target_id: str | None = None, limit: int = 100) -> list[Delivery]:
        """Newest first."""
        ...

    async def pending(self) -> list[Delivery]:
        """Deliveries claimed and never finished (the process stopped mid-send), oldest first."""
        ...

    async def load_cursor(self) -> int | None:
        """The last fleet ordinal the notifier has claimed deliveries for (None: never ran)."""
        ...

    async def save_cursor(self, ordinal: int) -> None: ...
