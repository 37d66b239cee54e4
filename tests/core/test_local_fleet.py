"""LocalFleet against a fake caliband found by socket discovery: the FleetProvider suite."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from prospero.core.errors import FleetUnreachable
from prospero.core.fleet.local import LocalFleet, agent_spec_from_wire, wire_spec
from prospero.core.fleet.records import AgentSpec
from prospero.core.wire.control import CALIBAND_SPEC_FIELDS
from prospero.types.model import RegisteredWorkspace
from tests.conformance.fleet_provider import FleetExpectations, FleetProviderConformance
from tests.core.fleet_fixtures import FleetEnv, fleet_env, local_fleet

__all__ = ["fleet_env"]


@dataclass
class LocalHarness:
    env: FleetEnv
    provider: LocalFleet
    workspace: RegisteredWorkspace
    expect: FleetExpectations = field(default_factory=FleetExpectations)

    def received_specs(self) -> list[AgentSpec]:
        return [agent_spec_from_wire(s) for s in self.env.fake.received_specs]

    async def make_unreachable(self) -> None:
        await self.env.fake.stop()

    async def end(self, agent_id: str) -> None:
        await self.provider.kill(self.workspace, agent_id)

    def long_running_spec(self, **overrides: object) -> AgentSpec:
        return AgentSpec(**{"prompt": "long task", "worktree": False, **overrides})  # type: ignore[arg-type]


@pytest.fixture
async def harness(fleet_env: FleetEnv) -> AsyncIterator[LocalHarness]:
    provider = local_fleet()
    yield LocalHarness(fleet_env, provider, fleet_env.workspace)
    await provider.close()


class TestLocalFleet(FleetProviderConformance):
    pass


async def test_isolated_spawn_creates_a_real_worktree(harness: LocalHarness) -> None:
    reply = await harness.provider.spawn(
        harness.workspace, harness.long_running_spec(worktree=True)
    )
    rec = {r.id: r for r in await harness.provider.list_agents(harness.workspace)}[reply.id]
    assert "/.caliban/worktrees/" in rec.working_dir
    assert (harness.env.root / ".caliban" / "worktrees").is_dir()


async def test_autostart_off_reports_clear_error(harness: LocalHarness) -> None:
    other = RegisteredWorkspace(name="ghost", root="/nonexistent/ghost-root")
    with pytest.raises(FleetUnreachable, match="autostart is off"):
        await harness.provider.list_agents(other)


def test_caliband_is_sent_its_own_fields_only() -> None:
    """The posture is Prospero's (AgentMeta) and K8sFleet's (the CR): caliband has no such
    field, so LocalFleet never sends it; the rest crosses both ways unchanged."""
    spec = AgentSpec(
        prompt="p",
        label="l",
        frontmatter_path="/defs/agent.md",
        model="m",
        provider="anthropic",
        tool_allowlist=("Read",),
        worktree=True,
        interactive=True,
        source="app",
        drive_protocol="acp",
        posture="autonomous",
    )
    sent = wire_spec(spec)
    assert set(sent.to_wire()) <= CALIBAND_SPEC_FIELDS
    assert "posture" not in sent.to_wire()
    assert agent_spec_from_wire(sent) == dataclasses.replace(spec, posture=None)


async def test_an_unchanged_listing_is_not_decoded_again(harness: LocalHarness) -> None:
    """Issue 11 (idle cost): a `list` reply byte-identical to the last one returns the same
    records; any change in caliband's reply is decoded afresh."""
    reply = await harness.provider.spawn(harness.workspace, harness.long_running_spec())
    first = await harness.provider.list_agents(harness.workspace)
    again = await harness.provider.list_agents(harness.workspace)
    assert [r.id for r in again] == [r.id for r in first]
    assert all(a is b for a, b in zip(again, first, strict=True))
    harness.env.fake.set_status(reply.id, "idle")
    changed = {r.id: r for r in await harness.provider.list_agents(harness.workspace)}
    assert changed[reply.id].status.value == "idle"
