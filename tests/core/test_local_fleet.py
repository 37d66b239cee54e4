"""LocalFleet against a fake caliband found by socket discovery: the FleetProvider suite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from prospero.core.fleet.local import LocalFleet
from prospero.core.wire.control import SpawnSpec
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

    def received_specs(self) -> list[SpawnSpec]:
        return list(self.env.fake.received_specs)

    async def make_unreachable(self) -> None:
        await self.env.fake.stop()

    async def end(self, agent_id: str) -> None:
        await self.provider.kill(self.workspace, agent_id)

    def long_running_spec(self, **overrides: object) -> SpawnSpec:
        data: dict[str, object] = {"initial_prompt": "long task", "isolation_worktree": False}
        data.update(overrides)
        return SpawnSpec.model_validate(data)


@pytest.fixture
async def harness(fleet_env: FleetEnv) -> AsyncIterator[LocalHarness]:
    provider = local_fleet()
    yield LocalHarness(fleet_env, provider, fleet_env.workspace)
    await provider.close()


class TestLocalFleet(FleetProviderConformance):
    pass


async def test_isolated_spawn_creates_a_real_worktree(harness: LocalHarness) -> None:
    reply = await harness.provider.spawn(
        harness.workspace, harness.long_running_spec(isolation_worktree=True)
    )
    rec = {r.id: r for r in await harness.provider.list_agents(harness.workspace)}[reply.id]
    assert "/.caliban/worktrees/" in rec.working_dir
    assert (harness.env.root / ".caliban" / "worktrees").is_dir()


async def test_autostart_off_reports_clear_error(harness: LocalHarness) -> None:
    from prospero.core.errors import CalibandUnreachable

    other = RegisteredWorkspace(name="ghost", root="/nonexistent/ghost-root")
    with pytest.raises(CalibandUnreachable, match="autostart is off"):
        await harness.provider.list_agents(other)


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
