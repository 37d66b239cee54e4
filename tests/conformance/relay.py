"""CommandRelay conformance: what every relay between replicas (MemoryRelay, PgRelay) must do.

A test module subclasses `RelayConformance` and provides `relay_factory`: an async callable
`make(replica_id)` returning a new, not yet started relay of one replica on the *same* medium
(one hub, one database); the fixture closes what it made at teardown.

Pinned here (core/relay/base.py): a call runs once, on its target only, and its value comes
back; the handler's error comes back with its kind and message; a call nobody takes is withdrawn
at its deadline (`taken=False`) and never runs afterwards; a call taken but not answered in time
is reported `taken=True`; concurrent calls each run exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from prospero.core.errors import InvalidState
from prospero.core.relay import CommandRelay, RelayedCall, RelayedError, RelayUnanswered
from tests.support import wait_until

RelayFactory = Callable[[str], Awaitable[CommandRelay]]


class Recorder:
    """A handler that records what it ran; `gate` (when set) holds each call until opened."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.calls: list[RelayedCall] = []
        self.gate = gate

    async def __call__(self, call: RelayedCall) -> Any:
        self.calls.append(call)
        if self.gate is not None:
            await self.gate.wait()
        if call.op == "kill":
            raise InvalidState("kill", call.agent_id, "done", "the agent has already finished")
        if call.op == "cancel_turn":
            raise RuntimeError("a bug in the handler")
        return {"echo": call.args, "agent": call.agent_id}


class RelayConformance:
    async def test_a_call_runs_on_its_target_and_returns_its_value(
        self, relay_factory: RelayFactory
    ) -> None:
        a, b, c = [await relay_factory(r) for r in ("a", "b", "c")]
        ra, rb, rc = Recorder(), Recorder(), Recorder()
        await a.start(ra)
        await b.start(rb)
        await c.start(rc)
        value = await a.call("b", "agent-1", "send_input", {"text": "héllo\nthere"}, timeout=10)
        assert value == {"echo": {"text": "héllo\nthere"}, "agent": "agent-1"}
        assert [(x.op, x.agent_id, x.target) for x in rb.calls] == [
            ("send_input", "agent-1", "b")
        ]
        assert ra.calls == [] and rc.calls == []
        # A replica may address itself (the call then runs here, through the same path).
        assert await b.call("b", "agent-2", "end_input", timeout=10) == {
            "echo": {},
            "agent": "agent-2",
        }

    async def test_the_handlers_error_comes_back_with_its_kind(
        self, relay_factory: RelayFactory
    ) -> None:
        a, b = await relay_factory("a"), await relay_factory("b")
        await a.start(Recorder())
        await b.start(Recorder())
        with pytest.raises(RelayedError) as err:
            await a.call("b", "agent-1", "kill", timeout=10)
        assert err.value.kind == "invalid_state"
        assert "has already finished" in str(err.value)
        with pytest.raises(RelayedError) as err:
            await a.call("b", "agent-1", "cancel_turn", timeout=10)
        assert err.value.kind == "internal"
        assert "a bug in the handler" in str(err.value)

    async def test_a_call_nobody_takes_is_withdrawn_and_never_runs(
        self, relay_factory: RelayFactory
    ) -> None:
        a, b = await relay_factory("a"), await relay_factory("b")
        await a.start(Recorder())
        with pytest.raises(RelayUnanswered) as err:
            await a.call("b", "agent-1", "send_input", {"text": "x"}, timeout=0.6)
        assert err.value.taken is False
        assert "nothing was done" in str(err.value)
        assert err.value.kind == "unreachable"
        late = Recorder()
        await b.start(late)  # b comes up after the caller gave up
        # ... and a fresh call reaches it (so it is taking calls), the withdrawn one never.
        await a.call("b", "agent-1", "end_input", timeout=10)
        assert [x.op for x in late.calls] == ["end_input"]

    async def test_a_call_taken_but_not_answered_says_it_may_have_been_applied(
        self, relay_factory: RelayFactory
    ) -> None:
        a, b = await relay_factory("a"), await relay_factory("b")
        gate = asyncio.Event()
        stuck = Recorder(gate)
        await a.start(Recorder())
        await b.start(stuck)
        try:
            with pytest.raises(RelayUnanswered) as err:
                await a.call("b", "agent-1", "send_input", {"text": "x"}, timeout=1.0)
            assert err.value.taken is True
            assert "may have been applied" in str(err.value)
            assert len(stuck.calls) == 1
        finally:
            gate.set()

    async def test_concurrent_calls_each_run_exactly_once(
        self, relay_factory: RelayFactory
    ) -> None:
        a, b, c = [await relay_factory(r) for r in ("a", "b", "c")]
        rb = Recorder()
        await a.start(Recorder())
        await b.start(rb)
        await c.start(Recorder())
        n = 20
        results = await asyncio.gather(
            *(
                (a if i % 2 else c).call("b", f"agent-{i}", "send_input", {"i": i}, timeout=15)
                for i in range(n)
            )
        )
        assert sorted(r["echo"]["i"] for r in results) == list(range(n))

        async def all_ran() -> bool:
            return len(rb.calls) == n

        await wait_until(all_ran, 5.0, what="every call run")
        assert sorted(x.args["i"] for x in rb.calls) == list(range(n))
