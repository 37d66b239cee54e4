"""DecisionService (the PermissionBroker of prosperod, ADR 0006) with AcpDriver against the
scripted ACP peer on real sockets, the SQLite DecisionStore on a real file, and a local HTTP
server for webhooks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from prospero.core import decisions as D
from prospero.core.decisions import (
    DecisionConfig,
    DecisionConflict,
    DecisionNotFound,
    DecisionService,
    UnknownOption,
    evaluate_policy,
    option_for,
)
from prospero.core.drivers.acp import AcpDriver
from prospero.core.drivers.base import DriverExit, DriverTarget
from prospero.core.metrics import Metrics
from prospero.core.permissions import (
    PermissionOption,
    PermissionRequest,
    PermissionToolCall,
)
from prospero.core.store.decisions import SessionRule
from prospero.core.store.sqlite.decisions import SqliteDecisionStore
from prospero.testkit import acp_scripts as S
from prospero.types.decisions import Decision, PolicyPatch, PolicyRule, WorkspacePolicy
from prospero.types.events import (
    DecisionOption,
    DecisionPending,
    DecisionResolved,
    DecisionToolCall,
    EventKind,
    Output,
    ToolFinished,
    ToolStarted,
    TurnFinished,
)
from tests.core.acp_support import MemoryCursorStore, Peer, Rig
from tests.receiver import Receiver
from tests.support import wait_until

T = 15.0

EDIT = {"path": "src/app.py", "old_string": "a", "new_string": "b"}


# ---- helpers --------------------------------------------------------------------------------


class Stream:
    """One agent stream: the driver's sink and the service's emitter write into the same list,
    so the relative order of driver and decision events is observable."""

    def __init__(self) -> None:
        self.events: list[EventKind] = []
        self.emitted: list[tuple[str, str, EventKind]] = []

    async def __call__(self, kind: EventKind) -> None:
        self.events.append(kind)

    async def emit(self, repo: str, agent_id: str, kind: EventKind) -> None:
        self.emitted.append((repo, agent_id, kind))
        self.events.append(kind)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def pending(self) -> list[DecisionPending]:
        return [e for e in self.events if isinstance(e, DecisionPending)]

    def resolved(self) -> list[DecisionResolved]:
        return [e for e in self.events if isinstance(e, DecisionResolved)]

    def stdout(self) -> str:
        return "".join(e.chunk for e in self.events if isinstance(e, Output))


@dataclass
class Env:
    rig: Rig
    db: Path
    stream: Stream = field(default_factory=Stream)
    services: list[DecisionService] = field(default_factory=list)

    async def service(self, **cfg: Any) -> DecisionService:
        svc = DecisionService(
            SqliteDecisionStore(self.db), self.stream, Metrics(), DecisionConfig(**cfg)
        )
        await svc.start()
        self.services.append(svc)
        return svc

    async def agent(
        self,
        script: S.AcpScript,
        svc: DecisionService,
        *,
        posture: str | None = "supervised",
        interactive: bool = False,
        peer: Peer | None = None,
        agent_id: str | None = None,
        cursor_store: MemoryCursorStore | None = None,
        **agent_kw: Any,
    ) -> tuple[AcpDriver, Peer, DriverTarget]:
        peer = peer or await self.rig.peer(script, **agent_kw)
        target = self.rig.target(peer, posture=posture, interactive=interactive, agent_id=agent_id)
        driver = self.rig.driver(target, self.stream, broker=svc, cursor_store=cursor_store)
        return driver, peer, target


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    e = Env(Rig(), tmp_path / "events.db")
    try:
        yield e
    finally:
        await e.rig.aclose()
        for svc in e.services:
            with contextlib.suppress(Exception):
                await svc.close()


def ask_turn(
    tid: str = "call_edit",
    title: str = "Edit src/app.py",
    kind: str = "edit",
    options: list[dict[str, str]] | None = None,
    raw_input: Any = None,
) -> S.Turn:
    """A tool call that asks permission: allowed -> completed + text; rejected -> failed."""
    raw = raw_input if raw_input is not None else EDIT
    return [
        S.text("Looking."),
        S.tool_call(tid, title, kind, raw_input=raw, status="pending"),
        S.permission(
            tid,
            title=title,
            kind=kind,
            raw_input=raw,
            options=options,
            on_allow=[
                S.tool_update(tid, status="completed", raw_output="updated"),
                S.text(f" {tid} done."),
            ],
            on_reject=[
                S.tool_update(tid, status="failed", raw_output="Permission denied"),
                S.text(f" {tid} skipped."),
            ],
        ),
        S.stop("end_turn"),
    ]


async def pending_of(svc: DecisionService, n: int = 1) -> list[Decision]:
    found: list[Decision] = []

    async def ready() -> bool:
        nonlocal found
        found = await svc.query(state="pending")
        return len(found) >= n and all(svc.is_live(d.id) for d in found)

    await wait_until(ready, T, what=f"{n} pending decision(s)")
    return found


def tool_finished(stream: Stream, tid: str) -> ToolFinished:
    return next(e for e in stream.events if isinstance(e, ToolFinished) and e.id == tid)


# ---- pure policy ---------------------------------------------------------------------------


def tc(title: str = "t", kind: str | None = "edit", input: Any = None) -> DecisionToolCall:
    return DecisionToolCall(id="c", title=title, kind=kind, input=input)


def test_policy_rules_match_in_order() -> None:
    policy = WorkspacePolicy(
        rules=[
            PolicyRule(action="allow", kind="read"),
            PolicyRule(action="deny", command="rm *", name="no-rm"),
            PolicyRule(action="ask", path="/etc/*"),
            PolicyRule(action="allow", title="Run tests*", kind="execute"),
            PolicyRule(action="deny", kind="e*"),
        ]
    )

    def first(t: DecisionToolCall) -> tuple[str, str] | None:
        m = evaluate_policy(policy, "ws", t)
        return (m.action, m.name) if m else None

    assert first(tc(kind="read")) == ("allow", "ws#1")
    assert first(tc(kind="execute", input={"command": "rm -rf /"})) == ("deny", "no-rm")
    assert first(tc(kind="execute", input={"command": ["rm", "-rf", "x"]})) == ("deny", "no-rm")
    assert first(tc(kind="edit", input={"file_path": "/etc/hosts"})) == ("ask", "ws#3")
    assert first(tc(kind="edit", input={"paths": ["a", "/etc/x/y"]})) == ("ask", "ws#3")
    assert first(tc("Run tests now", kind="execute", input={"command": "pytest"})) == (
        "allow",
        "ws#4",
    )
    assert first(tc(kind="edit", input={"path": "src/x.py"})) == ("deny", "ws#5")
    assert first(tc(kind="fetch")) is None
    # A call without a kind counts as "other"; a rule naming a command needs one.
    assert evaluate_policy(
        WorkspacePolicy(rules=[PolicyRule(action="deny", kind="other")]), "w", tc(kind=None)
    )
    assert (
        evaluate_policy(
            WorkspacePolicy(rules=[PolicyRule(action="deny", command="*")]), "w", tc(input={"x": 1})
        )
        is None
    )
    # No criteria: matches everything.
    assert evaluate_policy(WorkspacePolicy(rules=[PolicyRule(action="allow")]), "w", tc())


def test_option_for_prefers_once_then_always() -> None:
    opts = [
        DecisionOption(id="a1", label="Allow always", kind="allow_always"),
        DecisionOption(id="a", label="Allow", kind="allow_once"),
        DecisionOption(id="r", label="No", kind="reject_always"),
    ]
    assert option_for(opts, "allow").id == "a"  # type: ignore[union-attr]
    assert option_for(opts, "allow", prefer="allow_always").id == "a1"  # type: ignore[union-attr]
    assert option_for(opts, "reject").id == "r"  # type: ignore[union-attr]
    assert option_for(opts[:2], "reject") is None


def test_policy_patch_applies_only_given_fields() -> None:
    base = WorkspacePolicy(posture="supervised", timeout_s=30, rules=[PolicyRule(action="ask")])
    assert PolicyPatch(posture="autonomous").apply(base).model_dump() == {
        "posture": "autonomous",
        "timeout_s": 30,
        "rules": [base.rules[0].model_dump()],
    }
    cleared = PolicyPatch.model_validate({"timeout_s": None, "rules": []}).apply(base)
    assert (cleared.posture, cleared.timeout_s, cleared.rules) == ("supervised", None, [])


# ---- the store ------------------------------------------------------------------------------


async def test_store_conditional_resolve_policies_and_rules(tmp_path: Path) -> None:
    store = SqliteDecisionStore(tmp_path / "events.db")
    await store.open()
    try:
        ds = [
            Decision(
                id=f"d{i}",
                agent_id="a" if i < 2 else "b",
                workspace="ws",
                session_id="s",
                tool_call=tc(f"t{i}"),
                options=[DecisionOption(id="x", label="X", kind="allow_once")],
                created_at=f"2026-01-01T00:00:0{i}+00:00",
            )
            for i in range(3)
        ]
        for d in ds:
            await store.insert(d)
        assert [d.id for d in await store.query(state="pending")] == ["d0", "d1", "d2"]
        assert [d.id for d in await store.query(agent_id="a")] == ["d0", "d1"]
        assert [d.id for d in await store.query(limit=2)] == ["d1", "d2"]
        won = await store.resolve(
            "d1", state="decided", decided_by="alice", decided_at="now", option_id="x", note="ok"
        )
        assert won is not None and (won.state, won.decided_by, won.option_id, won.note) == (
            "decided",
            "alice",
            "x",
            "ok",
        )
        again = await store.resolve("d1", state="cancelled", decided_by="bob", decided_at="n")
        assert again is None
        assert (
            await store.resolve("nope", state="cancelled", decided_by="b", decided_at="n") is None
        )
        assert [d.id for d in await store.query(state="decided")] == ["d1"]
        assert (await store.get("d1")).decided_by == "alice"  # type: ignore[union-attr]
        assert await store.get("missing") is None
        # Many concurrent resolvers: exactly one wins.
        results = await asyncio.gather(
            *(
                store.resolve("d2", state="decided", decided_by=f"u{i}", decided_at="n")
                for i in range(20)
            )
        )
        assert sum(r is not None for r in results) == 1

        assert await store.get_policy("ws") is None
        pol = WorkspacePolicy(posture="supervised", timeout_s=5, rules=[PolicyRule(action="deny")])
        await store.put_policy("ws", pol)
        assert await store.get_policy("ws") == pol

        r1 = SessionRule("a", "s", "edit", "t", "allow", "allow_always", "d0", "1")
        r2 = SessionRule("a", "s", "edit", "t", "reject", "reject_always", "d9", "2")
        await store.add_session_rule(r1)
        await store.add_session_rule(r2)  # same key: replaces
        assert await store.session_rules("a", "s") == [r2]
        assert await store.session_rules("a", "other") == []
    finally:
        await store.close()
    # Durable: a new store on the same file sees everything.
    store2 = SqliteDecisionStore(tmp_path / "events.db")
    try:
        assert (await store2.get("d1")).state == "decided"  # type: ignore[union-attr]
        assert (await store2.get_policy("ws")).posture == "supervised"  # type: ignore[union-attr]
    finally:
        await store2.close()


# ---- supervised: humans decide ----------------------------------------------------------------


async def test_supervised_approve_lets_the_agent_finish(env: Env) -> None:
    svc = await env.service()
    driver, peer, target = await env.agent(S.AcpScript(turns=[ask_turn()]), svc)
    task = asyncio.create_task(driver.run())
    [d] = await pending_of(svc)
    assert (d.agent_id, d.workspace, d.state, d.posture) == (
        target.agent_id,
        "ws",
        "pending",
        "supervised",
    )
    assert d.tool_call == DecisionToolCall(
        id="call_edit", title="Edit src/app.py", kind="edit", input=EDIT
    )
    assert [(o.id, o.kind) for o in d.options] == [
        ("allow-once", "allow_once"),
        ("allow-always", "allow_always"),
        ("reject-once", "reject_once"),
        ("reject-always", "reject_always"),
    ]
    assert d.deadline is None and d.session_id == driver.session_id
    # The decision is announced after the tool call it is about.
    await wait_until(lambda: env.stream.pending(), T)
    kinds = env.stream.kinds()
    assert kinds.index("tool_started") < kinds.index("decision_pending")
    assert env.stream.pending()[0].id == d.id

    decided = await svc.decide_by_human(d.id, "allow-once", by="alice", note="  looks fine ")
    assert (decided.state, decided.decided_by, decided.option_id, decided.note) == (
        "decided",
        "alice",
        "allow-once",
        "looks fine",
    )
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    assert tool_finished(env.stream, "call_edit").ok
    assert "call_edit done." in env.stream.stdout()
    [res] = env.stream.resolved()
    assert (res.id, res.state, res.option_id, res.option_kind, res.by, res.note) == (
        d.id,
        "decided",
        "allow-once",
        "allow_once",
        "alice",
        "looks fine",
    )
    kinds = env.stream.kinds()
    assert (
        kinds.index("decision_pending")
        < kinds.index("decision_resolved")
        < kinds.index("tool_finished")
    )
    assert peer.agent.permission_outcomes[0]["option_id"] == "allow-once"
    # Audit, from the store.
    stored = await svc.get(d.id)
    assert (stored.state, stored.decided_by, stored.note) == ("decided", "alice", "looks fine")
    assert stored.decided_at is not None
    # Answering again: conflict; unknown ids: not found.
    with pytest.raises(DecisionConflict, match="already decided by alice"):
        await svc.decide_by_human(d.id, "reject-once", by="bob")
    with pytest.raises(DecisionNotFound):
        await svc.decide_by_human("dec-nope", "allow-once", by="bob")


async def test_supervised_deny_skips_and_unknown_option_is_refused(env: Env) -> None:
    svc = await env.service()
    driver, peer, _ = await env.agent(S.AcpScript(turns=[ask_turn()]), svc)
    task = asyncio.create_task(driver.run())
    [d] = await pending_of(svc)
    with pytest.raises(UnknownOption, match="no option 'maybe'"):
        await svc.decide_by_human(d.id, "maybe", by="alice")
    assert (await svc.get(d.id)).state == "pending"
    await svc.decide_by_human(d.id, "reject-once", by="bob")
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    assert not tool_finished(env.stream, "call_edit").ok
    assert "call_edit skipped." in env.stream.stdout()
    assert peer.agent.permission_outcomes[0]["allow"] is False


async def test_exactly_one_of_many_concurrent_deciders_wins(env: Env) -> None:
    svc = await env.service()
    driver, peer, _ = await env.agent(S.AcpScript(turns=[ask_turn()]), svc)
    task = asyncio.create_task(driver.run())
    [d] = await pending_of(svc)
    results = await asyncio.gather(
        *(
            svc.decide_by_human(d.id, "allow-once" if i % 2 else "reject-once", by=f"u{i}")
            for i in range(20)
        ),
        return_exceptions=True,
    )
    wins = [r for r in results if isinstance(r, Decision)]
    assert len(wins) == 1
    assert all(isinstance(r, DecisionConflict) for r in results if not isinstance(r, Decision))
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    assert len(peer.agent.permission_outcomes) == 1
    assert peer.agent.permission_outcomes[0]["option_id"] == wins[0].option_id
    assert len(env.stream.resolved()) == 1


# ---- always rules -----------------------------------------------------------------------------


async def test_allow_always_becomes_a_session_rule(env: Env) -> None:
    svc = await env.service()
    turn = [
        *ask_turn("c1")[:-1],
        *ask_turn("c2")[1:-1],  # same kind and title: answered by the rule
        *ask_turn("c3", title="Edit other.py")[1:],  # another title: asks again
    ]
    driver, peer, target = await env.agent(S.AcpScript(turns=[turn]), svc)
    task = asyncio.create_task(driver.run())
    [first] = await pending_of(svc)
    await svc.decide_by_human(first.id, "allow-always", by="alice")
    [third] = await pending_of(svc)
    assert third.tool_call.id == "c3"
    await svc.decide_by_human(third.id, "reject-once", by="alice")
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    assert [o["option_id"] for o in peer.agent.permission_outcomes] == [
        "allow-always",
        "allow-always",
        "reject-once",
    ]
    audit = await svc.query(agent_id=target.agent_id)
    assert [(a.tool_call.id, a.state, a.decided_by, a.rule) for a in audit] == [
        ("c1", "decided", "alice", None),
        ("c2", "decided", "rule", f"session:{first.id}"),
        ("c3", "decided", "alice", None),
    ]
    # The automatic one is announced (resolved only: nobody was asked).
    assert [(p.id) for p in env.stream.pending()] == [first.id, third.id]
    by_rule = [r for r in env.stream.resolved() if r.by == "rule"]
    assert len(by_rule) == 1 and by_rule[0].rule == f"session:{first.id}"
    assert by_rule[0].tool_call.id == "c2"
    # Durable: the rule is in the store for this agent's session.
    rules = await svc.store.session_rules(target.agent_id, driver.session_id or "")
    assert [(r.tool_kind, r.title, r.action) for r in rules] == [
        ("edit", "Edit src/app.py", "allow")
    ]


async def test_reject_always_answers_later_asks_of_the_session(env: Env) -> None:
    svc = await env.service()
    turn = [*ask_turn("c1")[:-1], *ask_turn("c2")[1:]]
    driver, peer, _ = await env.agent(S.AcpScript(turns=[turn]), svc)
    task = asyncio.create_task(driver.run())
    [first] = await pending_of(svc)
    await svc.decide_by_human(first.id, "reject-always", by="carol", note="never")
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    assert [o["option_id"] for o in peer.agent.permission_outcomes] == [
        "reject-always",
        "reject-always",
    ]
    assert "c2 skipped." in env.stream.stdout()


# ---- policy and posture -----------------------------------------------------------------------


async def test_autonomous_posture_denies_by_default(env: Env) -> None:
    svc = await env.service()
    driver, peer, target = await env.agent(
        S.AcpScript(turns=[ask_turn()]), svc, posture="autonomous"
    )
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    assert peer.agent.permission_outcomes[0]["option_id"] == "reject-once"
    [d] = await svc.query(agent_id=target.agent_id)
    assert (d.state, d.decided_by, d.rule, d.option_id, d.posture) == (
        "decided",
        "policy",
        D.AUTONOMOUS_RULE,
        "reject-once",
        "autonomous",
    )
    assert env.stream.pending() == []
    assert env.stream.resolved()[0].rule == D.AUTONOMOUS_RULE


async def test_no_posture_uses_the_workspace_default(env: Env) -> None:
    svc = await env.service()
    await svc.set_policy("ws", WorkspacePolicy(posture="supervised"))
    driver, _, _ = await env.agent(S.AcpScript(turns=[ask_turn()]), svc, posture=None)
    task = asyncio.create_task(driver.run())
    [d] = await pending_of(svc)
    assert d.posture == "supervised"
    await svc.decide_by_human(d.id, "allow-once", by="alice")
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    # Without a workspace default: autonomous (deny), the pre-decisions behaviour.
    await svc.set_policy("ws", WorkspacePolicy())
    driver2, peer2, _ = await env.agent(S.AcpScript(turns=[ask_turn()]), svc, posture=None)
    assert await asyncio.wait_for(driver2.run(), T) is DriverExit.finished
    assert peer2.agent.permission_outcomes[0]["option_id"] == "reject-once"


async def test_policy_rules_answer_before_a_human_and_name_the_rule(env: Env) -> None:
    svc = await env.service()
    await svc.set_policy(
        "ws",
        WorkspacePolicy(
            rules=[
                PolicyRule(action="deny", kind="execute", command="rm *", name="no-rm"),
                PolicyRule(action="allow", kind="edit", path="src/*"),
                PolicyRule(action="ask", kind="execute"),
            ]
        ),
    )
    turn = [
        *ask_turn("c1")[:-1],  # edit src/app.py: allowed by ws#2
        *ask_turn("c2", "rm -rf build", "execute", raw_input={"command": "rm -rf build"})[1:-1],
        *ask_turn("c3", "make", "execute", raw_input={"command": "make"})[1:],  # ask: human
    ]
    driver, peer, target = await env.agent(S.AcpScript(turns=[turn]), svc)
    task = asyncio.create_task(driver.run())
    [d3] = await pending_of(svc)
    assert d3.tool_call.id == "c3"
    await svc.decide_by_human(d3.id, "allow-once", by="dave")
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    assert [o["option_id"] for o in peer.agent.permission_outcomes] == [
        "allow-once",
        "reject-once",
        "allow-once",
    ]
    audit = await svc.query(agent_id=target.agent_id)
    assert [(a.tool_call.id, a.decided_by, a.rule) for a in audit] == [
        ("c1", "policy", "ws#2"),
        ("c2", "policy", "no-rm"),
        ("c3", "dave", None),
    ]
    assert audit[1].note == "deny kind='execute' command='rm *'"


async def test_autonomous_ask_rule_is_denied_naming_the_rule(env: Env) -> None:
    svc = await env.service()
    await svc.set_policy("ws", WorkspacePolicy(rules=[PolicyRule(action="ask", name="human")]))
    driver, _peer, target = await env.agent(
        S.AcpScript(turns=[ask_turn()]), svc, posture="autonomous"
    )
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    [d] = await svc.query(agent_id=target.agent_id)
    assert (d.decided_by, d.rule, d.option_id) == ("policy", "human", "reject-once")


async def test_policy_allow_without_an_allow_option_answers_cancelled(env: Env) -> None:
    svc = await env.service()
    await svc.set_policy("ws", WorkspacePolicy(rules=[PolicyRule(action="allow")]))
    only_reject = [{"option_id": "no", "name": "No", "kind": "reject_once"}]
    driver, peer, target = await env.agent(S.AcpScript(turns=[ask_turn(options=only_reject)]), svc)
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    assert peer.agent.permission_outcomes[0]["outcome"] == "cancelled"
    [d] = await svc.query(agent_id=target.agent_id)
    assert d.state == "cancelled" and "no allow option" in (d.note or "")


# ---- timeouts and cancellation ----------------------------------------------------------------


async def test_timeout_answers_reject_with_timed_out(env: Env) -> None:
    svc = await env.service()
    await svc.set_policy("ws", WorkspacePolicy(timeout_s=0.3))
    driver, peer, target = await env.agent(S.AcpScript(turns=[ask_turn()]), svc)
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    [d] = await svc.query(agent_id=target.agent_id)
    assert (d.state, d.decided_by, d.note, d.option_id) == (
        "expired",
        "timeout",
        "timed out",
        "reject-once",
    )
    assert d.deadline is not None and d.deadline <= (d.decided_at or "")
    assert peer.agent.permission_outcomes[0]["option_id"] == "reject-once"
    assert env.stream.pending()[0].deadline == d.deadline
    assert env.stream.resolved()[0].state == "expired"
    assert svc.metrics.get(D.DECISIONS_TIMED_OUT) == 1
    with pytest.raises(DecisionConflict, match="already expired by timeout"):
        await svc.decide_by_human(d.id, "allow-once", by="late")


async def test_cancelled_turn_cancels_the_pending_ask(env: Env) -> None:
    svc = await env.service()
    driver, _peer, _target = await env.agent(S.AcpScript(turns=[ask_turn()]), svc)
    task = asyncio.create_task(driver.run())
    [d] = await pending_of(svc)
    await driver.cancel_turn()
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    await wait_until(lambda: env.stream.resolved(), T, what="resolved")
    stored = await svc.get(d.id)
    assert (stored.state, stored.decided_by) == ("cancelled", "cancel")
    turns = [e.stop_reason for e in env.stream.events if isinstance(e, TurnFinished)]
    assert turns == ["cancelled"]
    with pytest.raises(DecisionConflict, match="already cancelled"):
        await svc.decide_by_human(d.id, "allow-once", by="late")


async def test_cancel_agent_resolves_its_asks_with_the_reason(env: Env) -> None:
    svc = await env.service()
    driver, peer, target = await env.agent(S.AcpScript(turns=[ask_turn()]), svc)
    task = asyncio.create_task(driver.run())
    [d] = await pending_of(svc)
    assert await svc.cancel_agent("someone-else", "nope") == 0
    assert await svc.cancel_agent(target.agent_id, "the agent was killed") == 1
    assert await asyncio.wait_for(task, T) is DriverExit.finished
    stored = await svc.get(d.id)
    assert (stored.state, stored.decided_by, stored.note) == (
        "cancelled",
        "cancel",
        "the agent was killed",
    )
    assert peer.agent.permission_outcomes[0]["outcome"] == "cancelled"


async def test_lost_connection_cancels_the_pending_ask(env: Env) -> None:
    svc = await env.service()
    driver, peer, _ = await env.agent(S.AcpScript(turns=[ask_turn()]), svc)
    task = asyncio.create_task(driver.run())
    [d] = await pending_of(svc)
    await peer.listener.stop()  # the agent's endpoint goes away mid-turn

    async def cancelled() -> bool:
        return (await svc.get(d.id)).state == "cancelled"

    await wait_until(cancelled, T, what="cancelled after the connection dropped")
    assert (await svc.get(d.id)).decided_by == "cancel"
    assert "turn_lost" in env.stream.kinds()
    await driver.close()
    await asyncio.wait_for(task, T)


# ---- restart ----------------------------------------------------------------------------------


async def test_pending_at_stop_is_cancelled_on_restart(env: Env) -> None:
    svc = await env.service()
    driver, _, _ = await env.agent(S.AcpScript(turns=[ask_turn()]), svc)
    task = asyncio.create_task(driver.run())
    [d] = await pending_of(svc)
    # prosperod stops: the abandoned ask stays pending in the store.
    svc.begin_shutdown()
    await driver.close()
    await asyncio.wait_for(task, T)
    await svc.close()
    assert (await SqliteDecisionStore(env.db).get(d.id)).state == "pending"  # type: ignore[union-attr]
    before = len(env.stream.resolved())
    svc2 = await env.service(rejoin_grace=0.2)
    # Not live in this process: it cannot be answered.
    with pytest.raises(DecisionConflict, match="prosperod restarted"):
        await svc2.decide_by_human(d.id, "allow-once", by="alice")

    async def cancelled() -> bool:
        return (await svc2.get(d.id)).state == "cancelled"

    await wait_until(cancelled, T, what="cancelled after the restart grace")
    stored = await svc2.get(d.id)
    assert (stored.decided_by, stored.note) == ("restart", D.RESTART_NOTE)
    assert [r.id for r in env.stream.resolved()[before:]] == [d.id]


async def test_rejoined_session_asking_again_keeps_the_decision(env: Env) -> None:
    """prosperod stops while a decision is pending; the next one rejoins the agent's session
    (session/load) and the agent asks again for the same tool call: the decision stays
    pending (same id) and a human's answer reaches the agent."""
    cursors = MemoryCursorStore()
    script = S.AcpScript(turns=[ask_turn(), ask_turn()])
    svc = await env.service()
    driver, peer, target = await env.agent(script, svc, interactive=True, cursor_store=cursors)
    task = asyncio.create_task(driver.run())
    [d] = await pending_of(svc)
    svc.begin_shutdown()
    await driver.close()
    await asyncio.wait_for(task, T)
    await svc.close()

    svc2 = await env.service(rejoin_grace=30.0)
    driver2, _, _ = await env.agent(
        script,
        svc2,
        interactive=True,
        peer=peer,
        agent_id=target.agent_id,
        cursor_store=cursors,
    )
    task2 = asyncio.create_task(driver2.run())
    await wait_until(lambda: driver2.resumed == 1, T, what="rejoined with session/load")
    assert driver2.session_id == driver.session_id
    await driver2.send_input("please try the edit again")
    [again] = await pending_of(svc2)
    assert again.id == d.id and again.created_at == d.created_at
    await svc2.decide_by_human(d.id, "allow-once", by="alice")
    await wait_until(lambda: len(peer.agent.permission_outcomes) == 2, T)
    assert peer.agent.permission_outcomes[-1]["option_id"] == "allow-once"
    await driver2.end_input()
    assert await asyncio.wait_for(task2, T) is DriverExit.finished
    assert (await svc2.get(d.id)).decided_by == "alice"


async def test_adoption_without_a_driver_and_grace_cancel_of_others(env: Env) -> None:
    """The take-over rule itself: same agent, session and tool call id only."""
    svc = await env.service()
    opts = (PermissionOption("y", "Yes", "allow_once"), PermissionOption("n", "No", "reject_once"))

    def req(tool_id: str, session: str = "s1") -> PermissionRequest:
        return PermissionRequest(
            agent_id="ag",
            session_id=session,
            tool_call=PermissionToolCall(id=tool_id, title="Edit", kind="edit"),
            options=opts,
            posture="supervised",
            workspace="ws",
        )

    asks = [asyncio.create_task(svc.decide(req(t))) for t in ("t1", "t2")]
    found = await pending_of(svc, 2)
    svc.begin_shutdown()
    for a in asks:
        a.cancel()
    await asyncio.gather(*asks, return_exceptions=True)
    await svc.close()

    svc2 = await env.service(rejoin_grace=1.0)
    other_session = asyncio.create_task(svc2.decide(req("t1", session="s2")))
    adopted = asyncio.create_task(svc2.decide(req("t1")))
    await wait_until(lambda: len(svc2._live) == 2, T)
    t1 = next(d for d in found if d.tool_call.id == "t1")
    assert svc2.is_live(t1.id)
    await svc2.decide_by_human(t1.id, "y", by="alice")
    assert (await asyncio.wait_for(adopted, T)).option_id == "y"
    t2 = next(d for d in found if d.tool_call.id == "t2")

    async def t2_cancelled() -> bool:
        return (await svc2.get(t2.id)).state == "cancelled"

    await wait_until(t2_cancelled, T)
    other_session.cancel()
    await asyncio.gather(other_session, return_exceptions=True)


# ---- webhooks ---------------------------------------------------------------------------------


class WebhookSink(Receiver):
    """A local HTTP server recording JSON POSTs; answers `statuses` in turn (then 200)."""

    def events(self) -> list[tuple[str, str]]:  # type: ignore[override]
        return [(b["event"], b["decision"]["state"]) for b in self.bodies]


async def test_webhooks_retry_then_deliver_and_failures_never_block(env: Env) -> None:
    flaky = await WebhookSink([500, 503]).start()
    hung: list[asyncio.StreamWriter] = []

    async def never_answer(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        hung.append(w)

    stuck = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    stuck_url = f"http://127.0.0.1:{stuck.sockets[0].getsockname()[1]}/hook"
    try:
        dead = "http://127.0.0.1:9/never"  # nothing listens on the discard port
        svc = await env.service(
            webhooks=[flaky.url, dead, stuck_url],
            webhook_backoff=0.05,
            webhook_attempts=4,
            webhook_timeout=60.0,
        )
        driver, _, target = await env.agent(S.AcpScript(turns=[ask_turn()]), svc)
        task = asyncio.create_task(driver.run())
        [d] = await pending_of(svc)
        await svc.decide_by_human(d.id, "allow-once", by="alice", note="ok")
        # The agent finishes although one endpoint never answers and one is down.
        assert await asyncio.wait_for(task, T) is DriverExit.finished
        assert hung  # the stuck endpoint was called and is still hanging
        await wait_until(lambda: len(flaky.bodies) == 2, T, what="both notifications")
        assert flaky.events() == [("decision_pending", "pending"), ("decision_resolved", "decided")]
        assert flaky.attempts == 4  # two failures, then two deliveries
        body = flaky.bodies[1]
        assert body["decision"]["id"] == d.id and body["decision"]["decided_by"] == "alice"
        assert body["decision"]["agent_id"] == target.agent_id
        assert "alice" in body["summary"] and body["sent_at"]
        m = svc.metrics
        await wait_until(lambda: m.get(D.DECISION_WEBHOOK_FAILURES) >= 2, T, what="dead failed")
        assert m.get(D.DECISION_WEBHOOK_DELIVERIES) == 2
        assert m.get(D.DECISION_WEBHOOK_RETRIES) >= 2
    finally:
        await flaky.stop()
        for w in hung:
            w.close()
        stuck.close()


async def test_webhook_client_error_is_not_retried(env: Env) -> None:
    sink = await WebhookSink([404]).start()
    try:
        svc = await env.service(webhooks=[sink.url], webhook_backoff=0.05)
        await svc.set_policy("ws", WorkspacePolicy(timeout_s=0.2))
        driver, _, _ = await env.agent(S.AcpScript(turns=[ask_turn()]), svc)
        assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
        await wait_until(lambda: sink.attempts == 2, T)
        assert sink.events() == [("decision_resolved", "expired")]
        assert svc.metrics.get(D.DECISION_WEBHOOK_FAILURES) == 1
        assert svc.metrics.get(D.DECISION_WEBHOOK_RETRIES) == 0
    finally:
        await sink.stop()


# ---- misc -----------------------------------------------------------------------------------


async def test_tool_started_carries_input_before_the_decision_with_late_input(env: Env) -> None:
    """The ask names a call whose input arrives only with the request: tool_started (held)
    goes out with that input, before decision_pending."""
    svc = await env.service()
    turn = [
        S.tool_call("late", "Edit late.py", "edit", status="pending"),
        S.permission(
            "late",
            title="Edit late.py",
            kind="edit",
            raw_input={"path": "late.py"},
            on_allow=[S.tool_update("late", status="completed", raw_output="ok")],
        ),
    ]
    driver, _, _ = await env.agent(S.AcpScript(turns=[turn]), svc)
    task = asyncio.create_task(driver.run())
    [d] = await pending_of(svc)
    assert d.tool_call.input == {"path": "late.py"}
    await wait_until(lambda: env.stream.pending(), T)
    started = [e for e in env.stream.events if isinstance(e, ToolStarted)]
    assert started and started[0].input == {"path": "late.py"}
    assert env.stream.kinds().index("tool_started") < env.stream.kinds().index("decision_pending")
    await svc.decide_by_human(d.id, "allow-once", by="alice")
    assert await asyncio.wait_for(task, T) is DriverExit.finished


async def test_options_are_checked_by_the_driver(env: Env) -> None:
    """Options are the agent's own ids (here codex-acp style): a deny picks its reject."""
    svc = await env.service()
    await svc.set_policy("ws", WorkspacePolicy(rules=[PolicyRule(action="deny")]))
    custom = [
        {"option_id": "approved", "name": "Approve", "kind": "allow_once"},
        {"option_id": "abort", "name": "Abort", "kind": "reject_once"},
    ]
    driver, peer, _ = await env.agent(S.AcpScript(turns=[ask_turn(options=custom)]), svc)
    assert await asyncio.wait_for(driver.run(), T) is DriverExit.finished
    assert peer.agent.permission_outcomes[0]["option_id"] == "abort"


async def test_cancel_racing_the_event_flush_still_cancels_the_ask(env: Env) -> None:
    """The ask's task is cancelled at the very moment the driver's event flush completes.
    Python 3.11's `asyncio.wait_for` returns the inner result then and drops the
    cancellation; the ask must not go on to wait forever for an answer nobody will send."""
    svc = await env.service()
    asker: asyncio.Task[Any] | None = None

    async def flush_then_cancelled() -> None:
        assert asker is not None
        asker.cancel()  # lands while the flush itself completes

    request = PermissionRequest(
        agent_id="ag",
        session_id="s1",
        tool_call=PermissionToolCall(id="t1", title="Edit", kind="edit"),
        options=(PermissionOption("y", "Yes", "allow_once"),),
        posture="supervised",
        workspace="ws",
        flush=flush_then_cancelled,
    )
    asker = asyncio.create_task(svc.decide(request))
    done, _ = await asyncio.wait({asker}, timeout=T)
    assert done, "the cancelled ask kept waiting"
    assert asker.cancelled()

    async def cancelled() -> bool:
        found = await svc.query(agent_id="ag")
        return len(found) == 1 and found[0].state == "cancelled"

    await wait_until(cancelled, T, what="the ask resolved as cancelled")
    [d] = await svc.query(agent_id="ag")
    assert d.decided_by == "cancel"
