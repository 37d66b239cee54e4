"""Leases: which replica may drive an agent or write a stream, for how long, and under which
fencing token.

A `LeaseAuthority` grants time-limited, exclusive leases on string keys (agent ids,
`repo:<workspace>`). Each grant of a key to a new holder gets an epoch one higher than any epoch
that key ever had: epochs never go back (not after expiry, not after release), so a write stamped
with an epoch can be fenced against the current one. `expires_at` is on the authority's clock
(`now()`): only comparable with that, never with the local clock.

- `MemoryLeases`: in-process (standalone prosperod, tests), on an injectable clock.
- `PgLeases` (`core/store/postgres/leases.py`): a `leases` table on the database clock, shared by
  every replica.

`LeaseKeeper` holds a set of leases for one owner: it renews them every `heartbeat`, reports a
lease lost (the `lost` set and `on_lost`) the moment a renewal is refused or its local deadline
passes without a confirmed renewal, and answers `owns(key)` conservatively from the local
monotonic clock: the deadline of a lease is the local time *before* the request that granted or
renewed it, plus the TTL, so it is never later than the authority's expiry (the authority stamps
its expiry after it received the request) and a replica never thinks it owns a key the authority
may already have given away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class Lease:
    key: str
    owner: str
    # Fencing token: strictly increasing per key, forever.
    epoch: int
    # On the authority's clock (seconds): the lease is live while `authority.now() < expires_at`.
    expires_at: float
    # The TTL it was granted (or last renewed) with; `renew` extends by it again.
    ttl: float


def check_ttl(ttl: float) -> float:
    ttl = float(ttl)
    if not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"a lease TTL must be a positive number of seconds, not {ttl!r}")
    return ttl


@runtime_checkable
class LeaseAuthority(Protocol):
    async def acquire(self, key: str, owner: str, ttl: float) -> Lease | None:
        """Free or expired: taken, with epoch = the key's previous epoch + 1 (1 the first time).
        Live and held by `owner`: renewed for `ttl`, same epoch. Live and held by another
        owner: None. Atomic: of concurrent acquires of a free key exactly one wins."""
        ...

    async def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        """Extend a lease still held by `lease.owner` with `lease.epoch` and not expired, by `ttl`
        (default `lease.ttl`) from now; otherwise None (expired, released, taken over)."""
        ...

    async def renew_many(self, leases: Sequence[Lease]) -> list[Lease | None]:
        """`renew` of each (by its own TTL), in one round trip where the backend allows;
        results in the order given."""
        ...

    async def release(self, lease: Lease) -> bool:
        """Give the lease up if `lease.owner` still holds it with `lease.epoch`, live or expired
        but not taken over yet (then True); otherwise nothing changes (False). The key's epoch
        is kept: the next holder gets epoch + 1."""
        ...

    async def holder(self, key: str) -> Lease | None:
        """The live lease on `key`, if any."""
        ...

    async def holders(self, keys: Sequence[str]) -> dict[str, Lease]:
        """The live lease on each of `keys` that has one (keys without one are left out), in one
        round trip where the backend allows."""
        ...

    async def leases(self) -> list[Lease]:
        """Every live lease, by key."""
        ...

    async def now(self) -> float:
        """The authority's clock, in the units of `Lease.expires_at`."""
        ...


@dataclass
class _Entry:
    owner: str | None  # None once released
    epoch: int
    expires_at: float
    ttl: float

    def live(self, now: float) -> bool:
        return self.owner is not None and now < self.expires_at


class MemoryLeases:
    """An in-process `LeaseAuthority` on `clock` (default: the monotonic clock). Every call is
    atomic (no await inside), so one instance shared by several tasks is the whole authority."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self._keys: dict[str, _Entry] = {}

    def _lease(self, key: str, e: _Entry) -> Lease:
        assert e.owner is not None
        return Lease(key, e.owner, e.epoch, e.expires_at, e.ttl)

    async def acquire(self, key: str, owner: str, ttl: float) -> Lease | None:
        ttl = check_ttl(ttl)
        now = self.clock()
        e = self._keys.get(key)
        if e is None:
            e = self._keys[key] = _Entry(owner, 1, now + ttl, ttl)
        elif e.live(now):
            if e.owner != owner:
                return None
            e.expires_at, e.ttl = now + ttl, ttl
        else:
            e.owner, e.epoch, e.expires_at, e.ttl = owner, e.epoch + 1, now + ttl, ttl
        return self._lease(key, e)

    async def renew(self, lease: Lease, ttl: float | None = None) -> Lease | None:
        ttl = check_ttl(lease.ttl if ttl is None else ttl)
        now = self.clock()
        e = self._keys.get(lease.key)
        if e is None or not e.live(now) or e.owner != lease.owner or e.epoch != lease.epoch:
            return None
        e.expires_at, e.ttl = now + ttl, ttl
        return self._lease(lease.key, e)

    async def renew_many(self, leases: Sequence[Lease]) -> list[Lease | None]:
        return [await self.renew(lease) for lease in leases]

    async def release(self, lease: Lease) -> bool:
        e = self._keys.get(lease.key)
        if e is None or e.owner != lease.owner or e.epoch != lease.epoch:
            return False
        e.owner = None
        e.expires_at = min(e.expires_at, self.clock())
        return True

    async def holder(self, key: str) -> Lease | None:
        e = self._keys.get(key)
        return self._lease(key, e) if e is not None and e.live(self.clock()) else None

    async def holders(self, keys: Sequence[str]) -> dict[str, Lease]:
        now = self.clock()
        out: dict[str, Lease] = {}
        for key in keys:
            e = self._keys.get(key)
            if e is not None and e.live(now):
                out[key] = self._lease(key, e)
        return out

    async def leases(self) -> list[Lease]:
        now = self.clock()
        return [self._lease(k, e) for k, e in sorted(self._keys.items()) if e.live(now)]

    async def now(self) -> float:
        return self.clock()


@dataclass
class _Held:
    lease: Lease
    deadline: float  # local clock


LostCallback = Callable[[Lease], None]


class LeaseKeeper:
    """Keeps `owner`'s leases renewed on `authority`.

    `acquire(key)` takes a lease (or renews ours) and keeps it until `release(key)` or `close()`.
    Every `heartbeat` (default ttl/3; must be < ttl) one `renew_many` renews them all. A lease is
    lost — removed, added to `lost`, `on_lost(lease)` called once — when the authority refuses
    its renewal, or when its local deadline passes first (a renewal failing with an error, or
    not answered in time: the keeper does not wait for it). `owns(key)` is true only for a
    lease held and not past its deadline. A renewal the authority confirms after the keeper gave
    the lease up is released (best effort), so the key frees up at once.

    `clock`/`sleep` are injectable (tests drive a fake clock); `margin` shortens every local
    deadline (e.g. for clock-rate drift between this host and the authority).
    """

    def __init__(
        self,
        authority: LeaseAuthority,
        owner: str,
        *,
        ttl: float,
        heartbeat: float | None = None,
        margin: float = 0.0,
        on_lost: LostCallback | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.authority = authority
        self.owner = owner
        self.ttl = check_ttl(ttl)
        self.heartbeat = self.ttl / 3 if heartbeat is None else float(heartbeat)
        if not 0 < self.heartbeat < self.ttl:
            raise ValueError(f"heartbeat {self.heartbeat!r} must be > 0 and < the TTL {ttl!r}")
        if not 0 <= margin < self.ttl:
            raise ValueError(f"margin {margin!r} must be >= 0 and < the TTL {ttl!r}")
        self.margin = margin
        self.on_lost = on_lost
        self.clock = clock
        self.sleep = sleep
        self.lost: set[str] = set()
        self.rounds = 0  # renewal rounds completed (tests and metrics)
        self.failures = 0  # renewal rounds that raised
        self._held: dict[str, _Held] = {}
        self._task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Future[None]] = set()
        self._closed = False

    # -- queries -------------------------------------------------------------------------

    def owns(self, key: str) -> bool:
        h = self._held.get(key)
        return h is not None and self.clock() < h.deadline

    def lease(self, key: str) -> Lease | None:
        """Our lease on `key` while we own it (its epoch is the fencing token for writes)."""
        h = self._held.get(key)
        return h.lease if h is not None and self.clock() < h.deadline else None

    def held(self) -> list[str]:
        return sorted(k for k in self._held if self.owns(k))

    # -- acquire / release ---------------------------------------------------------------

    async def acquire(self, key: str) -> Lease | None:
        """Take `key` (or confirm ours) and keep it renewed; None if another owner holds it."""
        if self._closed:
            raise RuntimeError("the lease keeper is closed")
        t0 = self.clock()
        lease = await self.authority.acquire(key, self.owner, self.ttl)
        if lease is None:
            return None
        prev = self._held.get(key)
        if prev is not None and prev.lease.epoch != lease.epoch:
            # Ours lapsed and we took it again: the old epoch is gone (writes under it fence).
            self._lose(key, prev)
        self._held[key] = _Held(lease, self._deadline(t0, lease))
        self.lost.discard(key)
        self._ensure_running()
        return lease

    async def release(self, key: str) -> bool:
        h = self._held.pop(key, None)
        if h is None:
            return False
        return await self.authority.release(h.lease)

    async def close(self, *, release: bool = True) -> None:
        """Stop renewing; with `release`, give every held lease up (best effort). Idempotent."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        held, self._held = self._held, {}
        if release:
            for h in held.values():
                try:
                    await self.authority.release(h.lease)
                except Exception as e:
                    log.warning("lease %s: release on close failed: %s", h.lease.key, e)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # -- renewal -------------------------------------------------------------------------

    def _deadline(self, t0: float, lease: Lease) -> float:
        return t0 + lease.ttl - self.margin

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"lease-keeper-{self.owner}")

    async def _run(self) -> None:
        while True:
            await self.sleep(self.heartbeat)
            try:
                await self.renew_now()
            except asyncio.CancelledError:
                raise
            except Exception:  # the authority's errors are handled inside; this is a bug
                log.exception("lease keeper %s: renewal round failed", self.owner)

    async def renew_now(self) -> None:
        """One renewal round (the loop runs one every heartbeat)."""
        try:
            await self._round()
        finally:
            self.rounds += 1

    async def _round(self) -> None:
        self._expire_due()
        batch = dict(self._held)
        if not batch:
            return
        t0 = self.clock()
        call = asyncio.ensure_future(self.authority.renew_many([h.lease for h in batch.values()]))
        try:
            await self._await_answer(call, batch)
        except asyncio.CancelledError:
            call.cancel()
            raise
        if not call.done():
            # Every lease of the batch is gone already; a renewal confirmed late is released
            # once the call ends, in the background.
            call.add_done_callback(self._release_late(list(batch)))
            return
        try:
            results = call.result()
        except Exception as e:
            self.failures += 1
            log.warning("lease keeper %s: renewal failed: %s", self.owner, e)
            self._expire_due()
            return
        late: list[Lease] = []
        for (key, h), got in zip(batch.items(), results, strict=True):
            if self._held.get(key) is not h:
                if got is not None and key not in self._held:
                    late.append(got)  # we gave it up meanwhile: free it
            elif got is None:
                self._lose(key, h)
            else:
                self._held[key] = _Held(got, self._deadline(t0, got))
        self._expire_due()  # an answer slower than the TTL confirms nothing
        for lease in late:
            await self._release_quietly(lease)

    async def _await_answer(
        self, call: asyncio.Future[list[Lease | None]], batch: dict[str, _Held]
    ) -> None:
        """Wait for the renewal, reporting each lease of the batch lost at its deadline
        meanwhile; returns early once none of them is left."""
        while not call.done():
            pending = [h for k, h in batch.items() if self._held.get(k) is h]
            if not pending:
                return
            wait = min(h.deadline for h in pending) - self.clock()
            if wait > 0:
                timer = asyncio.ensure_future(self.sleep(wait))
                try:
                    both: set[asyncio.Future[Any]] = {call, timer}
                    await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    timer.cancel()
            if not call.done():
                self._expire_due()

    def _release_late(
        self, keys: list[str]
    ) -> Callable[[asyncio.Future[list[Lease | None]]], None]:
        def done(call: asyncio.Future[list[Lease | None]]) -> None:
            if call.cancelled() or call.exception() is not None:
                return
            for key, got in zip(keys, call.result(), strict=True):
                if got is not None and key not in self._held:
                    task = asyncio.ensure_future(self._release_quietly(got))
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)

        return done

    async def _release_quietly(self, lease: Lease) -> None:
        try:
            await self.authority.release(lease)
        except Exception as e:
            log.info("lease %s: releasing a late renewal failed: %s", lease.key, e)

    def _expire_due(self) -> None:
        now = self.clock()
        for key, h in list(self._held.items()):
            if now >= h.deadline:
                self._lose(key, h)

    def _lose(self, key: str, h: _Held) -> None:
        if self._held.get(key) is h:
            del self._held[key]
        self.lost.add(key)
        log.warning("lease %s (epoch %d) lost by %s", key, h.lease.epoch, self.owner)
        if self.on_lost is not None:
            try:
                self.on_lost(h.lease)
            except Exception:
                log.exception("lease %s: on_lost callback failed", key)


__all__ = ["Lease", "LeaseAuthority", "LeaseKeeper", "MemoryLeases", "check_ttl"]
