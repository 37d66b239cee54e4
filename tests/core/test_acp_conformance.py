"""The AgentDriver conformance suite (tests/conformance/agent_driver.py), run against AcpDriver
and the scripted ACP peer (prospero.testkit.fake_acp) on real Unix sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from prospero.core.drivers.base import AgentDriver, DriverOptions, DriverTarget, EventSink
from prospero.testkit import acp_scripts as S
from tests.conformance.agent_driver import SESSION, AgentDriverConformance
from tests.core.acp_support import Peer, Rig, long_texts, session_turn


def script_for(name: str) -> S.AcpScript:
    if name == "session":
        return S.AcpScript(turns=[session_turn()])
    if name == "interactive":
        return S.AcpScript(turns=[[S.text("What next?"), S.stop("end_turn")]])
    if name == "long":
        steps: S.Turn = []
        for t in long_texts():
            steps += [S.text(t), S.sleep(0.002)]
        return S.AcpScript(turns=[[*steps, S.stop("end_turn")]])
    if name == "endless":
        return S.AcpScript(turns=[[S.text("hi"), S.sleep(3600)]])
    raise KeyError(name)


class AcpHarness:
    protocol = "acp"
    supports_cancel = True
    exact_reattach = False
    extra_kinds = frozenset({"agent_init"})
    reports_tokens = False

    def __init__(self) -> None:
        self.rig = Rig()
        self.peers: dict[str, Peer] = {}

    async def start_agent(self, script: str, *, interactive: bool = False) -> DriverTarget:
        peer = await self.rig.peer(script_for(script), model=SESSION["model"])
        target = self.rig.target(peer, prompt=SESSION["prompt"], interactive=interactive)
        self.peers[target.agent_id] = peer
        return target

    def make_driver(
        self, target: DriverTarget, sink: EventSink, *, include_thinking: bool = False
    ) -> AgentDriver:
        options = DriverOptions(
            include_thinking=include_thinking, backoff_base=0.01, backoff_cap=0.05, max_failures=5
        )
        return self.rig.driver(target, sink, options)

    def inbound(self, target: DriverTarget) -> list[dict[str, Any]]:
        listener = self.peers[target.agent_id].listener
        agent = listener.agent
        if agent is None:
            return []
        frames: list[dict[str, Any]] = [
            {"type": "UserMessage", "text": p} for p in agent.prompts[1:]
        ]
        frames += [{"type": "EndInput"} for _ in agent.closes]
        return frames

    async def cut_connections(self, target: DriverTarget) -> None:
        await self.peers[target.agent_id].agent.close_connections(graceful=False)

    def expected_output(self, script: str) -> list[str]:
        if script == "long":
            return long_texts()
        raise KeyError(script)

    async def aclose(self) -> None:
        await self.rig.aclose()


class TestAcpDriverConformance(AgentDriverConformance):
    @pytest.fixture
    async def harness(self) -> AsyncIterator[AcpHarness]:
        h = AcpHarness()
        try:
            yield h
        finally:
            await h.aclose()
