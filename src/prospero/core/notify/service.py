"""Notification targets as the API and the CLI manage them: create, list, change, delete,
test, and the delivery log. A target is named by its id or its name."""

from __future__ import annotations

import uuid

from prospero.core.errors import NotFound
from prospero.core.notify.notifier import Notifier
from prospero.core.store.notifications import NotificationStore
from prospero.types.events import now_ts
from prospero.types.notifications import (
    Delivery,
    NotificationTarget,
    TargetCreate,
    TargetPatch,
    TestResult,
)


class TargetNotFound(NotFound):
    def __init__(self, ref: str) -> None:
        super().__init__(f"notification target '{ref}' not found")


class NotificationService:
    def __init__(self, store: NotificationStore, notifier: Notifier) -> None:
        self.store = store
        self.notifier = notifier

    async def create(self, body: TargetCreate) -> NotificationTarget:
        target = NotificationTarget(
            id="nt_" + uuid.uuid4().hex[:12],
            name=body.name,
            url=body.url,
            format=body.format,
            events=sorted(set(body.events)) if body.events is not None else None,
            workspaces=sorted(set(body.workspaces)) if body.workspaces is not None else None,
            enabled=body.enabled,
            created_at=now_ts(),
        )
        await self.store.create_target(target)
        return target

    async def list_all(self) -> list[NotificationTarget]:
        return await self.store.targets()

    async def resolve(self, ref: str) -> NotificationTarget:
        target = await self.store.get_target(ref)
        if target is None:
            target = next((t for t in await self.store.targets() if t.name == ref), None)
        if target is None:
            raise TargetNotFound(ref)
        return target

    async def patch(self, ref: str, patch: TargetPatch) -> NotificationTarget:
        target = await self.resolve(ref)
        changes = {k: getattr(patch, k) for k in patch.model_fields_set}
        for key in ("name", "url", "format", "enabled"):
            if key in changes and changes[key] is None:
                del changes[key]  # these cannot be cleared
        if changes.get("events") is not None:
            changes["events"] = sorted(set(changes["events"]))
        if changes.get("workspaces") is not None:
            changes["workspaces"] = sorted(set(changes["workspaces"]))
        new = target.model_copy(update=changes)
        if not await self.store.update_target(new):
            raise TargetNotFound(ref)
        return new

    async def delete(self, ref: str) -> None:
        target = await self.resolve(ref)
        if not await self.store.delete_target(target.id):
            raise TargetNotFound(ref)

    async def test(self, ref: str) -> TestResult:
        return await self.notifier.test(await self.resolve(ref))

    async def deliveries(self, ref: str | None, limit: int) -> list[Delivery]:
        target_id = (await self.resolve(ref)).id if ref else None
        return await self.store.deliveries(target_id, limit)
