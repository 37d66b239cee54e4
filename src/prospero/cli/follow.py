"""`prospero follow` (live, resumable, `--exit-status`) and `prospero logs` (the stored
history, without following unless -f). The watch itself is `cli.watching`'s."""

from __future__ import annotations

from typing import Annotated, Any

import typer

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
from prospero.cli.client import seg
from prospero.cli.output import print_item
from prospero.cli.params import AgentIdArg
from prospero.cli.render_events import FollowRenderer
from prospero.cli.watching import ExitStatusOpt, RunWatch, exit_for, watch_agent

# Events per `GET /api/agents/{id}/events` page of `logs`.
LOGS_PAGE = 2000

FromOpt = Annotated[
    int, typer.Option("--from", min=0, help="Start at this event seq (0 = from the start).")
]


@app.command("follow", rich_help_panel="Agents")
@handle_errors
def follow(
    ctx: typer.Context,
    agent_id: AgentIdArg,
    from_seq: FromOpt = 0,
    exit_status: ExitStatusOpt = False,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Follow an agent's events live until it finishes (resumes across disconnects)."""
    with _client(ctx, addr, token) as c:
        full = c.resolve_agent(agent_id)
        watch = watch_agent(c, full, from_seq, _fmt(ctx, output))
        if exit_status:
            exit_for(watch, c, full)


@app.command("logs", rich_help_panel="Agents")
@handle_errors
def logs(
    ctx: typer.Context,
    agent_id: AgentIdArg,
    from_seq: FromOpt = 0,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="At most this many events.")
    ] = None,
    follow_on: Annotated[
        bool, typer.Option("--follow", "-f", help="Then keep following, as `follow` does.")
    ] = False,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print an agent's stored history (its events so far) and exit; -f keeps following."""
    fmt = _fmt(ctx, output)
    renderer = None if fmt.machine else FollowRenderer(_console())
    with _client(ctx, addr, token) as c:
        full = c.resolve_agent(agent_id)
        path = f"/api/agents/{seg(full)}/events"
        nxt, shown = from_seq, 0
        seen = RunWatch()
        try:
            while limit is None or shown < limit:
                page = LOGS_PAGE if limit is None else min(LOGS_PAGE, limit - shown)
                rows = c.get_model(path, list[dict[str, Any]], {"from": nxt, "limit": page})
                for data in rows:
                    seen.observe(data)
                    if renderer is None:
                        print_item(data, fmt)
                    else:
                        renderer.raw(data)
                    seq = data.get("seq")
                    nxt = seq + 1 if isinstance(seq, int) else nxt
                shown += len(rows)
                if len(rows) < page:
                    break
        finally:
            if renderer is not None:
                renderer.finish()
        if follow_on and not seen.ended:  # a finished run's stream has nothing more
            watch_agent(c, full, nxt, fmt)
