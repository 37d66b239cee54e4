"""Gauges of the fleet computed when `/metrics` is scraped (nothing on the hot path): agents by
workspace, status and drive protocol and workspaces up (from `FleetManager.snapshot()`), and
the drivers running by workspace and protocol.

The FleetManager has no public view of its drivers: `drivers_active` reads its per-agent slots
(`AgentSlot.task`, `.driver.protocol`, `.workspace`: a driver's task runs from its start to its
end, as `prospero_active_attaches` counts). A gauge whose function fails is left out of that
scrape and logged once (`core.metrics_export`); tests/api/test_prometheus.py checks these gauges
on a real stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from prospero.core import metrics as m
from prospero.core.fleet.manager import FleetManager
from prospero.core.metrics import Labels, Metrics
from prospero.types.model import Healthy


class AppRuntimeLike(Protocol):
    manager: FleetManager | None


def install(metrics: Metrics, runtime: AppRuntimeLike) -> None:
    """Register the fleet's scrape-time gauges on `metrics` (`runtime.manager` is read at each
    scrape: it is None until the runtime has started)."""
    metrics.gauge_fn(m.AGENTS, lambda: agents(runtime.manager))
    metrics.gauge_fn(m.WORKSPACE_UP, lambda: workspaces_up(runtime.manager))
    metrics.gauge_fn(m.DRIVERS_ACTIVE, lambda: drivers_active(runtime.manager))


def agents(manager: FleetManager | None) -> Mapping[Labels, float]:
    if manager is None:
        return {}
    out: dict[Labels, float] = {}
    for ws in manager.snapshot().workspaces:
        for a in ws.agents:
            key = (ws.name, str(a.status), a.drive_protocol)
            out[key] = out.get(key, 0) + 1
    return out


def workspaces_up(manager: FleetManager | None) -> Mapping[Labels, float]:
    if manager is None:
        return {}
    return {
        (w.name,): 1.0 if isinstance(w.health, Healthy) else 0.0
        for w in manager.snapshot().workspaces
    }


def drivers_active(manager: FleetManager | None) -> Mapping[Labels, float]:
    if manager is None:
        return {}
    out: dict[Labels, float] = {}
    for slot in list(manager._slots.values()):
        if slot.task is None or slot.task.done() or slot.driver is None:
            continue
        key = (slot.workspace, slot.driver.protocol)
        out[key] = out.get(key, 0) + 1
    return out
