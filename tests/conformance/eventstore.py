"""EventStore and ConfigStore conformance: what every store backend (SQLite now, PostgreSQL
later) must do.

A test module subclasses `EventStoreConformance` and provides a `store_factory` fixture: an async
callable that opens and returns a new handle on the *same* backing database, fresh for each test
(calling it twice = a restart). The fixture closes every handle it opened at teardown;
`close()` must be idempotent. Likewise `ConfigStoreConformance` with `config_store_factory`.

Semantics pinned here beyond base.py's docstrings:
- ordinals are strictly increasing and never reused, even after prune removed the newest rows;
- `high_water` never goes backwards: pruning a whole stream does not make its seqs reusable;
- usage aggregates survive prune (retention deletes raw events only);
- usage is per turn: tokens, cost and turns from each `turn_finished`, one run and its outcome
  from each `agent_finished` (never its totals);
- `append_batch(cursors=)` writes the cursors in the same transaction as the events, or not;
- a poison event (one that cannot be serialised) is stored in its reduced form, its batch
  intact, and replaced by it in the caller's list.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest

from prospero.core.errors import SeqConflict
from prospero.core.store.base import ConfigStore, EventStore, UsageDay
from prospero.types.events import (
    AgentDiscovered,
    AgentFinished,
    AgentGone,
    AgentInit,
    AgentSpawned,
    EventKind,
    FleetEvent,
    Output,
    RepoHealth,
    StatusChanged,
    StorePersistFailed,
    StreamGap,
    ToolFinished,
    ToolResult,
    ToolStarted,
    TurnFinished,
    Usage,
)
from prospero.types.model import (
    AgentStatus,
    Healthy,
    RegisteredWorkspace,
    RepoProviderConfig,
    Unreachable,
)

StoreFactory = Callable[[], Awaitable[EventStore]]
ConfigStoreFactory = Callable[[], Awaitable[ConfigStore]]

DAY1 = "2026-01-01"
DAY2 = "2026-01-02"
DAY3 = "2026-01-03"


def ts(day: str, clock: str = "12:00:00.000000") -> str:
    return f"{day}T{clock}+00:00"


def ev(
    agent: str,
    seq: int,
    kind: EventKind | None = None,
    *,
    repo: str = "ws",
    at: str | None = None,
) -> FleetEvent:
    return FleetEvent(
        seq=seq,
        ts=at or ts(DAY1),
        repo=repo,
        agent_id=agent,
        kind=kind if kind is not None else Output(chunk=f"{agent}#{seq}"),
    )


def status(to: AgentStatus, frm: AgentStatus = AgentStatus.running) -> StatusChanged:
    return StatusChanged(from_=frm, to=to)


def finished(
    turns: int = 1,
    cost: float | None = None,
    usage: Usage | None = None,
    outcome: str = "EndOfTurn",
    detail: str | None = None,
) -> AgentFinished:
    return AgentFinished(outcome=outcome, turns=turns, cost_usd=cost, usage=usage, detail=detail)


def turn(cost: float | None = None, usage: Usage | None = None, n: int = 0) -> TurnFinished:
    return TurnFinished(turn=n, stop_reason="EndOfTurn", usage=usage, cost_usd=cost)


ALL_KINDS: list[EventKind] = [
    AgentSpawned(),
    AgentDiscovered(),
    AgentInit(model="m", tools=["Read", "Edit"], session_id="s1"),
    StatusChanged(from_=AgentStatus.spawning, to=AgentStatus.running),
    Output(chunk="hello\n"),
    Output(stream="thinking", chunk="hmm … ünïcödé"),
    ToolStarted(id="t1", name="bash", input={"cmd": "ls", "args": [1, 2.5, None, True]}),
    ToolStarted(id="t2", name="edit", input="not json {"),
    ToolStarted(id="t3", name="noop"),
    ToolFinished(id="t1", ok=False, result=ToolResult(text="boom", truncated=True)),
    ToolFinished(id="t3"),
    TurnFinished(
        turn=2,
        stop_reason="EndOfTurn",
        model="claude",
        usage=Usage(input_tokens=5, output_tokens=7, cache_read_input_tokens=3),
        cost_usd=0.25,
    ),
    AgentFinished(
        outcome="EndOfTurn",
        cost_usd=None,
        turns=4,
        usage=Usage(input_tokens=1, output_tokens=2),
        model="claude",
        detail="x",
    ),
    AgentGone(),
    StorePersistFailed(lost_seq=7, detail="disk full"),
    RepoHealth(state=Healthy()),
    RepoHealth(state=Unreachable(reason="refused")),
    StreamGap(missing=None, detail="cursor lost"),
    StreamGap(missing=3),
]


class EventStoreConformance:
    @pytest.fixture
    async def store(self, store_factory: StoreFactory) -> EventStore:
        return await store_factory()

    # -- append / replay -------------------------------------------------------------------

    async def test_empty_store(self, store: EventStore) -> None:
        assert await store.replay("a") == []
        assert await store.replay_fleet() == []
        assert await store.high_water("a") == 0
        assert await store.last_ordinal() == 0
        assert await store.append_batch([]) == []

    async def test_every_kind_round_trips(self, store: EventStore) -> None:
        events = [ev("a", i + 1, k) for i, k in enumerate(ALL_KINDS)]
        await store.append_batch(events)
        assert await store.replay("a") == events

    async def test_append_returns_increasing_ordinals_matching_fleet_replay(
        self, store: EventStore
    ) -> None:
        o1 = await store.append_batch([ev("a", 1), ev("b", 1), ev("a", 2)])
        o2 = await store.append_batch([ev("b", 2)])
        ordinals = o1 + o2
        assert len(ordinals) == 4
        assert ordinals == sorted(ordinals) and len(set(ordinals)) == 4
        fleet = await store.replay_fleet()
        assert [s.ordinal for s in fleet] == ordinals
        assert [(s.event.agent_id, s.event.seq) for s in fleet] == [
            ("a", 1),
            ("b", 1),
            ("a", 2),
            ("b", 2),
        ]
        assert await store.last_ordinal() == ordinals[-1]

    async def test_replay_is_per_stream_ascending_with_from_and_limit(
        self, store: EventStore
    ) -> None:
        await store.append_batch([ev("a", 1), ev("b", 1), ev("a", 2)])
        await store.append_batch([ev("a", 3), ev("b", 2), ev("a", 4)])
        assert [e.seq for e in await store.replay("a")] == [1, 2, 3, 4]
        assert [e.seq for e in await store.replay("b")] == [1, 2]
        assert [e.seq for e in await store.replay("a", from_seq=3)] == [3, 4]
        assert [e.seq for e in await store.replay("a", from_seq=2, limit=2)] == [2, 3]
        assert [e.seq for e in await store.replay("a", from_seq=5)] == []
        assert await store.replay("nobody") == []
        assert all(e.agent_id == "b" for e in await store.replay("b"))

    async def test_replay_filtered_by_kind(self, store: EventStore) -> None:
        events = [ev("a", i + 1, k) for i, k in enumerate(ALL_KINDS)]
        await store.append_batch([*events, ev("b", 1, TurnFinished(turn=0))])
        wanted = {"turn_finished", "agent_finished"}
        expected = [e for e in events if e.kind.kind in wanted]
        assert len(expected) >= 2
        assert await store.replay("a", kinds=wanted) == expected
        assert await store.replay("a", kinds=wanted, limit=1) == expected[:1]
        after = expected[0].seq + 1
        assert await store.replay("a", from_seq=after, kinds=wanted) == expected[1:]
        assert await store.replay("a", kinds=["output"]) == [
            e for e in events if e.kind.kind == "output"
        ]
        assert await store.replay("a", kinds=[]) == []
        assert await store.replay("a", kinds=["no_such_kind"]) == []

    async def test_stream_keys_for_repo_and_fleet_events(self, store: EventStore) -> None:
        repo_ev = FleetEvent(seq=1, ts=ts(DAY1), repo="ws", agent_id="", kind=AgentGone())
        fleet_ev = FleetEvent(seq=1, ts=ts(DAY1), repo="", agent_id="", kind=AgentGone())
        await store.append_batch([repo_ev, fleet_ev, ev("ws", 1)])
        assert await store.replay("repo:ws") == [repo_ev]
        assert await store.replay("fleet") == [fleet_ev]
        assert await store.high_water("repo:ws") == 1
        assert await store.high_water("ws") == 1  # an agent id, not the repo stream

    async def test_replay_fleet_after_ordinal_and_limit(self, store: EventStore) -> None:
        ordinals = await store.append_batch([ev(f"s{i % 3}", i // 3 + 1) for i in range(9)])
        tail = await store.replay_fleet(after_ordinal=ordinals[4])
        assert [s.ordinal for s in tail] == ordinals[5:]
        page = await store.replay_fleet(after_ordinal=ordinals[1], limit=3)
        assert [s.ordinal for s in page] == ordinals[2:5]
        assert await store.replay_fleet(after_ordinal=ordinals[-1]) == []

    # -- raw reads (bytes, as the API sends them) -------------------------------------------

    async def test_raw_replay_is_the_events_json(self, store: EventStore) -> None:
        """`replay_raw` / `replay_fleet_raw`: the same events as `replay` / `replay_fleet`,
        each byte-identical to `orjson.dumps(event.to_json())` (what the API sent before)."""
        odd = FleetEvent(
            seq=1,
            ts='t"\\\n\u2028\x01',
            repo='w\u00e9 "x"',
            agent_id="a\tb",
            kind=Output(chunk="\x00 \x7f"),
        )
        events = [ev("a", i + 1, k) for i, k in enumerate(ALL_KINDS)]
        await store.append_batch([*events, ev("b", 1, turn(cost=1e-7)), odd])
        for key in ("a", "b", "a\tb"):
            replayed = await store.replay(key)
            raw = await store.replay_raw(key)
            assert [r.data for r in raw] == [orjson.dumps(e.to_json()) for e in replayed]
            assert [(r.cursor, r.seq, r.kind) for r in raw] == [
                (e.seq, e.seq, e.kind.kind) for e in replayed
            ]
        fleet = await store.replay_fleet()
        raw_fleet = await store.replay_fleet_raw()
        assert [r.data for r in raw_fleet] == [orjson.dumps(s.event.to_json()) for s in fleet]
        assert [(r.cursor, r.seq) for r in raw_fleet] == [(s.ordinal, s.event.seq) for s in fleet]

    async def test_raw_replay_from_limit_and_kinds(self, store: EventStore) -> None:
        events = [ev("a", i + 1, k) for i, k in enumerate(ALL_KINDS)]
        ordinals = await store.append_batch(events)
        wanted = {"turn_finished", "agent_finished"}
        for kw in ({"from_seq": 3}, {"from_seq": 2, "limit": 2}, {"kinds": wanted}, {"limit": 1}):
            raw = await store.replay_raw("a", **kw)  # type: ignore[arg-type]
            assert [r.seq for r in raw] == [e.seq for e in await store.replay("a", **kw)]  # type: ignore[arg-type]
        assert await store.replay_raw("a", kinds=[]) == []
        assert await store.replay_raw("nobody") == []
        page = await store.replay_fleet_raw(after_ordinal=ordinals[1], limit=3)
        assert [r.cursor for r in page] == ordinals[2:5]
        assert await store.replay_fleet_raw(after_ordinal=ordinals[-1]) == []
        picked = await store.replay_fleet_raw(kinds=wanted)
        assert [r.kind for r in picked] == [e.kind.kind for e in events if e.kind.kind in wanted]
        assert [r.cursor for r in picked] == [
            o for o, e in zip(ordinals, events, strict=True) if e.kind.kind in wanted
        ]
        assert len(await store.replay_fleet_raw(kinds=wanted, limit=1)) == 1
        assert await store.replay_fleet_raw(kinds=[]) == []

    async def test_large_batch(self, store: EventStore) -> None:
        events = [ev(f"s{i % 7}", i // 7 + 1) for i in range(2000)]
        ordinals = await store.append_batch(events)
        assert len(ordinals) == 2000
        assert len(await store.replay_fleet()) == 2000
        assert await store.high_water("s0") == 286

    # -- seq uniqueness ------------------------------------------------------------------

    async def test_duplicate_seq_raises_seq_conflict_and_writes_nothing(
        self, store: EventStore
    ) -> None:
        await store.append_batch([ev("a", 1), ev("a", 2)])
        before_last = await store.last_ordinal()
        bad = [
            ev("b", 1),
            ev("a", 3, finished(turns=5, cost=1.0), at=ts(DAY2)),
            ev("a", 2),  # already stored
            ev("a", 4),
        ]
        with pytest.raises(SeqConflict):
            await store.append_batch(bad)
        assert [e.seq for e in await store.replay("a")] == [1, 2]
        assert await store.replay("b") == []
        assert await store.high_water("a") == 2
        assert await store.high_water("b") == 0
        assert await store.last_ordinal() == before_last
        assert await store.usage(DAY1, DAY3) == []

    async def test_duplicate_within_one_batch_is_a_conflict(self, store: EventStore) -> None:
        with pytest.raises(SeqConflict):
            await store.append_batch([ev("a", 1), ev("a", 1, Output(chunk="other"))])
        assert await store.replay("a") == []
        # Same seq on different streams is fine.
        await store.append_batch([ev("a", 1), ev("b", 1)])
        assert await store.high_water("a") == 1 and await store.high_water("b") == 1

    async def test_store_usable_after_conflict(self, store: EventStore) -> None:
        await store.append_batch([ev("a", 1)])
        with pytest.raises(SeqConflict):
            await store.append_batch([ev("a", 1)])
        ords = await store.append_batch([ev("a", 2)])
        assert [e.seq for e in await store.replay("a")] == [1, 2]
        assert ords == [await store.last_ordinal()]

    # -- high water / restart ------------------------------------------------------------

    async def test_high_water(self, store: EventStore) -> None:
        assert await store.high_water("a") == 0
        await store.append_batch([ev("a", 1), ev("a", 2), ev("b", 1)])
        await store.append_batch([ev("a", 3)])
        assert await store.high_water("a") == 3
        assert await store.high_water("b") == 1

    async def test_state_survives_reopen(self, store_factory: StoreFactory) -> None:
        s1 = await store_factory()
        o1 = await s1.append_batch([ev("a", 1), ev("a", 2), ev("b", 1)])
        await s1.save_cursor("a", b"\x00cursor")
        await s1.close()
        s2 = await store_factory()
        assert await s2.high_water("a") == 2
        assert await s2.high_water("b") == 1
        assert await s2.last_ordinal() == o1[-1]
        assert [e.seq for e in await s2.replay("a")] == [1, 2]
        assert await s2.load_cursor("a") == b"\x00cursor"
        o2 = await s2.append_batch([ev("a", 3)])
        assert o2[0] > o1[-1]
        with pytest.raises(SeqConflict):
            await s2.append_batch([ev("b", 1)])

    # -- prune ---------------------------------------------------------------------------

    async def test_prune_deletes_strictly_older_by_string_compare(self, store: EventStore) -> None:
        await store.append_batch(
            [
                ev("a", 1, at=ts(DAY1, "00:00:00.000000")),
                ev("a", 2, at=ts(DAY1, "23:59:59.999999")),
                ev("b", 1, at=ts(DAY2, "00:00:00.000000")),
                ev("a", 3, at=ts(DAY2, "00:00:00.000001")),
                ev("b", 2, at=ts(DAY3)),
            ]
        )
        n = await store.prune(ts(DAY2, "00:00:00.000000"))
        assert n == 2
        assert [e.seq for e in await store.replay("a")] == [3]
        assert [e.seq for e in await store.replay("b")] == [1, 2]  # equal ts is kept
        assert await store.prune(ts(DAY2, "00:00:00.000000")) == 0
        assert len(await store.replay_fleet()) == 3

    async def test_prune_keeps_seqs_and_ordinals_unique(self, store: EventStore) -> None:
        o1 = await store.append_batch([ev("a", 1), ev("a", 2)])
        assert await store.prune(ts(DAY3)) == 2
        assert await store.replay_fleet() == []
        # The stream's seqs are not reusable and new ordinals continue after the old ones.
        assert await store.high_water("a") == 2
        o2 = await store.append_batch([ev("a", 3)])
        assert o2[0] > o1[-1]

    async def test_prune_leaves_usage_aggregates(self, store: EventStore) -> None:
        await store.append_batch([ev("a", 1, turn(cost=0.5)), ev("a", 2, turn())])
        assert await store.prune(ts(DAY3)) == 2
        [row] = await store.usage(DAY1, DAY1)
        assert row.turns == 2 and row.cost_usd == 0.5

    # -- usage ---------------------------------------------------------------------------
    # Tokens, cost and turns come from each turn_finished, as the turn ends (whatever the
    # agent's state); agent_finished counts one run and its outcome, never its own totals.

    async def test_usage_not_reported_stays_null(self, store: EventStore) -> None:
        await store.append_batch([ev("a", 1, turn()), ev("a", 2, turn())])
        await store.append_batch([ev("b", 1, turn()), ev("b", 2, finished(turns=1))])
        assert await store.usage(DAY1, DAY1) == [
            UsageDay(
                workspace="ws",
                day=DAY1,
                turns=3,
                runs=1,
                outcomes={"done": 1, "failed": 0, "killed": 0, "crashed": 0, "budget_exceeded": 0},
            )
        ]

    async def test_usage_sums_reported_values(self, store: EventStore) -> None:
        u1 = Usage(input_tokens=100, output_tokens=10)
        u2 = Usage(input_tokens=50, output_tokens=5)
        # Within one batch and across batches; an unreported turn does not zero the sums.
        await store.append_batch(
            [ev("a", 1, turn()), ev("b", 1, turn(cost=0.5, usage=u1)), ev("b", 2, turn())]
        )
        await store.append_batch([ev("c", 1, turn(cost=0.25, usage=u2))])
        await store.append_batch([ev("d", 1, turn(cost=0.0))])
        [row] = await store.usage(DAY1, DAY1)
        assert row.input_tokens == 150
        assert row.output_tokens == 15
        assert row.cost_usd == pytest.approx(0.75)
        assert row.turns == 5
        assert row.runs == 0
        assert row.outcomes == {
            "done": 0,
            "failed": 0,
            "killed": 0,
            "crashed": 0,
            "budget_exceeded": 0,
        }

    async def test_usage_agent_finished_counts_the_run_not_its_totals(
        self, store: EventStore
    ) -> None:
        u = Usage(input_tokens=10, output_tokens=1)
        await store.append_batch(
            [
                ev("a", 1, turn(cost=0.5, usage=u)),
                ev("a", 2, turn(cost=0.25, usage=u)),
                # The run's own totals repeat its turns': not counted again.
                ev("a", 3, finished(turns=2, cost=0.75, usage=u.plus(u))),
            ]
        )
        [row] = await store.usage(DAY1, DAY1)
        assert (row.turns, row.runs, row.cost_usd) == (2, 1, 0.75)
        assert (row.input_tokens, row.output_tokens) == (20, 2)
        assert row.outcomes["done"] == 1

    async def test_usage_counts_turns_of_running_and_killed_agents(self, store: EventStore) -> None:
        u = Usage(input_tokens=7, output_tokens=3)
        await store.append_batch(
            [  # still running: no agent_finished yet
                ev("running", 1, status(AgentStatus.running, AgentStatus.spawning)),
                ev("running", 2, turn(cost=0.1, usage=u)),
                ev("running", 3, turn(cost=0.1, usage=u)),
                # killed mid-run: its finished turns count, the kill is its outcome
                ev("killed", 1, turn(cost=0.2, usage=u)),
                ev("killed", 2, finished(turns=0, outcome="killed")),
                ev("killed", 3, status(AgentStatus.killed)),
            ]
        )
        [row] = await store.usage(DAY1, DAY1)
        assert row.turns == 3
        assert row.cost_usd == pytest.approx(0.4)
        assert (row.input_tokens, row.output_tokens) == (21, 9)
        assert row.runs == 1
        assert row.outcomes == {
            "done": 0,
            "failed": 0,
            "killed": 1,
            "crashed": 0,
            "budget_exceeded": 0,
        }

    async def test_usage_reported_zero_is_not_null(self, store: EventStore) -> None:
        await store.append_batch(
            [ev("a", 1, turn(cost=0.0, usage=Usage(input_tokens=0, output_tokens=0)))]
        )
        [row] = await store.usage(DAY1, DAY1)
        assert row.cost_usd == 0.0 and row.input_tokens == 0 and row.output_tokens == 0

    async def test_usage_outcomes_once_per_run_from_agent_finished(self, store: EventStore) -> None:
        await store.append_batch(
            [
                ev("a", 1, status(AgentStatus.running, AgentStatus.spawning)),
                ev("a", 2, status(AgentStatus.idle)),
                ev("a", 3, finished(outcome="EndOfTurn")),
                ev("a", 4, status(AgentStatus.done)),
                ev("a", 5, status(AgentStatus.killed, AgentStatus.done)),  # never counts
                ev("b", 1, finished(outcome="MaxTurnsReached")),
                ev("b", 2, status(AgentStatus.failed)),
                ev("c", 1, finished(outcome="killed")),
                ev("d", 1, finished(outcome="crashed", detail="worker died")),
                ev("e", 1, finished(outcome="ProviderError", detail="overloaded")),
                ev("f", 1, status(AgentStatus.done)),  # a status alone is no run
                ev("g", 1, finished(outcome="budget_exceeded", detail="stopped at its budget")),
            ]
        )
        [row] = await store.usage(DAY1, DAY1)
        assert row.outcomes == {
            "done": 1,
            "failed": 2,
            "killed": 1,
            "crashed": 1,
            "budget_exceeded": 1,
        }
        assert row.runs == 6 and row.turns == 0
        assert row.cost_usd is None and row.input_tokens is None

    async def test_usage_outcome_without_cost_is_a_row(self, store: EventStore) -> None:
        await store.append_batch([ev("a", 1, finished(turns=0, outcome="killed"))])
        assert await store.usage(DAY1, DAY1) == [
            UsageDay(
                workspace="ws",
                day=DAY1,
                runs=1,
                outcomes={"done": 0, "failed": 0, "killed": 1, "crashed": 0, "budget_exceeded": 0},
            )
        ]

    async def test_usage_groups_per_workspace_per_utc_day(self, store: EventStore) -> None:
        await store.append_batch(
            [
                ev("a", 1, turn(cost=1.0), repo="zeta", at=ts(DAY1, "23:59:59.999999")),
                ev("a", 2, turn(cost=2.0), repo="zeta", at=ts(DAY2, "00:00:00.000000")),
                ev("a", 3, turn(), repo="zeta", at=ts(DAY2, "00:00:00.000000")),
                ev("b", 1, turn(), repo="alpha", at=ts(DAY2)),
                ev("b", 2, finished(), repo="alpha", at=ts(DAY3)),
                ev("c", 1, Output(chunk="only output"), repo="quiet", at=ts(DAY2)),
                ev("c", 2, ToolStarted(id="x"), repo="quiet", at=ts(DAY2)),
            ]
        )
        rows = await store.usage(DAY1, DAY3)
        assert [(r.workspace, r.day) for r in rows] == [
            ("alpha", DAY2),
            ("alpha", DAY3),
            ("zeta", DAY1),
            ("zeta", DAY2),
        ]
        by = {(r.workspace, r.day): r for r in rows}
        assert by["zeta", DAY1].cost_usd == 1.0 and by["zeta", DAY1].turns == 1
        assert by["zeta", DAY2].cost_usd == 2.0 and by["zeta", DAY2].turns == 2
        assert by["alpha", DAY2].cost_usd is None and by["alpha", DAY2].turns == 1
        assert by["alpha", DAY3].outcomes["done"] == 1 and by["alpha", DAY3].runs == 1
        assert by["alpha", DAY3].turns == 0

    async def test_usage_window_is_inclusive_days(self, store: EventStore) -> None:
        await store.append_batch(
            [
                ev("a", 1, turn(), at=ts(DAY1)),
                ev("a", 2, turn(), at=ts(DAY2)),
                ev("a", 3, turn(), at=ts(DAY3)),
            ]
        )
        assert [r.day for r in await store.usage(DAY2, DAY2)] == [DAY2]
        assert [r.day for r in await store.usage(DAY1, DAY2)] == [DAY1, DAY2]
        assert [r.day for r in await store.usage(DAY2, "2026-12-31")] == [DAY2, DAY3]
        assert await store.usage("2025-01-01", "2025-12-31") == []

    # -- cursors / writable --------------------------------------------------------------

    async def test_cursors(self, store: EventStore) -> None:
        assert await store.load_cursor("a") is None
        await store.save_cursor("a", b"one")
        await store.save_cursor("b", b"\x00\xff binary")
        assert await store.load_cursor("a") == b"one"
        await store.save_cursor("a", b"two")
        assert await store.load_cursor("a") == b"two"
        assert await store.load_cursor("b") == b"\x00\xff binary"
        await store.save_cursor("c", b"")
        assert await store.load_cursor("c") == b""

    async def test_cursors_commit_with_their_events(self, store_factory: StoreFactory) -> None:
        s1 = await store_factory()
        await s1.append_batch([ev("a", 1), ev("b", 1)], cursors={"a": b"after a1", "b": b"b1"})
        assert await s1.load_cursor("a") == b"after a1"
        await s1.append_batch([ev("a", 2)], cursors={"a": b"after a2"})
        await s1.close()
        s2 = await store_factory()
        assert [e.seq for e in await s2.replay("a")] == [1, 2]
        assert await s2.load_cursor("a") == b"after a2"
        assert await s2.load_cursor("b") == b"b1"

    async def test_cursor_of_a_failed_append_is_not_written(self, store: EventStore) -> None:
        await store.append_batch([ev("a", 1)], cursors={"a": b"after a1"})
        with pytest.raises(SeqConflict):
            await store.append_batch([ev("a", 2), ev("a", 1)], cursors={"a": b"after a2"})
        assert await store.load_cursor("a") == b"after a1"
        assert [e.seq for e in await store.replay("a")] == [1]

    async def test_cursors_without_events(self, store: EventStore) -> None:
        assert await store.append_batch([], cursors={"a": b"\x00moved"}) == []
        assert await store.load_cursor("a") == b"\x00moved"
        assert await store.last_ordinal() == 0
        await store.append_batch([], cursors={"a": b""})
        assert await store.load_cursor("a") == b""

    # -- poison events ---------------------------------------------------------------------

    async def test_poison_events_are_stored_reduced_without_failing_neighbours(
        self, store: EventStore
    ) -> None:
        deep: dict[str, Any] = {}
        cur = deep
        for _ in range(500):
            cur["a"] = {}
            cur = cur["a"]
        batch = [
            ev("a", 1, Output(chunk="before")),
            ev("a", 2, ToolStarted(id="t", name="Write", input=deep)),
            ev("a", 3, Output(chunk="lone \ud800 surrogate")),
            ev("a", 4, ToolStarted(id="u", input={"n": 2**70, "s": "x\udfff"})),
            ev("a", 5, Output(chunk="after")),
            ev("a", 6, turn(cost=0.5)),
        ]
        ordinals = await store.append_batch(batch)
        assert len(ordinals) == 6
        back = await store.replay("a")
        assert [e.seq for e in back] == [1, 2, 3, 4, 5, 6]
        assert back[0] == batch[0] and back[4] == batch[4] and back[5] == batch[5]
        tool = back[1].kind
        assert isinstance(tool, ToolStarted) and (tool.id, tool.name) == ("t", "Write")
        assert tool.input["_reduced"] is True
        depth, value = 0, tool.input["value"]
        while isinstance(value, dict):
            depth, value = depth + 1, value["a"]
        assert isinstance(value, str) and value.startswith("_reduced")
        assert 1 <= depth <= 100
        text = back[2].kind
        assert isinstance(text, Output) and text.chunk == "lone \\ud800 surrogate"
        odd = back[3].kind
        assert isinstance(odd, ToolStarted)
        assert odd.input == {"_reduced": True, "value": {"n": str(2**70), "s": "x\\udfff"}}
        # What was stored is what the caller got back to publish.
        assert batch == back
        for e in back:  # every surface can write them
            orjson.dumps(e.to_json())
            e.model_dump_json()
        [row] = await store.usage(DAY1, DAY1)
        assert row.turns == 1 and row.cost_usd == 0.5

    async def test_every_kind_survives_reduction_unchanged(self, store: EventStore) -> None:
        # Reduction only ever touches what cannot be serialised.
        events = [ev("a", i + 1, k) for i, k in enumerate(ALL_KINDS)]
        copy = list(events)
        await store.append_batch(copy)
        assert copy == events
        assert await store.replay("a") == events

    async def test_writable_and_probe_leaves_no_trace(self, store: EventStore) -> None:
        assert await store.writable() is True
        assert await store.writable() is True
        assert await store.last_ordinal() == 0
        assert await store.replay_fleet() == []
        o = await store.append_batch([ev("a", 1)])
        assert await store.last_ordinal() == o[0]

    # -- scan_kinds (incremental folds over many streams) ----------------------------------

    async def test_scan_kinds_from_scratch(self, store: EventStore) -> None:
        wanted = {"turn_finished", "agent_finished"}
        batch = [
            ev("a", 1),
            ev("a", 2, turn(cost=0.5, usage=Usage(input_tokens=3, output_tokens=4))),
            ev("b", 1, turn()),
            ev("c", 1, turn(cost=1.0)),  # not asked for
            ev("a", 3, finished(outcome="killed")),
            ev("b", 2),
        ]
        await store.append_batch(batch)
        scan = await store.scan_kinds(["a", "b", "nobody"], wanted)
        assert scan.last_ordinal == await store.last_ordinal()
        assert scan.heads == {"a": 3, "b": 2, "nobody": 0}
        picked = [e for e in batch if e.agent_id in "ab" and e.kind.kind in wanted]
        assert [(k, seq) for k, seq, _ in scan.rows] == [(e.agent_id, e.seq) for e in picked]
        for (_, _, raw), e in zip(scan.rows, picked, strict=True):
            assert orjson.loads(raw) == e.to_json()["kind"]
        empty = await store.scan_kinds(["a"], [])
        assert empty.rows == [] and empty.heads == {"a": 3}

    async def test_scan_kinds_reads_only_what_is_new(self, store: EventStore) -> None:
        wanted = {"turn_finished"}
        await store.append_batch([ev("a", 1, turn()), ev("b", 1, turn()), ev("c", 1, turn())])
        first = await store.scan_kinds(["a", "b"], wanted)
        mark = first.last_ordinal
        idle = await store.scan_kinds(["a", "b"], wanted, after_ordinal=mark, known=["a", "b"])
        assert (idle.last_ordinal, idle.heads, idle.rows) == (mark, {}, [])
        new = await store.append_batch(
            [ev("a", 2), ev("c", 2, turn(cost=0.25)), ev("a", 3, turn(cost=2.0)), ev("d", 1)]
        )
        scan = await store.scan_kinds(["a", "b", "c"], wanted, after_ordinal=mark, known=["a", "b"])
        assert scan.last_ordinal == new[-1]
        # c is new to the caller: its older events too, first (ascending ordinal); b did not move.
        assert [(k, seq) for k, seq, _ in scan.rows] == [("c", 1), ("c", 2), ("a", 3)]
        assert orjson.loads(scan.rows[2][2]) == turn(cost=2.0).model_dump(mode="json")
        assert scan.heads == {"a": 3, "c": 2}

    async def test_scan_kinds_heads_survive_prune(self, store: EventStore) -> None:
        await store.append_batch([ev("a", 1, turn()), ev("a", 2)])
        mark = await store.last_ordinal()
        assert await store.prune(ts(DAY3)) == 2
        scan = await store.scan_kinds(["a"], {"turn_finished"})
        assert scan.heads == {"a": 2} and scan.rows == []
        # Never below the caller's mark, even when retention deleted the newest rows.
        later = await store.scan_kinds(["a"], {"turn_finished"}, after_ordinal=mark, known=["a"])
        assert later.last_ordinal >= mark and later.rows == [] and later.heads == {}


class ConfigStoreConformance:
    @pytest.fixture
    async def config_store(self, config_store_factory: ConfigStoreFactory) -> ConfigStore:
        return await config_store_factory()

    async def test_empty(self, config_store: ConfigStore) -> None:
        assert await config_store.list_workspaces() == []
        assert await config_store.delete_workspace("nope") is False

    async def test_list_in_name_order(self, config_store: ConfigStore) -> None:
        for name in ("mid", "zed", "Alpha", "alpha"):
            await config_store.upsert_workspace(RegisteredWorkspace(name=name, root=f"/r/{name}"))
        names = [w.name for w in await config_store.list_workspaces()]
        assert names == sorted(names) == ["Alpha", "alpha", "mid", "zed"]

    async def test_upsert_replaces_and_round_trips_config(self, config_store: ConfigStore) -> None:
        await config_store.upsert_workspace(RegisteredWorkspace(name="w", root="/old"))
        cfg = RepoProviderConfig(
            provider="anthropic",
            base_url="https://example.invalid",
            api_key_from_env="MY_KEY",
            env={"A": "1", "B": "two words"},
        )
        new = RegisteredWorkspace(name="w", root="/new", config=cfg)
        await config_store.upsert_workspace(new)
        assert await config_store.list_workspaces() == [new]
        await config_store.upsert_workspace(RegisteredWorkspace(name="w", root="/new"))
        [back] = await config_store.list_workspaces()
        assert back.config == RepoProviderConfig()

    async def test_delete(self, config_store: ConfigStore) -> None:
        await config_store.upsert_workspace(RegisteredWorkspace(name="a", root="/a"))
        await config_store.upsert_workspace(RegisteredWorkspace(name="b", root="/b"))
        assert await config_store.delete_workspace("a") is True
        assert await config_store.delete_workspace("a") is False
        assert [w.name for w in await config_store.list_workspaces()] == ["b"]

    async def test_survives_reopen(self, config_store_factory: ConfigStoreFactory) -> None:
        s1 = await config_store_factory()
        ws = RegisteredWorkspace(name="w", root="/w", config=RepoProviderConfig(env={"K": "V"}))
        await s1.upsert_workspace(ws)
        s2 = await config_store_factory()
        assert await s2.list_workspaces() == [ws]
