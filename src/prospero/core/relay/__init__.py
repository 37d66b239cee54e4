"""Calls to the replica that drives an agent: the seam (`base`), an in-process implementation
(`memory`), PostgreSQL's (`postgres`, imported by whoever wires it) and the routing rule
(`routing`)."""

from prospero.core.relay.base import (
    DEFAULT_TIMEOUT,
    RELAY_OPS,
    CommandRelay,
    Handler,
    RelayedCall,
    RelayedError,
    RelayOp,
    RelayOutcome,
    RelayUnanswered,
)
from prospero.core.relay.memory import MemoryRelay, MemoryRelayHub
from prospero.core.relay.routing import NoOwner, OwnerRouting, RelayHandler

__all__ = [
    "DEFAULT_TIMEOUT",
    "RELAY_OPS",
    "CommandRelay",
    "Handler",
    "MemoryRelay",
    "MemoryRelayHub",
    "NoOwner",
    "OwnerRouting",
    "RelayHandler",
    "RelayOp",
    "RelayOutcome",
    "RelayUnanswered",
    "RelayedCall",
    "RelayedError",
]
