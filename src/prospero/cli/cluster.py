"""`prospero cluster`: how prosperod runs (standalone or clustered), its replicas and leases.

One `GET /api/cluster`; `-o json` prints the API's JSON as is. Registered on the main app by
`prospero.cli.main`.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from prospero.cli.app import (
    AddrOpt,
    OutputFormat,
    OutputOpt,
    TokenOpt,
    _client,
    _console,
    _fmt,
    _print_json,
    app,
    handle_errors,
)


@app.command("cluster")
@handle_errors
def cluster(
    ctx: typer.Context, output: OutputOpt = None, addr: AddrOpt = None, token: TokenOpt = None
) -> None:
    """Show the cluster: mode, this replica, the replicas' heartbeats and the live leases."""
    with _client(ctx, addr, token) as c:
        view = c.get_json("/api/cluster")
    if _fmt(ctx, output) is OutputFormat.json:
        _print_json(view)
        return
    render_cluster(_console(), view if isinstance(view, dict) else {})


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


def _table(console: Console, header: list[str], rows: list[list[str]], marks: list[bool]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    console.print(
        Text(
            "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(),
            style="bold",
        )
    )
    for row, mark in zip(rows, marks, strict=True):
        line = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        console.print(Text(line, style="bold" if mark else ""))


def render_cluster(console: Console, view: dict[str, Any]) -> None:
    mode = str(view.get("mode", "?"))
    me = str(view.get("replica_id", "?"))
    head = Text(f"mode: {mode}", style="bold")
    head.append(f"  replica: {me}  store: {view.get('store', '?')}", style="")
    if view.get("lease_ttl_s") is not None or view.get("heartbeat_s") is not None:
        head.append(
            f"  lease ttl: {fmt_secs(view.get('lease_ttl_s'))}"
            f"  heartbeat: {fmt_secs(view.get('heartbeat_s'))}",
            style="",
        )
    console.print(head)
    console.print()
    replicas = [r for r in view.get("replicas") or [] if isinstance(r, dict)]
    if replicas:
        _table(
            console,
            ["REPLICA", "HEARTBEAT AGE", "LEASES"],
            [
                [
                    str(r.get("replica_id", "?")) + (" (this)" if r.get("this") else ""),
                    fmt_secs(r.get("heartbeat_age_s")),
                    str(r.get("leases", 0)),
                ]
                for r in replicas
            ],
            [bool(r.get("this")) for r in replicas],
        )
    else:
        console.print("(no replicas reported)")
    console.print()
    leases = [x for x in view.get("leases") or [] if isinstance(x, dict)]
    if not leases:
        console.print("(no leases)" if mode == "clustered" else "(no leases: standalone)")
        return
    _table(
        console,
        ["LEASE", "OWNER", "EPOCH", "EXPIRES IN"],
        [
            [
                str(x.get("key", "?")),
                str(x.get("owner", "?")),
                str(x.get("epoch", "?")),
                fmt_secs(x.get("expires_in_s")),
            ]
            for x in leases
        ],
        [x.get("owner") == me for x in leases],
    )
