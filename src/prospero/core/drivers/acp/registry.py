"""Single driver (ADR 0011 decision 8): at most one live AcpDriver per agent id per process.

Constructing a second raises `DriverConflict` (`conflict`) until the first is closed,
finishes or is garbage-collected.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from prospero.core.errors import Conflict

if TYPE_CHECKING:
    from prospero.core.drivers.acp.driver import AcpDriver


class DriverConflict(Conflict):
    """A second ACP driver for an agent that already has one in this process."""

    def __init__(
        self, agent_id: str, why: str = "already has an ACP driver in this process"
    ) -> None:
        super().__init__(f"agent '{agent_id}' {why}")
        self.agent_id = agent_id


_REGISTRY: weakref.WeakValueDictionary[str, AcpDriver] = weakref.WeakValueDictionary()


def active_driver(agent_id: str) -> AcpDriver | None:
    """The live (not closed, not finished) ACP driver of an agent in this process, if any."""
    return _REGISTRY.get(agent_id)


def register(driver: AcpDriver) -> None:
    existing = _REGISTRY.get(driver.target.agent_id)
    if existing is not None and existing is not driver:
        raise DriverConflict(driver.target.agent_id)
    _REGISTRY[driver.target.agent_id] = driver


def release(driver: AcpDriver) -> None:
    if _REGISTRY.get(driver.target.agent_id) is driver:
        del _REGISTRY[driver.target.agent_id]
