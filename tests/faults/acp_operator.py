"""The ACP agent of the clustered SIGKILL suite: its script, an operator that steers it only
through replicas that do *not* drive it (so every answer and input crosses the relay), and the
verdict on its history.

The script marks every chunk with the index of the prompt the agent is playing (`T<i>.<j>`; the
fake agent counts prompts over its whole life, across connections). So a history whose turn `t`
shows marker `i > t` means the agent was prompted more often than the driver recorded turns — a
turn driven twice. (`i < t` is legal: a prompt committed as sent, then lost with its replica
before it reached the agent, is recorded `turn_lost` without the agent seeing it.)"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from prospero.testkit import acp_scripts as S
from tests.support import wait_until

TURNS = 60
CHUNKS = 8
PACE = 0.12  # seconds between chunks: a turn streams for ~1 s
MARK = re.compile(r"T(\d+)\.")
TERMINAL = ("turn_finished", "turn_lost")


def acp_script() -> S.AcpScript:
    first: S.Turn = [
        S.text("T0.start "),
        S.tool_call("edit", "Edit src/app.py", "edit", raw_input={"path": "src/app.py"}),
        S.permission(
            "edit",
            title="Edit src/app.py",
            kind="edit",
            raw_input={"path": "src/app.py"},
            on_allow=[
                S.tool_update("edit", status="completed", raw_output="ok"),
                S.text("T0.done "),
            ],
            on_reject=[S.tool_update("edit", status="failed"), S.text("T0.rejected ")],
        ),
    ]
    turns = [first]
    for i in range(1, TURNS):
        turn: S.Turn = []
        for j in range(CHUNKS):
            turn += [S.text(f"T{i}.{j} "), S.sleep(PACE)]
        turns.append(turn)
    return S.AcpScript(turns=turns)


Holder = Callable[[str], Awaitable[str | None]]


@dataclass
class AcpOperator:
    """Answers the agent's permission request and feeds it inputs, always through a replica
    other than its owner."""

    agent: str
    urls: Callable[[], dict[str, str]]  # live replica id -> URL
    holder: Holder
    sent: int = 0
    answered_via: str | None = None
    routed: list[str] = field(default_factory=list)  # "<op> via <replica> (owner <owner>)"
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _other(self) -> tuple[str, str, str] | None:
        owner = await self.holder(self.agent)
        urls = self.urls()
        if owner is None or owner not in urls:
            return None
        others = sorted(r for r in urls if r != owner)
        if not others:
            return None
        return others[self.sent % len(others)], urls[others[self.sent % len(others)]], owner

    async def events(self) -> list[dict[str, Any]]:
        for url in list(self.urls().values()):
            with contextlib.suppress(httpx.HTTPError):
                async with httpx.AsyncClient(base_url=url, timeout=10) as c:
                    r = await c.get(f"/api/agents/{self.agent}/events")
                    if r.status_code == 200:
                        return list(r.json())
        return []

    async def _post(self, path: str, body: dict[str, Any] | None, op: str) -> int | None:
        via = await self._other()
        if via is None:
            return None
        rid, url, owner = via
        try:
            async with httpx.AsyncClient(
                base_url=url, timeout=30, headers={"X-Prospero-Client": "test"}
            ) as c:
                r = await c.post(path, json=body)
        except httpx.HTTPError:
            return None
        if r.status_code < 300:
            self.routed.append(f"{op} via {rid} (owner {owner})")
        return r.status_code

    async def answer(self, decision_id: str, within: float = 30.0) -> None:
        """Allow the decision through a non-owner; retried while no replica can take it
        (no owner yet, 503) until `within`."""

        async def answered() -> bool:
            code = await self._post(
                f"/api/decisions/{decision_id}", {"option_id": "allow-once"}, "answer"
            )
            assert code in (None, 200, 503), code
            if code == 200:
                self.answered_via = self.routed[-1]
            return code == 200

        await wait_until(answered, within, interval=0.05, what="the answer through a non-owner")

    async def drive(self) -> None:
        """Input k once k turns have ended (spawn prompt = turn 0); resend an input that a
        dead owner took with it (no new turn after a takeover)."""
        waiting_since: float | None = None
        owner_then: str | None = None
        loop = asyncio.get_running_loop()
        while not self.stop.is_set():
            events = await self.events()
            kinds = [e["kind"]["kind"] for e in events]
            if "agent_finished" in kinds:
                return
            done = sum(k in TERMINAL for k in kinds)
            if done >= self.sent + 1 and self.sent + 1 < TURNS:
                code = await self._post(
                    f"/api/agents/{self.agent}/input", {"text": f"step {self.sent + 1}"}, "input"
                )
                if code == 202:
                    self.sent += 1
                    waiting_since, owner_then = loop.time(), await self.holder(self.agent)
            elif waiting_since is not None and done < self.sent + 1:
                owner = await self.holder(self.agent)
                if owner is not None and owner != owner_then and loop.time() - waiting_since > 3:
                    self.sent -= 1  # the input died queued in its old owner: send it again
                    waiting_since = None
            # The operator's pace: look again in 0.1 s, or leave at once when told to stop.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 0.1)

    async def end(self, within: float = 60.0) -> None:
        async def ended() -> bool:
            path = f"/api/agents/{self.agent}/end-input"
            return await self._post(path, None, "end-input") == 202

        await wait_until(ended, within, interval=0.1, what="end-input through a non-owner")


def check_acp(events: list[dict[str, Any]]) -> list[str]:
    """Problems in the ACP agent's history (empty: none)."""
    problems: list[str] = []
    seqs = [e["seq"] for e in events]
    if seqs != list(range(1, len(seqs) + 1)):
        problems.append(f"acp: seqs are not 1..{len(seqs)}")
    kinds = [e["kind"]["kind"] for e in events]
    if kinds.count("agent_finished") != 1:
        problems.append(f"acp: {kinds.count('agent_finished')} agent_finished")
    turn = 0
    seen_mark = -1
    for e in events:
        k = e["kind"]
        if k["kind"] in TERMINAL:
            if k.get("turn") != turn:
                problems.append(f"acp: {k['kind']} for turn {k.get('turn')}, expected {turn}")
            turn += 1
        elif k["kind"] == "output":
            for m in MARK.findall(k.get("chunk", "")):
                i = int(m)
                if i > turn:
                    problems.append(f"acp: turn {turn} shows prompt {i}: a turn driven twice")
                if i < seen_mark:
                    problems.append(f"acp: prompt {i} after prompt {seen_mark}: replayed")
                seen_mark = max(seen_mark, i)
    return problems
