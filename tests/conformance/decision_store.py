"""DecisionStore conformance (ADR 0006): what every decision store backend (SQLite, PostgreSQL)
must do.

A test module subclasses `DecisionStoreConformance` and provides a `decision_store_factory`
fixture: an async callable that opens and returns a new handle on the *same* backing database,
fresh for each test (calling it twice = a restart, or a second replica). The fixture closes
every handle it opened at teardown; `close()` must be idempotent.

Semantics pinned here beyond core/store/decisions.py's docstrings:
- a decision round-trips field for field (tool call input of any JSON shape, options in order);
- inserting an id that exists is a StoreError and changes nothing;
- `query` is in creation order (`created_at`, ties in insertion order); `limit` keeps the newest
  `limit` matching decisions (a tie at the cut keeps the last inserted), still oldest first;
  `limit=0` is empty;
- `resolve` succeeds exactly once per decision, also when many callers race on one handle or on
  two handles of the same database; only a *pending* decision moves (one inserted already
  resolved never does); the winner gets the decision as stored; `state="pending"` is a
  ValueError;
- `reattach` refreshes tool call, options and deadline of a pending decision only;
- a session rule replaces the rule of the same agent, session, tool kind and title; rules are
  per (agent, session), oldest first;
- policies are per workspace, `put_policy` replaces;
- everything survives a reopen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from prospero.core.errors import StoreError
from prospero.core.store.decisions import DecisionStore, SessionRule
from prospero.types.decisions import Decision, DecisionState, PolicyRule, WorkspacePolicy
from prospero.types.events import DecisionOption, DecisionToolCall

DecisionStoreFactory = Callable[[], Awaitable[DecisionStore]]

OPTIONS = [
    DecisionOption(id="allow-once", label="Allow", kind="allow_once"),
    DecisionOption(id="allow-always", label="Always", kind="allow_always"),
    DecisionOption(id="reject-once", label="No", kind="reject_once"),
]


def at(second: int) -> str:
    return f"2026-01-01T00:{second // 60:02d}:{second % 60:02d}+00:00"


def decision(id_: str, second: int = 0, **kw: Any) -> Decision:
    data: dict[str, Any] = {
        "id": id_,
        "agent_id": "a1",
        "workspace": "ws",
        "session_id": "s1",
        "turn": 1,
        "tool_call": DecisionToolCall(id=f"call-{id_}", title=f"Edit {id_}", kind="edit"),
        "options": OPTIONS,
        "created_at": at(second),
        "posture": "supervised",
        **kw,
    }
    return Decision.model_validate(data)


def rule(
    title: str = "Edit x",
    *,
    agent: str = "a1",
    session: str = "s1",
    kind: str = "edit",
    action: str = "allow",
    decision_id: str = "d0",
    created_at: str = "1",
) -> SessionRule:
    return SessionRule(
        agent_id=agent,
        session_id=session,
        tool_kind=kind,
        title=title,
        action=action,
        option_kind=f"{action}_always",
        decision_id=decision_id,
        created_at=created_at,
    )


def ids(ds: list[Decision]) -> list[str]:
    return [d.id for d in ds]


class DecisionStoreConformance:
    @pytest.fixture
    async def decision_store(self, decision_store_factory: DecisionStoreFactory) -> DecisionStore:
        return await decision_store_factory()

    # ---- insert / get ------------------------------------------------------------------------

    async def test_empty(self, decision_store: DecisionStore) -> None:
        s = decision_store
        assert await s.get("nope") is None
        assert await s.query() == []
        assert await s.query(state="pending", limit=5) == []
        assert await s.resolve("nope", state="cancelled", decided_by="b", decided_at="n") is None
        assert (
            await s.reattach("nope", tool_call=DecisionToolCall(), options=[], deadline=None)
            is None
        )
        assert await s.session_rules("a1", "s1") == []
        assert await s.get_policy("ws") is None

    async def test_round_trip_every_field(self, decision_store: DecisionStore) -> None:
        full = decision(
            "d-full",
            turn=7,
            session_id="sess-ü",
            tool_call=DecisionToolCall(
                id="call_1",
                title="Run `rm -rf build` — ok? ✓",
                kind="execute",
                input={
                    "command": ["rm", "-rf", "build"],
                    "nested": {"a": [1, 2.5, None, True, {"b": "ç\u0000\n"}]},
                    "big": 2**53 + 1,
                    "empty": {},
                },
            ),
            options=[*reversed(OPTIONS), DecisionOption(id="odd", label="", kind="custom_kind")],
            deadline="2026-01-01T01:00:00+00:00",
            posture=None,
        )
        bare = decision("d-bare", tool_call=DecisionToolCall(), options=[], session_id="")
        done = decision(
            "d-done",
            state="decided",
            decided_by="policy",
            decided_at=at(1),
            option_id="allow-once",
            note="auto",
            rule="ws#1",
        )
        for d in (full, bare, done):
            await decision_store.insert(d)
        for d in (full, bare, done):
            assert await decision_store.get(d.id) == d
        assert (await decision_store.get("d-bare")).tool_call.kind is None  # type: ignore[union-attr]

    async def test_agent_text_with_control_bytes_round_trips(
        self, decision_store: DecisionStore
    ) -> None:
        """What the agent sends (session id, tool title and kind, option ids) is stored as it
        came, NUL and other control bytes included: it never fails the store."""
        s = decision_store
        odd = ["nul\x00in", "\x01lead", "\x01", "tab\tand\\back", "\x00"]
        for i, text in enumerate(odd):
            d = decision(
                f"d{i}",
                i,
                session_id=text,
                tool_call=DecisionToolCall(id=text, title=text, kind=text, input={text: text}),
                options=[DecisionOption(id=text, label=text, kind=text)],
            )
            await s.insert(d)
            assert await s.get(d.id) == d
            won = await s.resolve(
                d.id, state="decided", decided_by="u", decided_at="n", option_id=text
            )
            assert won is not None and won.option_id == text and won.session_id == text
            r = rule(text, session=text, kind=text, decision_id=d.id)
            await s.add_session_rule(r)
            assert await s.session_rules("a1", text) == [r]
        # escaping is exact: similar strings stay distinct
        assert await s.session_rules("a1", "nul") == []
        assert ids(await s.query(state="decided")) == [f"d{i}" for i in range(len(odd))]

    async def test_duplicate_id_is_a_store_error(self, decision_store: DecisionStore) -> None:
        first = decision("d1")
        await decision_store.insert(first)
        with pytest.raises(StoreError):
            await decision_store.insert(decision("d1", 5, agent_id="other", state="cancelled"))
        assert await decision_store.get("d1") == first
        # still usable
        await decision_store.insert(decision("d2", 1))
        assert ids(await decision_store.query()) == ["d1", "d2"]

    # ---- query -------------------------------------------------------------------------------

    async def test_query_in_creation_order(self, decision_store: DecisionStore) -> None:
        # inserted out of order; "z" and "a" tie on created_at: insertion order breaks the tie
        for id_, second in (("c", 30), ("z", 10), ("a", 10), ("b", 20), ("y", 5)):
            await decision_store.insert(decision(id_, second))
        assert ids(await decision_store.query()) == ["y", "z", "a", "b", "c"]

    async def test_query_filters(self, decision_store: DecisionStore) -> None:
        rows = [
            decision("d0", 0, agent_id="a1", workspace="w1"),
            decision("d1", 1, agent_id="a2", workspace="w1"),
            decision("d2", 2, agent_id="a1", workspace="w2"),
            decision("d3", 3, agent_id="a1", workspace="w1", state="expired"),
            decision("d4", 4, agent_id="a3", workspace="w2", state="cancelled"),
        ]
        for d in rows:
            await decision_store.insert(d)
        q = decision_store.query
        assert ids(await q(state="pending")) == ["d0", "d1", "d2"]
        assert ids(await q(state="expired")) == ["d3"]
        assert ids(await q(state="decided")) == []
        assert ids(await q(agent_id="a1")) == ["d0", "d2", "d3"]
        assert ids(await q(workspace="w2")) == ["d2", "d4"]
        assert ids(await q(agent_id="a1", workspace="w1")) == ["d0", "d3"]
        assert ids(await q(state="pending", agent_id="a1", workspace="w1")) == ["d0"]
        assert ids(await q(agent_id="nobody")) == []
        # filters compare exactly (no case folding, no patterns)
        assert ids(await q(agent_id="A1")) == [] and ids(await q(workspace="w%")) == []

    async def test_query_limit_keeps_the_newest(self, decision_store: DecisionStore) -> None:
        for i in range(6):
            await decision_store.insert(decision(f"d{i}", i, agent_id="a1" if i % 2 == 0 else "a2"))
        q = decision_store.query
        assert ids(await q(limit=2)) == ["d4", "d5"]
        assert ids(await q(limit=1)) == ["d5"]
        assert ids(await q(limit=100)) == [f"d{i}" for i in range(6)]
        assert await q(limit=0) == []
        # the limit counts the matching decisions
        assert ids(await q(agent_id="a1", limit=2)) == ["d2", "d4"]
        assert ids(await q(state="pending", agent_id="a2", limit=5)) == ["d1", "d3", "d5"]

    async def test_query_limit_tie_keeps_the_last_inserted(
        self, decision_store: DecisionStore
    ) -> None:
        await decision_store.insert(decision("e1", 9))
        await decision_store.insert(decision("e2", 10))
        await decision_store.insert(decision("e3", 10))
        assert ids(await decision_store.query(limit=1)) == ["e3"]
        assert ids(await decision_store.query(limit=2)) == ["e2", "e3"]

    # ---- resolve -----------------------------------------------------------------------------

    async def test_resolve_moves_a_pending_decision_once(
        self, decision_store: DecisionStore
    ) -> None:
        s = decision_store
        d = decision("d1", deadline=at(59))
        await s.insert(d)
        won = await s.resolve(
            "d1",
            state="decided",
            decided_by="alice",
            decided_at=at(3),
            option_id="allow-once",
            note="looks fine",
        )
        expected = d.model_copy(
            update={
                "state": "decided",
                "decided_by": "alice",
                "decided_at": at(3),
                "option_id": "allow-once",
                "note": "looks fine",
            }
        )
        assert won == expected
        assert await s.get("d1") == expected
        # no longer pending: nothing changes, whatever the new state
        states: tuple[DecisionState, ...] = ("cancelled", "expired", "decided")
        for state in states:
            again = await s.resolve("d1", state=state, decided_by="bob", decided_at=at(4))
            assert again is None
        assert await s.get("d1") == expected
        assert ids(await s.query(state="decided")) == ["d1"]
        assert await s.query(state="pending") == []

    async def test_resolve_records_a_rule_and_every_final_state(
        self, decision_store: DecisionStore
    ) -> None:
        s = decision_store
        for i, state in enumerate(("decided", "expired", "cancelled")):
            await s.insert(decision(f"d{i}", i))
            got = await s.resolve(
                f"d{i}",
                state=state,  # type: ignore[arg-type]
                decided_by="rule",
                decided_at=at(10),
                option_id="allow-always" if state == "decided" else None,
                rule="session:d9" if state == "decided" else None,
            )
            assert got is not None and got.state == state and got.decided_by == "rule"
            assert got.rule == ("session:d9" if state == "decided" else None)
        assert ids(await s.query(state="expired")) == ["d1"]
        assert ids(await s.query(state="cancelled")) == ["d2"]

    async def test_resolve_refuses_pending_as_target(self, decision_store: DecisionStore) -> None:
        await decision_store.insert(decision("d1"))
        with pytest.raises(ValueError):
            await decision_store.resolve("d1", state="pending", decided_by="x", decided_at="n")
        assert (await decision_store.get("d1")).state == "pending"  # type: ignore[union-attr]

    async def test_only_pending_moves(self, decision_store: DecisionStore) -> None:
        done = decision("auto", state="decided", decided_by="policy", decided_at=at(0), rule="r")
        await decision_store.insert(done)
        assert (
            await decision_store.resolve("auto", state="cancelled", decided_by="x", decided_at="n")
            is None
        )
        assert await decision_store.get("auto") == done

    async def test_concurrent_resolvers_one_wins(self, decision_store: DecisionStore) -> None:
        await decision_store.insert(decision("d1"))
        results = await asyncio.gather(
            *(
                decision_store.resolve("d1", state="decided", decided_by=f"u{i}", decided_at="n")
                for i in range(20)
            )
        )
        winners = [r for r in results if r is not None]
        assert len(winners) == 1
        stored = await decision_store.get("d1")
        assert stored is not None and stored.decided_by == winners[0].decided_by

    async def test_two_handles_race_exactly_one_wins_each(
        self, decision_store_factory: DecisionStoreFactory
    ) -> None:
        """Two replicas (or a human and a timeout on two processes) resolving the same
        decisions at once: each decision is resolved by exactly one caller, and the store
        holds what that caller wrote."""
        h1 = await decision_store_factory()
        h2 = await decision_store_factory()
        n = 8
        for i in range(n):
            await h1.insert(decision(f"d{i}", i))

        async def resolve(h: DecisionStore, who: str, i: int) -> tuple[int, Decision | None]:
            state = "decided" if who.startswith("h1") else "cancelled"
            got = await h.resolve(f"d{i}", state=state, decided_by=who, decided_at="n")  # type: ignore[arg-type]
            return i, got

        calls = [
            resolve(h, f"{name}-{k}", i)
            for i in range(n)
            for k in range(3)
            for h, name in ((h1, "h1"), (h2, "h2"))
        ]
        results = await asyncio.gather(*calls)
        for i in range(n):
            winners = [d for j, d in results if j == i and d is not None]
            assert len(winners) == 1, f"d{i}: {len(winners)} winners"
            for h in (h1, h2):
                stored = await h.get(f"d{i}")
                assert stored == winners[0]
        assert await h2.query(state="pending") == []

    # ---- reattach ----------------------------------------------------------------------------

    async def test_reattach_refreshes_a_pending_decision(
        self, decision_store: DecisionStore
    ) -> None:
        s = decision_store
        d = decision("d1", deadline=at(30), note=None)
        await s.insert(d)
        tc = DecisionToolCall(id="call-new", title="Edit again", kind="edit", input={"p": 1})
        opts = [DecisionOption(id="ok", label="OK", kind="allow_once")]
        got = await s.reattach("d1", tool_call=tc, options=opts, deadline=None)
        expected = d.model_copy(update={"tool_call": tc, "options": opts, "deadline": None})
        assert got == expected and await s.get("d1") == expected
        got = await s.reattach("d1", tool_call=tc, options=[], deadline=at(45))
        assert got is not None and got.options == [] and got.deadline == at(45)
        assert got.state == "pending" and got.created_at == d.created_at
        # once resolved, reattach changes nothing
        await s.resolve("d1", state="expired", decided_by="timeout", decided_at=at(50))
        before = await s.get("d1")
        assert (
            await s.reattach("d1", tool_call=DecisionToolCall(), options=OPTIONS, deadline=None)
            is None
        )
        assert await s.get("d1") == before

    # ---- session rules -----------------------------------------------------------------------

    async def test_session_rule_replaces_same_key(self, decision_store: DecisionStore) -> None:
        s = decision_store
        r1 = rule(decision_id="d0", created_at="1")
        r2 = rule(action="reject", decision_id="d9", created_at="2")
        await s.add_session_rule(r1)
        await s.add_session_rule(r2)  # same agent/session/kind/title: replaces
        assert await s.session_rules("a1", "s1") == [r2]
        assert r2.name == "session:d9"

    async def test_session_rules_are_per_agent_session_kind_and_title(
        self, decision_store: DecisionStore
    ) -> None:
        s = decision_store
        rules = [
            rule("Edit x", created_at="3"),
            rule("Edit y", created_at="1"),
            rule("Edit x", kind="", created_at="2"),  # a call without a kind
            rule("Edit x", session="s2", created_at="4"),
            rule("Edit x", agent="a2", created_at="5"),
        ]
        for r in rules:
            await s.add_session_rule(r)
        assert await s.session_rules("a1", "s1") == [rules[1], rules[2], rules[0]]
        assert await s.session_rules("a1", "s2") == [rules[3]]
        assert await s.session_rules("a2", "s1") == [rules[4]]
        assert await s.session_rules("a2", "s2") == []
        assert await s.session_rules("A1", "s1") == []

    # ---- policies ----------------------------------------------------------------------------

    async def test_policies(self, decision_store: DecisionStore) -> None:
        s = decision_store
        assert await s.get_policy("ws") is None
        pol = WorkspacePolicy(
            posture="supervised",
            timeout_s=5.5,
            rules=[
                PolicyRule(action="deny", command="rm *", name="no-rm"),
                PolicyRule(action="allow", kind="read"),
                PolicyRule(action="ask", path="/etc/*", title="Edit ✓"),
            ],
        )
        await s.put_policy("ws", pol)
        assert await s.get_policy("ws") == pol
        assert await s.get_policy("other") is None
        other = WorkspacePolicy(posture="autonomous")
        await s.put_policy("other", other)
        replaced = WorkspacePolicy(timeout_s=None, rules=[])
        await s.put_policy("ws", replaced)
        assert await s.get_policy("ws") == replaced
        assert await s.get_policy("other") == other

    # ---- durability --------------------------------------------------------------------------

    async def test_survives_reopen(self, decision_store_factory: DecisionStoreFactory) -> None:
        s1 = await decision_store_factory()
        await s1.insert(decision("d0", 0))
        await s1.insert(decision("d1", 1))
        await s1.resolve("d1", state="decided", decided_by="alice", decided_at=at(2))
        r = rule(decision_id="d1")
        await s1.add_session_rule(r)
        pol = WorkspacePolicy(posture="supervised", rules=[PolicyRule(action="deny")])
        await s1.put_policy("ws", pol)
        await s1.close()
        await s1.close()  # idempotent
        s2 = await decision_store_factory()
        assert ids(await s2.query()) == ["d0", "d1"]
        assert (await s2.get("d1")).decided_by == "alice"  # type: ignore[union-attr]
        assert ids(await s2.query(state="pending")) == ["d0"]
        assert await s2.session_rules("a1", "s1") == [r]
        assert await s2.get_policy("ws") == pol
        # the resolved one stays resolved for the new handle too
        assert await s2.resolve("d1", state="cancelled", decided_by="b", decided_at="n") is None
        assert await s2.resolve("d0", state="cancelled", decided_by="b", decided_at="n")
