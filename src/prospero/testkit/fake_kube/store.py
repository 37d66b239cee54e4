"""Objects, one global resourceVersion, the watch event log and its compaction.

Like etcd behind kube-apiserver: every write takes the next revision (a decimal string on the
wire), and the event log keeps the last `max_events` changes. A watch or an exact list at a
revision older than what the log still holds is answered 410 `Expired` ("too old resource
version: N (H)", H the compaction horizon). `compact()` is the test hook that forgets history
at once. Lists at an exact older revision (`resourceVersionMatch=Exact`, continue tokens) are
served by undoing the logged changes newer than it.

Everything runs on one asyncio loop and no method awaits, so each write is atomic with
respect to watchers: a watcher registers and reads its backlog in one step.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prospero.testkit.fake_kube.errors import too_old

RKey = tuple[str, str]  # (group, plural)
OKey = tuple[RKey, str, str]  # (resource, namespace, name)


@dataclass(frozen=True)
class Event:
    rv: int
    rkey: RKey
    namespace: str
    name: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]
    prev: dict[str, Any] | None


@dataclass(eq=False)
class Watcher:
    rkey: RKey
    namespace: str | None
    # an Event; an int: a bookmark at that revision (test hook); None: the stream is cut
    queue: asyncio.Queue[Event | int | None] = field(default_factory=asyncio.Queue)

    def wants(self, ev: Event) -> bool:
        return ev.rkey == self.rkey and (self.namespace is None or ev.namespace == self.namespace)


class Store:
    def __init__(self, *, max_events: int = 10_000, first_rv: int = 1000) -> None:
        self.rv = first_rv
        self.horizon = first_rv  # events with rv > horizon are in the log
        self.max_events = max_events
        self.objects: dict[OKey, dict[str, Any]] = {}
        self.log: deque[Event] = deque()
        self.watchers: set[Watcher] = set()

    # reads ---------------------------------------------------------------------------------

    def get(self, rkey: RKey, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((rkey, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def items(self, rkey: RKey, namespace: str | None) -> list[dict[str, Any]]:
        """Current objects, in etcd key order (namespace, name)."""
        keys = sorted(
            k for k in self.objects if k[0] == rkey and (namespace is None or k[1] == namespace)
        )
        return [copy.deepcopy(self.objects[k]) for k in keys]

    def snapshot(self, rkey: RKey, namespace: str | None, rv: int) -> list[dict[str, Any]]:
        """The objects as they were at revision `rv` (410 if the log no longer reaches it)."""
        if rv < self.horizon:
            raise too_old(rv, self.horizon)
        state = {
            k: v for k, v in self.objects.items()
            if k[0] == rkey and (namespace is None or k[1] == namespace)
        }
        for ev in reversed(self.log):
            if ev.rv <= rv:
                break
            if ev.rkey != rkey or (namespace is not None and ev.namespace != namespace):
                continue
            k = (ev.rkey, ev.namespace, ev.name)
            if ev.type == "ADDED":
                state.pop(k, None)
            elif ev.prev is not None:
                state[k] = ev.prev
        return [copy.deepcopy(state[k]) for k in sorted(state)]

    # writes --------------------------------------------------------------------------------

    def next_rv(self) -> int:
        return self.rv + 1

    def put(self, rkey: RKey, obj: dict[str, Any], event: str) -> dict[str, Any]:
        """Store `obj` (ADDED or MODIFIED) at the next revision; returns the stored copy."""
        meta = obj["metadata"]
        key = (rkey, meta.get("namespace", ""), meta["name"])
        prev = self.objects.get(key)
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        stored = copy.deepcopy(obj)
        self.objects[key] = stored
        self._emit(Event(self.rv, rkey, key[1], key[2], event, stored, prev))
        return copy.deepcopy(stored)

    def remove(self, rkey: RKey, namespace: str, name: str) -> dict[str, Any] | None:
        """Delete; the DELETED event carries the last state at the deletion's revision. Returns
        the object as it was (its last resourceVersion), or None if absent."""
        key = (rkey, namespace, name)
        prev = self.objects.pop(key, None)
        if prev is None:
            return None
        self.rv += 1
        gone = copy.deepcopy(prev)
        gone["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(Event(self.rv, rkey, namespace, name, "DELETED", gone, prev))
        return copy.deepcopy(prev)

    def _emit(self, ev: Event) -> None:
        self.log.append(ev)
        while len(self.log) > self.max_events:
            self.horizon = self.log.popleft().rv
        for w in list(self.watchers):
            if w.wants(ev):
                w.queue.put_nowait(ev)

    def compact(self, rv: int | None = None) -> int:
        """Forget the history up to `rv` (default: all of it); returns the new horizon."""
        target = self.rv if rv is None else min(rv, self.rv)
        while self.log and self.log[0].rv <= target:
            self.log.popleft()
        self.horizon = max(self.horizon, target)
        return self.horizon

    # watches -------------------------------------------------------------------------------

    def subscribe(self, rkey: RKey, namespace: str | None, since: int | None) -> tuple[list[Event], Watcher]:
        """Register a watcher; with `since`, also the logged events after it (410 if too old).
        Without, the caller sends the current state itself."""
        if since is not None and since < self.horizon:
            raise too_old(since, self.horizon)
        w = Watcher(rkey, namespace)
        backlog = [] if since is None else [ev for ev in self.log if ev.rv > since and w.wants(ev)]
        self.watchers.add(w)
        return backlog, w

    def unsubscribe(self, w: Watcher) -> None:
        self.watchers.discard(w)

    def close_watchers(self) -> None:
        """End every open watch stream (as when an apiserver restarts or drops a slow
        watcher); clients re-watch from the last revision they saw."""
        for w in list(self.watchers):
            w.queue.put_nowait(None)
        self.watchers.clear()

    def bookmark_all(self) -> None:
        """Queue a bookmark at the current revision on every watch (those that asked for
        bookmarks send it; it follows every event already queued)."""
        for w in list(self.watchers):
            w.queue.put_nowait(self.rv)
