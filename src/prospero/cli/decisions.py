"""CLI commands for permission decisions and workspace permission policy (ADR 0006).

    prospero decisions [--state S] [--agent ID] [--workspace WS] [--watch] [-o json]
    prospero approve ID [--always] [--note TEXT] [--option OPTION_ID]
    prospero deny ID [--always] [--note TEXT] [--option OPTION_ID]
    prospero policy show WS
    prospero policy set WS [FILE.json] [--rule 'ACTION key=glob ...']... [--append]
                           [--posture P] [--timeout SECS|none]

Registered on the main app by `prospero.cli.main` (imported at its end). Every command is
one or a few HTTP calls, like the rest of the CLI.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.markup import escape

from prospero.cli import render
from prospero.cli.app import (
    AddrOpt,
    OutputFormat,
    OutputOpt,
    PostureOpt,
    TokenOpt,
    _client,
    _console,
    _fmt,
    _print_json,
    app,
    handle_errors,
)
from prospero.cli.client import Client, CliError, error_from_response, iter_sse, seg

policy_app = typer.Typer(
    help="Show or set a workspace's permission policy (posture, ask timeout, rules).",
    no_args_is_help=True,
)
app.add_typer(policy_app, name="policy")

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


@app.command("decisions")
@handle_errors
def decisions(
    ctx: typer.Context,
    state: Annotated[
        StateOpt, typer.Option("--state", help="Which decisions (default: pending).")
    ] = StateOpt.pending,
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent's.")] = None,
    workspace: Annotated[
        str | None, typer.Option("--workspace", help="Only this workspace's.")
    ] = None,
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
    as_json = _fmt(ctx, output) is OutputFormat.json
    params = {"state": state.value, "agent": agent, "workspace": workspace, "limit": limit}
    with _client(ctx, addr, token) as c:
        resp = c.request("GET", "/api/decisions", params=params)
        rows = resp.json()
        if not isinstance(rows, list):
            raise CliError(f"prosperod at {c.addr} returned an unexpected decisions list")
        if as_json and not watch:
            _print_json(rows)
            return
        con = _console()
        if as_json:
            for d in rows:
                sys.stdout.write(json.dumps(d, ensure_ascii=False) + "\n")
            sys.stdout.flush()
        else:
            render.render_decisions(con, rows, state.value)
        if not watch:
            return
        try:
            last = int(resp.headers.get("X-Prospero-Last-Ordinal", "0"))
        except ValueError:
            last = 0
        if not as_json:
            con.print("— watching for decisions (Ctrl-C to stop) —", style="dim")
        _watch(c, last, agent, workspace, as_json, watch_timeout, count)


def _watch(
    c: Client,
    last: int,
    agent: str | None,
    workspace: str | None,
    as_json: bool,
    timeout: float | None,
    count: int | None = None,
) -> None:
    """Follow the fleet stream from ordinal `last + 1`, printing decision events."""
    deadline = time.monotonic() + timeout if timeout is not None else None
    printed = 0
    renderer = render.FollowRenderer(_console())
    failures = 0
    while deadline is None or time.monotonic() < deadline:
        try:
            with c.stream_lines(
                "/api/stream", {"from": last + 1, "kinds": ",".join(sorted(DECISION_KINDS))}, None
            ) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise error_from_response(resp)
                failures = 0
                for msg in iter_sse(resp.iter_lines()):
                    if deadline is not None and time.monotonic() >= deadline:
                        return
                    if msg is None or msg.event not in ("message", ""):
                        continue
                    if msg.id is not None and msg.id.isdigit():
                        last = int(msg.id)
                    try:
                        ev = json.loads(msg.data)
                    except ValueError:
                        continue
                    if not isinstance(ev, dict):
                        continue
                    kind = (ev.get("kind") or {}).get("kind")
                    if kind not in DECISION_KINDS:
                        continue
                    if agent is not None and ev.get("agent_id") != agent:
                        continue
                    if workspace is not None and ev.get("repo") != workspace:
                        continue
                    if as_json:
                        sys.stdout.write(json.dumps(ev, ensure_ascii=False) + "\n")
                        sys.stdout.flush()
                    else:
                        renderer.decision_line(ev)
                    printed += 1
                    if count is not None and printed >= count:
                        return
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            failures += 1
            if failures > 5:
                raise c.unreachable(e) from None
        except (httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError):
            failures += 1
        time.sleep(min(2.0, 0.1 * 2**failures))


def _pick_option(decision: dict[str, Any], family: str, always: bool, option: str | None) -> Any:
    options = [o for o in decision.get("options") or [] if isinstance(o, dict)]
    listing = ", ".join(f"{o.get('id')} ({o.get('kind')})" for o in options) or "none"
    if option is not None:
        for o in options:
            if o.get("id") == option:
                return o
        raise CliError(
            f"decision {decision.get('id')} has no option {option!r} (offered: {listing})"
        )
    kind = f"{family}_{'always' if always else 'once'}"
    for o in options:
        if o.get("kind") == kind:
            return o
    hint = "" if always else f"; --always picks {family}_always"
    raise CliError(
        f"decision {decision.get('id')} offers no {kind} option (offered: {listing}){hint}; "
        "choose one with --option ID"
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
        current = c.get_json(f"/api/decisions/{seg(decision_id)}")
        if not isinstance(current, dict):
            raise CliError(f"prosperod at {c.addr} returned an unexpected decision")
        if current.get("state") != "pending":
            by = f" by {current.get('decided_by')}" if current.get("decided_by") else ""
            raise CliError(f"decision {decision_id} is already {current.get('state')}{by}")
        chosen = _pick_option(current, family, always, option)
        body: dict[str, Any] = {"option_id": chosen.get("id")}
        if note:
            body["note"] = note
        decided = c.request("POST", f"/api/decisions/{seg(decision_id)}", json_body=body).json()
    if _fmt(ctx, output) is OutputFormat.json:
        _print_json(decided)
        return
    verb = "approved" if family == "allow" else "denied"
    tc = decided.get("tool_call") or {}
    what = tc.get("title") or tc.get("kind") or "tool call"
    _console().print(
        f"{verb} {escape(decision_id)} ({escape(str(chosen.get('label') or chosen.get('id')))}: "
        f"{escape(str(what))}) as {escape(str(decided.get('decided_by')))}"
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


@app.command("approve")
@handle_errors
def approve(
    ctx: typer.Context,
    decision_id: Annotated[str, typer.Argument(metavar="ID", help="Decision id.")],
    always: AlwaysOpt = False,
    note: NoteOpt = None,
    option: OptionOpt = None,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Allow a pending permission request (allow_once; --always: allow_always)."""
    _answer(ctx, decision_id, "allow", always, note, option, output, addr, token)


@app.command("deny")
@handle_errors
def deny(
    ctx: typer.Context,
    decision_id: Annotated[str, typer.Argument(metavar="ID", help="Decision id.")],
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


def parse_timeout(value: str) -> float | None:
    if value.strip().lower() in ("none", "never", "0", ""):
        return None
    try:
        secs = float(value)
    except ValueError:
        raise typer.BadParameter(
            f"expected seconds or 'none', got {value!r}", param_hint="--timeout"
        ) from None
    if secs < 0:
        raise typer.BadParameter("must be >= 0", param_hint="--timeout")
    return secs


@policy_app.command("show")
@handle_errors
def policy_show(
    ctx: typer.Context,
    workspace: Annotated[str, typer.Argument(metavar="WS", help="Workspace name.")],
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show a workspace's permission policy."""
    with _client(ctx, addr, token) as c:
        policy = c.get_json(f"/api/workspaces/{seg(workspace)}/policy")
    if _fmt(ctx, output) is OutputFormat.json:
        _print_json(policy)
        return
    render.render_policy(_console(), workspace, policy)


@policy_app.command("set")
@handle_errors
def policy_set(
    ctx: typer.Context,
    workspace: Annotated[str, typer.Argument(metavar="WS", help="Workspace name.")],
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
    timeout: Annotated[
        str | None,
        typer.Option("--timeout", help="Seconds a supervised ask waits, or 'none'."),
    ] = None,
    output: OutputOpt = None,
    addr: AddrOpt = None,
    token: TokenOpt = None,
) -> None:
    """Set a workspace's permission policy from a JSON file and/or flags."""
    rules = [parse_rule(r) for r in rule or []]
    if file is None and not rules and posture is None and timeout is None:
        raise CliError("nothing to set: give FILE.json, --rule, --posture or --timeout", code=2)
    doc: Any = None
    if file is not None:
        try:
            doc = json.loads(file.read_text())
        except OSError as e:
            raise CliError(f"cannot read {file}: {e.strerror or e}", code=2) from None
        except ValueError as e:
            raise CliError(f"{file} is not valid JSON: {e}", code=2) from None
        if not isinstance(doc, dict | list):
            raise CliError(f"{file}: expected a policy object or a list of rules", code=2)
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
                current = result if result is not None else c.get_json(path)
                base = list((current or {}).get("rules") or [])
            patch["rules"] = base + rules
        if posture is not None:
            patch["posture"] = posture.value
        if timeout is not None:
            patch["timeout_s"] = parse_timeout(timeout)
        if patch:
            result = c.request("PATCH", path, json_body=patch).json()
    if _fmt(ctx, output) is OutputFormat.json:
        _print_json(result)
        return
    con = _console()
    con.print(f"updated the permission policy of workspace '{escape(workspace)}'")
    render.render_policy(con, workspace, result)
