"""AcpDriver against real third-party ACP agents (acp.md §14), each behind the fake caliband's
per-agent TLS + bearer-token listener (a bridge to a fresh stdio process per connection):

- the TypeScript SDK's example agent (@agentclientprotocol/sdk@1.9.0, `dist/examples/agent.js`):
  a scripted turn with 1 s pauses, a read tool call, an edit that asks permission;
- the Python SDK's example agents (`examples/echo_agent.py`, `examples/agent.py`).

Installed by tests/peers/install.sh (`.ci/run`); a missing peer fails with the install command.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from prospero.core.caliband_client import CalibandClient
from prospero.core.drivers.acp import AcpDriver
from prospero.core.drivers.base import DriverExit, DriverOptions, DriverTarget
from prospero.core.metrics import Metrics
from prospero.core.permissions import PermissionBroker
from prospero.core.transport import NetworkSecurity
from prospero.core.wire.control import Endpoint, SpawnSpec, TcpEndpoint
from prospero.testkit import peers
from prospero.testkit.certs import CertBundle, make_certs
from prospero.testkit.fake_caliband import FakeCaliband
from prospero.types.events import AgentFinished, AgentInit, ToolFinished, ToolStarted, TurnFinished
from prospero.types.model import AgentStatus
from tests.conformance.agent_driver import Recorder
from tests.core.acp_support import ScriptedBroker
from tests.support import wait_until

TOKEN = "peer-token"
PEER_T = 30.0  # the TS agent pauses 1 s between steps; node and the Python SDK start slowly
OPTS = DriverOptions(include_thinking=True, backoff_base=0.02, backoff_cap=0.1, max_failures=3)

TS_TEXT_1 = (
    "I'll help you with that. Let me start by reading some files to understand the current "
    "situation."
)
TS_TEXT_2 = " Now I understand the project structure. I need to make some changes to improve it."


@pytest.fixture(scope="module")
def certs() -> CertBundle:
    return make_certs()


class PeerRig:
    """A fake caliband (TCP + TLS + token) bridging ACP spawns to `command`."""

    def __init__(self, fake: FakeCaliband, client: CalibandClient, sec: NetworkSecurity) -> None:
        self.fake, self.client, self.sec = fake, client, sec
        self.metrics = Metrics()
        self.drivers: list[AcpDriver] = []

    async def spawn(
        self,
        rec: Recorder,
        *,
        prompt: str = "improve the config",
        interactive: bool = False,
        broker: PermissionBroker | None = None,
    ) -> tuple[AcpDriver, str]:
        spec = SpawnSpec(initial_prompt=prompt, interactive=interactive, drive_protocol="acp")
        reply = await self.client.spawn(spec)
        assert isinstance(reply.endpoint, TcpEndpoint)
        agent_id = reply.id

        async def resolve() -> Endpoint:
            return await self.client.attach(agent_id)

        target = DriverTarget(
            agent_id=agent_id,
            workspace="ws",
            resolve_endpoint=resolve,
            security=self.sec,
            interactive=interactive,
            prompt=prompt,
            working_dir="/tmp",
        )
        driver = AcpDriver(target, rec, OPTS, self.metrics, broker=broker)
        self.drivers.append(driver)
        return driver, agent_id


@asynccontextmanager
async def bridged(certs: CertBundle, command: list[str]) -> AsyncIterator[PeerRig]:
    fake = await FakeCaliband.start_tcp(
        "127.0.0.1", 0, certs.cert_pem, certs.key_pem, TOKEN, acp_command=command
    )
    sec = NetworkSecurity(ca_pem=certs.ca_pem, token=TOKEN)
    rig = PeerRig(fake, CalibandClient(fake.endpoint, sec), sec)
    try:
        yield rig
    finally:
        for d in rig.drivers:
            await d.close()
        await fake.stop()


def tools(rec: Recorder) -> list[tuple[str, str, object]]:
    out: list[tuple[str, str, object]] = []
    for e in rec.events:
        if isinstance(e, ToolStarted):
            out.append(("start", e.id, e.input))
        elif isinstance(e, ToolFinished):
            out.append(("finish", e.id, (e.ok, e.result.text if e.result else None)))
    return out


# ---- TypeScript SDK example agent ---------------------------------------------------------------


async def test_ts_agent_full_turn_with_permission_allowed(certs: CertBundle) -> None:
    async with bridged(certs, peers.ts_example_agent_command()) as rig:
        rec = Recorder()
        driver, _ = await rig.spawn(rec, broker=ScriptedBroker("allow"))
        assert await asyncio.wait_for(driver.run(), PEER_T) is DriverExit.finished
        assert rec.kinds() == [
            "agent_init",
            "output",
            "tool_started",
            "tool_finished",
            "output",
            "tool_started",
            "tool_finished",
            "output",
            "turn_finished",
            "agent_finished",
        ]
        assert tools(rec) == [
            ("start", "call_1", {"path": "/project/README.md"}),
            (
                "finish",
                "call_1",
                (True, '{"content": "# My Project\\n\\nThis is a sample project..."}'),
            ),
            (
                "start",
                "call_2",
                {"path": "/project/config.json", "content": '{"database": {"host": "new-host"}}'},
            ),
            (
                "finish",
                "call_2",
                (True, '{"success": true, "message": "Configuration updated"}'),
            ),
        ]
        assert rec.stdout()[:2] == [TS_TEXT_1, TS_TEXT_2]
        assert rec.stdout()[2].startswith(" Perfect!")
        end = rec.events[-1]
        assert isinstance(end, AgentFinished)
        assert (end.outcome, end.turns, end.cost_usd, end.usage) == ("EndOfTurn", 1, None, None)


async def test_ts_agent_default_policy_rejects(certs: CertBundle) -> None:
    async with bridged(certs, peers.ts_example_agent_command()) as rig:
        rec = Recorder()
        driver, _ = await rig.spawn(rec)  # no broker: PolicyBroker, default deny
        assert await asyncio.wait_for(driver.run(), PEER_T) is DriverExit.finished
        assert rec.stdout()[-1].startswith(" I understand you prefer not to make that change.")
        # The agent sends nothing more for a rejected call: closed at the turn's end.
        assert tools(rec)[-1] == (
            "finish",
            "call_2",
            (False, "abandoned: the turn ended (end_turn) before the tool call completed"),
        )
        end = rec.events[-1]
        assert isinstance(end, AgentFinished) and end.outcome == "EndOfTurn"


async def test_ts_agent_cancel(certs: CertBundle) -> None:
    async with bridged(certs, peers.ts_example_agent_command()) as rig:
        rec = Recorder()
        driver, _ = await rig.spawn(rec)
        task = asyncio.create_task(driver.run())
        await wait_until(lambda: rec.stdout() == [TS_TEXT_1], PEER_T, what="first text")
        await driver.cancel_turn()
        assert await asyncio.wait_for(task, PEER_T) is DriverExit.finished
        turns = [(e.turn, e.stop_reason) for e in rec.events if isinstance(e, TurnFinished)]
        assert turns == [(0, "cancelled")]
        assert all(not f[2][0] for f in tools(rec) if f[0] == "finish" and f[1] != "call_1")
        end = rec.events[-1]
        assert isinstance(end, AgentFinished) and end.outcome == "Cancelled"


async def test_ts_agent_cancel_while_permission_pending(certs: CertBundle) -> None:
    async with bridged(certs, peers.ts_example_agent_command()) as rig:
        broker = ScriptedBroker("hold")
        rec = Recorder()
        driver, _ = await rig.spawn(rec, broker=broker)
        task = asyncio.create_task(driver.run())
        await wait_until(lambda: len(broker.requests) == 1, PEER_T, what="permission asked")
        req = broker.requests[0]
        assert req.tool_call.id == "call_2" and [o.option_id for o in req.options] == [
            "allow",
            "reject",
        ]
        await driver.cancel_turn()
        assert await asyncio.wait_for(task, PEER_T) is DriverExit.finished
        # The TS agent answers end_turn after a cancelled permission; Prospero sent
        # session/cancel, so the turn is recorded as cancelled.
        turns = [(e.turn, e.stop_reason) for e in rec.events if isinstance(e, TurnFinished)]
        assert turns == [(0, "cancelled")]
        assert tools(rec)[-1] == (
            "finish",
            "call_2",
            (False, "cancelled: the turn was cancelled before the tool call completed"),
        )
        assert not any(c.startswith(" Perfect!") for c in rec.stdout())


# ---- Python SDK example agents ----------------------------------------------------------------------


async def test_python_echo_agent_interactive_session(certs: CertBundle) -> None:
    async with bridged(certs, peers.python_echo_agent_command()) as rig:
        rec = Recorder()
        driver, agent_id = await rig.spawn(rec, prompt="hello echo", interactive=True)
        task = asyncio.create_task(driver.run())
        await wait_until(lambda: rec.stdout() == ["hello echo"], PEER_T, what="echo")
        await driver.send_input("second prompt")
        await driver.end_input()
        assert await asyncio.wait_for(task, PEER_T) is DriverExit.finished
        assert rec.stdout() == ["hello echo", "second prompt"]
        turns = [(e.turn, e.stop_reason) for e in rec.events if isinstance(e, TurnFinished)]
        assert turns == [(0, "end_turn"), (1, "end_turn")]
        end = rec.events[-1]
        assert isinstance(end, AgentFinished) and (end.outcome, end.turns) == ("EndOfTurn", 2)
        # The echo agent exits on stdin EOF once the driver has gone: caliband says done.
        await wait_until(lambda: rig.fake.status_of(agent_id) == AgentStatus.done, PEER_T)


async def test_python_example_agent_full_turn(certs: CertBundle) -> None:
    async with bridged(certs, peers.python_example_agent_command()) as rig:
        rec = Recorder()
        driver, _ = await rig.spawn(rec, prompt="what is this?")
        assert await asyncio.wait_for(driver.run(), PEER_T) is DriverExit.finished
        assert rec.stdout() == ["Client sent:", "what is this?"]
        assert rec.kinds() == ["agent_init", "output", "output", "turn_finished", "agent_finished"]
        init = rec.events[0]
        assert isinstance(init, AgentInit) and init.session_id == "0"


async def test_ts_agent_hard_stop_mid_turn_restart_closes_the_open_call_never_reprompts(
    certs: CertBundle,
) -> None:
    """Issue 9 item 11 against the real TS agent (no `loadSession`): prosperod dies (-9) while
    call_1 is open; the restarted driver closes call_1, records the turn lost once, and
    finishes NotResumable — without a second session/new or prompt."""
    from acp.connection import StreamEvent

    from prospero.core.drivers.acp import registry
    from tests.core.acp_support import MemoryCursorStore

    async with bridged(certs, peers.ts_example_agent_command()) as rig:
        rec = Recorder()
        d1, agent_id = await rig.spawn(rec, broker=ScriptedBroker("allow"))
        store = MemoryCursorStore()
        target = d1.target
        await d1.close()  # (the spawn helper's driver has no store: use one that does)
        registry._REGISTRY.pop(agent_id, None)
        sent: list[str] = []

        def wire(ev: StreamEvent) -> None:
            method = ev.message.get("method")
            if ev.direction.value == "outgoing" and isinstance(method, str):
                sent.append(method)

        d1 = AcpDriver(target, rec, OPTS, rig.metrics, store, observers=[wire])
        t1 = asyncio.create_task(d1.run())
        await wait_until(lambda: "tool_started" in rec.kinds(), PEER_T, what="call_1 open")
        t1.cancel()  # kill -9: nothing more is emitted or saved by this driver
        with pytest.raises(asyncio.CancelledError):
            await t1
        registry._REGISTRY.pop(agent_id, None)
        assert sent.count("session/prompt") == 1
        before = len(rec.events)

        d2 = AcpDriver(target, rec, OPTS, rig.metrics, store, observers=[wire])
        rig.drivers.append(d2)
        assert await asyncio.wait_for(d2.run(), PEER_T) is DriverExit.finished
        new = rec.events[before:]
        assert [e.kind for e in new] == [
            "tool_finished",
            "turn_lost",
            "stream_gap",
            "agent_finished",
        ]
        fin = new[0]
        assert isinstance(fin, ToolFinished) and fin.id == "call_1" and not fin.ok
        end = new[-1]
        assert isinstance(end, AgentFinished) and end.outcome == "NotResumable"
        assert sent.count("session/prompt") == 1 and sent.count("session/new") == 1
