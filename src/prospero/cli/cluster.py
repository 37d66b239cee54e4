"""`prospero cluster`: how prosperod runs (standalone or clustered), its replicas and leases.

One `GET /api/cluster`, read into `prospero.types.cluster.ClusterView`; `-o json|yaml` prints
the API's data as is. Registered on the main app when `prospero.cli.main` imports it.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from prospero.cli.app import (
    AddrOpt,
    OutputOpt,
    TokenOpt,
    _client,
    _console,
    _fmt,
    app,
    handle_errors,
)
from prospero.cli.output import print_data
from prospero.cli.render import Cell, table
from prospero.types.cluster import ClusterView


@app.command("cluster", rich_help_panel="Fleet")
@handle_errors
def cluster(
    ctx: typer.Context, output: OutputOpt = None, addr: AddrOpt = None, token: TokenOpt = None
) -> None:
    """Show the cluster: mode, this replica, the replicas' heartbeats and the live leases."""
    with _client(ctx, addr, token) as c:
        raw, view = c.get_both("/api/cluster", ClusterView)
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data(raw, fmt)
        return
    render_cluster(_console(), view)


def fmt_secs(value: Any) -> str:
    """`0.4s`, `12.0s`, `5m`, `3h` (`-` when absent)."""
    if value is None:
        return "-"
    try:
        secs = max(0.0, float(value))
    except (TypeError, ValueError):
        return "?"
    if secs < 60:
        return f"{secs:.1f}s"
    whole = int(secs)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}"
    return f"{whole}s"  # pragma: no cover


def _bold(text: str, mark: bool) -> Cell:
    return Cell(text, "bold" if mark else "")


def render_cluster(console: Console, view: ClusterView) -> None:
    me = view.replica_id
    head = Text(f"mode: {view.mode}", style="bold")
    head.append(f"  replica: {me}  store: {view.store}", style="")
    if view.lease_ttl_s is not None or view.heartbeat_s is not None:
        head.append(
            f"  lease ttl: {fmt_secs(view.lease_ttl_s)}  heartbeat: {fmt_secs(view.heartbeat_s)}",
            style="",
        )
    console.print(head)
    console.print()
    if view.replicas:
        table(
            console,
            ["REPLICA", "HEARTBEAT AGE", "LEASES"],
            [
                [
                    _bold(r.replica_id + (" (this)" if r.this else ""), r.this),
                    _bold(fmt_secs(r.heartbeat_age_s), r.this),
                    _bold(str(r.leases), r.this),
                ]
                for r in view.replicas
            ],
        )
    else:
        console.print("(no replicas reported)")
    console.print()
    if not view.leases:
        console.print("(no leases)" if view.mode == "clustered" else "(no leases: standalone)")
        return
    table(
        console,
        ["LEASE", "OWNER", "EPOCH", "EXPIRES IN"],
        [
            [
                _bold(x.key, x.owner == me),
                _bold(x.owner, x.owner == me),
                _bold(str(x.epoch), x.owner == me),
                _bold(fmt_secs(x.expires_in_s), x.owner == me),
            ]
            for x in view.leases
        ],
    )
