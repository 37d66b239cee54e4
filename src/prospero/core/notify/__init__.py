"""Notifications (docs/notifications.md): `render` (which stored events notify, and their
Slack, Discord and JSON payloads: pure), `sender` (one POST with bounded retries), `notifier`
(the fleet-stream reader with its durable cursor, the per-target queues, the delivery log, the
cluster lease)."""

from prospero.core.notify.notifier import Notifier, NotifierConfig

__all__ = ["Notifier", "NotifierConfig"]
