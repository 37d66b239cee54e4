"""The live event bus: the seam (`base`) and its implementations (`memory`, `postgres`)."""

from prospero.core.bus.base import Bus, BusItem, BusSubscription, Lagged, event_json
from prospero.core.bus.memory import InProcessBus, InProcessSubscription

__all__ = [
    "Bus",
    "BusItem",
    "BusSubscription",
    "InProcessBus",
    "InProcessSubscription",
    "Lagged",
    "event_json",
]
