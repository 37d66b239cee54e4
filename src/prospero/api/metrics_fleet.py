"""Gauges of the fleet computed when `/metrics` is scraped (nothing on the hot path): agents by
workspace, status and drive protocol and workspaces up (from `FleetManager.snapshot()`), and
the drivers running by workspace and protocol.

The FleetManager has no public view of its drivers: `drivers_active` reads its per-agent slots
(`AgentSlot.task`, `.driver.protocol`, `.workspace`) and says nothing rather than failing if
they change shape (tests/api/test_prometheus.py checks the gauge on a real prosperod).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prospero.core import metrics as m
from prospero.core.metrics import Labels, Metrics
from prospero.types.model import Healthy


def install(metrics: Metrics, runtime: Any) -> None:
    """Register the fleet's scrape-time gauges on `metrics` (`runtime.manager` is read at each
    scrape: it is None until the runtime has started)."""
    metrics.gauge_fn(m.AGENTS, lambda: agents(runtime.manager))
    metrics.gauge_fn(m.WORKSPACE_UP, lambda: workspaces_up(runtime.manager))
    metrics.gauge_fn(m.DRIVERS_ACTIVE, lambda: drivers_active(runtime.manager))


def agents(manager: Any) -> Mapping[Labels, float]:
    if manager is None:
        return {}
    out: dict[Labels, float] = {}
    for ws in manager.snapshot().workspaces:
        for a in ws.agents:
            key = (ws.name, str(a.status), a.drive_protocol)
            out[key] = out.get(key, 0) + 1
    return out


def workspaces_up(manager: Any) -> Mapping[Labels, float]:
    if manager is None:
        return {}
    return {
        (w.name,): 1.0 if isinstance(w.health, Healthy) else 0.0
        for w in manager.snapshot().workspaces
    }


def drivers_active(manager: Any) -> Mapping[Labels, float]:
    slots = getattr(manager, "_slots", None)
    if not isinstance(slots, dict):
        return {}
    out: dict[Labels, float] = {}
    for slot in list(slots.values()):
        task = getattr(slot, "task", None)
        if task is None or task.done():
            continue
        protocol = str(getattr(getattr(slot, "driver", None), "protocol", "") or "")
        key = (str(getattr(slot, "workspace", "")), protocol)
        out[key] = out.get(key, 0) + 1
    return out
