"""The Ownership seam: which replica writes a stream / drives an agent.

Standalone prosperod owns everything (SelfOwnsAll); the clustered topology backs this with a
PostgreSQL lease table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Lease:
    key: str
    epoch: int


@runtime_checkable
class Ownership(Protocol):
    async def try_acquire(self, key: str) -> Lease | None: ...

    async def release(self, key: str) -> None: ...

    def owns(self, key: str) -> bool: ...


class SelfOwnsAll:
    async def try_acquire(self, key: str) -> Lease | None:
        return Lease(key, 1)

    async def release(self, key: str) -> None:
        return None

    def owns(self, key: str) -> bool:
        return True
