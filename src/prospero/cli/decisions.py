"""CLI commands for permission decisions and workspace permission policy (ADR 0006).

    prospero decisions [--state S] [--agent ID] [--workspace WS] [--watch] [-o json]
    prospero approve ID [--always] [--note TEXT] [--option OPTION_ID]
    prospero deny ID [--always] [--note TEXT] [--option OPTION_ID]
    prospero policy show WS
    prospero policy set WS [FILE.json] [--rule 'ACTION key=glob ...']... [--append]
                           [--posture P] [--decision-timeout SECS|none]

Registered on the main app when `prospero.cli.main` imports this module. Every command is
one or a few HTTP calls, like the rest of the CLI; replies are read into `prospero.types`
(`Decision`, `WorkspacePolicy`; the option an answer picks is `option_for`'s).
"""

from __future__ import annotations

import json
import shlex
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from prospero.cli import exits, render
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
from prospero.cli.client import Client, CliError, ServerError, fleet_events, seg
from prospero.cli.output import OutputFormat, print_data, print_item
from prospero.cli.params import (
    PostureOpt,
    WorkspaceArg,
    WorkspaceFilterOpt,
    deprecated,
    parse_timeout,
    renamed,
)
from prospero.cli.render_events import FollowRenderer, parse_event
from prospero.types.decisions import Decision, WorkspacePolicy, answer_option
from prospero.types.events import DecisionOption

PANEL = "Decisions"

policy_app = typer.Typer(
    help="Show or set a workspace's permission policy (posture, ask timeout, rules).",
    no_args_is_help=True,
)
app.add_typer(policy_app, name="policy", rich_help_panel=PANEL)

RULE_KEYS = ("kind", "title", "command", "path", "name")
RULE_ACTIONS = ("allow", "deny", "ask")
DECISION_KINDS = ("decision_pending", "decision_resolved")


class StateOpt(StrEnum):
    pending = "pending"
    decided = "decided"
    expired = "expired"
    cancelled = "cancelled"
    all = "all"


# ---------------------------------------------------------------------- decisions


@app.command("decisions", rich_help_panel=PANEL)
@handle_errors
def decisions(
    ctx: typer.Context,
    state: Annotated[
        StateOpt, typer.Option("--state", help="Which decisions (default: pending).")
    ] = StateOpt.pending,
    agent: Annotated[
        str | None, typer.Option("--agent", help="Only this agent's (id or unique prefix).")
    ] = None,
    workspace: WorkspaceFilterOpt = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Only the newest N.")] = None,
    watch: Annotated[
        bool,
        typer.Option("--watch", "-w", help="Keep watching: print decisions as they come and go."),
    ] = False,
    watch_timeout: Annotated[
        float | None,
        typer.Option("--timeout", min=0, help="With --watch: stop after this many seconds."),
    ] = None,
    count: Annotated[
        int | None,
        typer.Option("--count", min=1, help="With --watch: stop after this many decision events."),
    ] = None,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """List permission decisions (pending ones by default); --watch follows them live."""
    fmt = _fmt(ctx, output)
    with _client(ctx, addr, token) as c:
        if agent is not None:
            agent = c.resolve_agent(agent)
        params = {"state": state.value, "agent": agent, "workspace": workspace, "limit": limit}
        resp = c.request("GET", "/api/decisions", params=params)
        raw = resp.json()
        rows = c.parse(raw, list[Decision], "/api/decisions")
        if fmt.machine and not watch:
            print_data(raw, fmt)
            return
        con = _console()
        if fmt.machine:
            for d in raw:
                print_item(d, fmt)
        else:
            render.render_decisions(con, rows, state.value)
        if not watch:
            return
        try:
            last = int(resp.headers.get("X-Prospero-Last-Ordinal", "0"))
        except ValueError:
            last = 0
        if not fmt.machine:
            con.print("— watching for decisions (Ctrl-C to stop) —", style="dim")
        _watch(c, last, agent, workspace, fmt, watch_timeout, count)


def _watch(
    c: Client,
    last: int,
    agent: str | None,
    workspace: str | None,
    fmt: OutputFormat,
    timeout: float | None,
    count: int | None = None,
) -> None:
    """Follow the fleet stream from ordinal `last + 1`, printing decision events."""
    deadline = time.monotonic() + timeout if timeout is not None else None
    printed = 0
    renderer = FollowRenderer(_console())
    for data in fleet_events(c, last, DECISION_KINDS):
        if deadline is not None and time.monotonic() >= deadline:
            return
        if data is None:
            continue
        if agent is not None and data.get("agent_id") != agent:
            continue
        if workspace is not None and data.get("repo") != workspace:
            continue
        if fmt.machine:
            print_item(data, fmt)
        else:
            event = parse_event(data)
            if event is not None:
                renderer.decision_line(event)
        printed += 1
        if count is not None and printed >= count:
            return


def _pick_option(
    decision: Decision, family: str, always: bool, option: str | None
) -> DecisionOption:
    """The option an answer sends: `--option ID` exactly, else `option_for`'s pick of the
    family (`*_once`, or `*_always` with --always), refused when broader or narrower than
    asked (an `*_always` answer without --always, a `*_once` one with it)."""
    listing = ", ".join(f"{o.id} ({o.kind})" for o in decision.options) or "none"
    if option is not None:
        found = decision.option(option)
        if found is None:
            raise CliError(
                f"decision {decision.id} has no option {option!r} (offered: {listing})",
                exits.USAGE,
            )
        return found
    kind = f"{family}_{'always' if always else 'once'}"
    chosen = answer_option(decision.options, family, always)
    if chosen is not None:
        return chosen
    hint = "" if always else f"; --always picks {family}_always"
    raise CliError(
        f"decision {decision.id} offers no {kind} option (offered: {listing}){hint}; "
        "choose one with --option ID",
        exits.USAGE,
    )


def resolve_decision(c: Client, given: str) -> Decision:
    """The decision a whole id names, else the one *pending* decision whose id starts with
    `given` (with or without its `dec-`): not found (exit 3) when none does, a conflict
    (exit 5) listing them when several do."""
    try:
        return c.get_model(f"/api/decisions/{seg(given)}", Decision)
    except ServerError as e:
        if e.status != 404 or not given.strip():
            raise
    pending = c.get_model("/api/decisions", list[Decision], {"state": "pending"})
    want = given.strip().lower()
    hits = [d for d in pending if d.id.startswith(want) or d.id.startswith("dec-" + want)]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise CliError(
            f"no decision {given!r} (nor a pending one whose id starts with it)", exits.NOT_FOUND
        )
    listed = ", ".join(
        f"{d.id} ({d.tool_call.title or d.tool_call.kind or 'tool call'})" for d in hits[:5]
    )
    more = f" and {len(hits) - 5} more" if len(hits) > 5 else ""
    raise CliError(
        f"decision id prefix {given!r} is ambiguous; it matches: {listed}{more}", exits.CONFLICT
    )


def _answer(
    ctx: typer.Context,
    decision_id: str,
    family: str,
    always: bool,
    note: str | None,
    option: str | None,
    output: OutputFormat | None,
    addr: str | None,
    token: str | None,
) -> None:
    with _client(ctx, addr, token) as c:
        current = resolve_decision(c, decision_id)
        decision_id = current.id
        if current.state != "pending":
            by = f" by {current.decided_by}" if current.decided_by else ""
            raise CliError(f"decision {decision_id} is already {current.state}{by}", exits.CONFLICT)
        chosen = _pick_option(current, family, always, option)
        body: dict[str, Any] = {"option_id": chosen.id}
        if note:
            body["note"] = note
        raw = c.request("POST", f"/api/decisions/{seg(decision_id)}", json_body=body).json()
        decided = c.parse(raw, Decision, "a decision")
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data(raw, fmt)
        return
    verb = "approved" if family == "allow" else "denied"
    what = decided.tool_call.title or decided.tool_call.kind or "tool call"
    _console().print(
        f"{verb} {escape(decision_id)} ({escape(chosen.label or chosen.id)}: "
        f"{escape(what)}) as {escape(str(decided.decided_by))}"
    )


AlwaysOpt = Annotated[
    bool,
    typer.Option(
        "--always", help="Pick the *_always option: the answer also covers later identical asks."
    ),
]
NoteOpt = Annotated[
    str | None, typer.Option("--note", help="A note stored with the decision (audit).")
]
OptionOpt = Annotated[
    str | None, typer.Option("--option", help="Answer with exactly this option id.")
]


@app.command("approve", rich_help_panel=PANEL)
@handle_errors
def approve(
    ctx: typer.Context,
    decision_id: Annotated[
        str, typer.Argument(metavar="ID", help="Decision id, or a unique prefix of a pending one.")
    ],
    always: AlwaysOpt = False,
    note: NoteOpt = None,
    option: OptionOpt = None,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Allow a pending permission request (allow_once; --always: allow_always)."""
    _answer(ctx, decision_id, "allow", always, note, option, output, addr, token)


@app.command("deny", rich_help_panel=PANEL)
@handle_errors
def deny(
    ctx: typer.Context,
    decision_id: Annotated[
        str, typer.Argument(metavar="ID", help="Decision id, or a unique prefix of a pending one.")
    ],
    always: AlwaysOpt = False,
    note: NoteOpt = None,
    option: OptionOpt = None,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Reject a pending permission request (reject_once; --always: reject_always)."""
    _answer(ctx, decision_id, "reject", always, note, option, output, addr, token)


# ---------------------------------------------------------------------- policy


def parse_rule(text: str) -> dict[str, Any]:
    """`ACTION key=glob ...` (shell quoting: `deny command="rm -rf *"`) -> a rule object."""
    try:
        parts = shlex.split(text)
    except ValueError as e:
        raise typer.BadParameter(f"{text!r}: {e}", param_hint="--rule") from None
    if not parts or parts[0] not in RULE_ACTIONS:
        raise typer.BadParameter(
            f"{text!r}: a rule starts with {' | '.join(RULE_ACTIONS)}", param_hint="--rule"
        )
    rule: dict[str, Any] = {"action": parts[0]}
    for part in parts[1:]:
        key, sep, value = part.partition("=")
        if not sep or key not in RULE_KEYS:
            raise typer.BadParameter(
                f"{text!r}: expected key=glob with key in {', '.join(RULE_KEYS)}, got {part!r}",
                param_hint="--rule",
            )
        rule[key] = value
    return rule


@policy_app.command("show")
@handle_errors
def policy_show(
    ctx: typer.Context,
    workspace: WorkspaceArg,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show a workspace's permission policy."""
    with _client(ctx, addr, token) as c:
        raw, policy = c.get_both(f"/api/workspaces/{seg(workspace)}/policy", WorkspacePolicy)
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data(raw, fmt)
        return
    render.render_policy(_console(), workspace, policy)


@policy_app.command("set")
@handle_errors
def policy_set(
    ctx: typer.Context,
    workspace: WorkspaceArg,
    file: Annotated[
        Path | None,
        typer.Argument(
            metavar="[FILE.json]",
            help="A whole policy {posture?, timeout_s?, rules} (replaces it) or a JSON list "
            "of rules (replaces the rules only).",
        ),
    ] = None,
    rule: Annotated[
        list[str] | None,
        typer.Option(
            "--rule",
            help="'ACTION key=GLOB ...': ACTION is allow, deny or ask; keys (each optional) "
            "kind, title, command, path, name. Repeatable, in order; replaces the rule list "
            "unless --append.",
        ),
    ] = None,
    append: Annotated[
        bool, typer.Option("--append", help="Add the --rule rules after the existing ones.")
    ] = False,
    posture: Annotated[
        PostureOpt | None, typer.Option("--posture", help="Default posture of new spawns.")
    ] = None,
    decision_timeout: Annotated[
        str | None,
        typer.Option(
            "--decision-timeout",
            help="Seconds a supervised permission ask waits for a human, or 'none'.",
        ),
    ] = None,
    old_timeout: Annotated[str | None, deprecated("--timeout", "--decision-timeout")] = None,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Set a workspace's permission policy from a JSON file and/or flags."""
    timeout = renamed(decision_timeout, old_timeout, "--decision-timeout", "--timeout")
    rules = [parse_rule(r) for r in rule or []]
    if file is None and not rules and posture is None and timeout is None:
        raise CliError(
            "nothing to set: give FILE.json, --rule, --posture or --decision-timeout",
            code=exits.USAGE,
        )
    doc: Any = None
    if file is not None:
        try:
            doc = json.loads(file.read_text())
        except OSError as e:
            raise CliError(f"cannot read {file}: {e.strerror or e}", code=exits.USAGE) from None
        except ValueError as e:
            raise CliError(f"{file} is not valid JSON: {e}", code=exits.USAGE) from None
        if not isinstance(doc, dict | list):
            raise CliError(f"{file}: expected a policy object or a list of rules", code=exits.USAGE)
    path = f"/api/workspaces/{seg(workspace)}/policy"
    with _client(ctx, addr, token) as c:
        result: Any = None
        if isinstance(doc, dict):
            result = c.request("PUT", path, json_body=doc).json()
        patch: dict[str, Any] = {}
        if isinstance(doc, list):
            patch["rules"] = list(doc)
        if rules:
            base: list[Any] = patch.get("rules", [])
            if append and "rules" not in patch:
                current = c.parse(
                    result if result is not None else c.get_json(path), WorkspacePolicy, path
                )
                base = [r.model_dump(exclude_none=True) for r in current.rules]
            patch["rules"] = base + rules
        if posture is not None:
            patch["posture"] = posture.value
        if timeout is not None:
            patch["timeout_s"] = parse_timeout(timeout, "--decision-timeout")
        if patch:
            result = c.request("PATCH", path, json_body=patch).json()
    fmt = _fmt(ctx, output)
    if fmt.machine:
        print_data(result, fmt)
        return
    con = _console()
    con.print(f"updated the permission policy of workspace '{escape(workspace)}'")
    render.render_policy(con, workspace, c.parse(result, WorkspacePolicy, path))
