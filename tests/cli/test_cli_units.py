"""Units of the CLI: the exit code per HTTP status, the option an answer picks (through
`prospero.types.decisions.option_for`), the import direction of the CLI's modules."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest
from rich.console import Console

from prospero.cli import exits
from prospero.cli.client import CliError
from prospero.cli.decisions import _pick_option
from prospero.cli.render_events import FollowRenderer
from prospero.types.decisions import AUTONOMOUS_NOTE, AUTONOMOUS_RULE, Decision, option_for
from prospero.types.events import DecisionOption

CLI = Path(__file__).resolve().parents[2] / "src" / "prospero" / "cli"


def test_exit_code_per_status() -> None:
    assert [exits.for_status(s) for s in (400, 422, 404, 401, 403, 429, 409, 503, 500)] == [
        exits.USAGE,
        exits.USAGE,
        exits.NOT_FOUND,
        exits.AUTH,
        exits.AUTH,
        exits.AUTH,
        exits.CONFLICT,
        exits.UNREACHABLE,
        exits.FAILURE,
    ]
    codes = [code for code, _ in exits.TABLE]
    assert len(codes) == len(set(codes)) and codes[:8] == list(range(8))


def decision(*kinds: str) -> Decision:
    return Decision(
        id="dec-1",
        agent_id="a",
        workspace="ws",
        created_at="2026-01-01T00:00:00+00:00",
        options=[DecisionOption(id=k.replace("_", "-"), kind=k) for k in kinds],
    )


def test_an_answer_is_never_broader_or_narrower_than_asked() -> None:
    both = decision("allow_once", "allow_always", "reject_once")
    assert _pick_option(both, "allow", False, None).kind == "allow_once"
    assert _pick_option(both, "allow", True, None).kind == "allow_always"
    assert _pick_option(both, "reject", False, None).kind == "reject_once"
    # option_for would fall back to allow_always: without --always that is refused
    only_always = decision("allow_always", "reject_once")
    assert option_for(only_always.options, "allow", "allow_once") is not None
    with pytest.raises(CliError) as e:
        _pick_option(only_always, "allow", False, None)
    assert e.value.code == exits.USAGE and "--always picks allow_always" in e.value.message
    with pytest.raises(CliError):
        _pick_option(decision("reject_once"), "reject", True, None)  # no reject_always
    assert _pick_option(both, "reject", False, "allow-always").id == "allow-always"


def test_cli_modules_import_one_way() -> None:
    """The CLI imports prospero.types only (never core, api, daemon or testkit), and no CLI
    module imports `cli.main` (which imports them all) except `__main__`."""
    for path in sorted(CLI.glob("*.py")):
        tree = ast.parse(path.read_text())
        names = [
            node.module or ""
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 0
        ] + [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
        ours = [n for n in names if n.startswith("prospero")]
        for name in ours:
            assert name == "prospero" or name.startswith(("prospero.cli", "prospero.types")), (
                path.name,
                name,
            )
        if path.name != "__main__.py":
            assert "prospero.cli.main" not in ours, path.name


def _resolved(seq: int, by: str, note: str, kind: str = "reject_once") -> dict[str, object]:
    return {
        "seq": seq,
        "ts": "2026-01-01T00:00:00Z",
        "repo": "ws",
        "agent_id": "a",
        "kind": {
            "kind": "decision_resolved",
            "id": f"dec-{seq}",
            "tool_call": {"id": f"t{seq}", "title": "Edit src/app.py", "kind": "edit"},
            "state": "decided",
            "option_id": kind,
            "option_kind": kind,
            "by": by,
            "note": note,
            "rule": AUTONOMOUS_RULE if note == AUTONOMOUS_NOTE else "ws#1",
        },
    }


FINISHED = {
    "seq": 99,
    "ts": "2026-01-01T00:00:01Z",
    "repo": "ws",
    "agent_id": "a",
    "kind": {"kind": "agent_finished", "outcome": "EndOfTurn", "turns": 1},
}


@pytest.mark.parametrize(
    ("resolved", "warning"),
    [
        ([], None),
        ([("policy", "deny kind='edit'")], None),  # a deny rule: what the policy says
        ([("alice", "fine", "allow_once")], None),
        ([("policy", AUTONOMOUS_NOTE)], "every permission request of this run (1) was denied"),
        (
            [("policy", AUTONOMOUS_NOTE), ("policy", AUTONOMOUS_NOTE)],
            "every permission request of this run (2) was denied",
        ),
        (
            [("policy", AUTONOMOUS_NOTE), ("policy", "allow kind='read'", "allow_once")],
            "1 of the 2 permission requests of this run were denied",
        ),
    ],
)
def test_a_run_whose_requests_its_posture_denied_says_so(
    resolved: list[tuple[str, ...]], warning: str | None
) -> None:
    console = Console(file=io.StringIO(), width=100, no_color=True, soft_wrap=True)
    r = FollowRenderer(console)
    for i, args in enumerate(resolved):
        r.raw(_resolved(i + 1, *args))
    r.raw(FINISHED)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    last = out.strip().splitlines()[-1]
    if warning is None:
        assert last.startswith("[finished] EndOfTurn"), out
        assert "posture" not in out
    else:
        assert last.startswith(f"⚠ {warning} by its posture: an autonomous agent"), out
        assert "prospero policy set ws --posture supervised" in last
