"""FleetProvider conformance: what every lifecycle backend (LocalFleet, a Kubernetes fleet)
must do. A test module subclasses `FleetProviderConformance` and provides a `harness` fixture
implementing `FleetHarness`.

The suite speaks only the seam's types (`core/fleet/records.py`: `AgentSpec`, `ListedAgent`,
`SpawnOutcome`; the transport's `Address`) and Prospero's errors (`FleetUnreachable`, ...).

Where a backend's semantics differ by design, the harness says so in `expect`
(`FleetExpectations`) and the suite checks that provider's own behaviour instead: nothing is
skipped. Kubernetes (K8sFleet): the agent's name is its CR name, kill and rm delete the CR (no
record is left to refuse or to be `killed`), respawn re-applies the same CR name, an
identical spawn finds the same CR (`created` False), the CR keeps the spawn's posture, and an
agent's address is only known once `attach` has asked its pod.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import pytest

from prospero.core.errors import AgentNotFound, FleetUnreachable, InvalidState
from prospero.core.fleet.provider import FleetProvider
from prospero.core.fleet.records import AgentSpec, ListedAgent, SpawnOutcome
from prospero.core.transport import TcpAddress, UnixAddress
from prospero.types.model import AgentStatus, RegisteredWorkspace
from tests.support import wait_until


@dataclass(frozen=True)
class FleetExpectations:
    # the record's name is the spec's label (else: the agent id, e.g. a CR name)
    label_names_agent: bool = True
    # kill leaves a `killed` record (else: the agent is gone from the listing)
    kill_keeps_record: bool = True
    # respawn assigns a new id (else: the same id, a fresh run)
    respawn_new_id: bool = True
    # rm without force refuses an active agent (else: it removes it)
    rm_refuses_active: bool = True
    # an identical second spawn makes a second agent (else: it finds the first, created False)
    identical_spawn_creates: bool = True
    # the backend keeps the spawn's permission posture (else: it is never sent to it)
    keeps_posture: bool = False
    # listings and spawn outcomes carry the agent's address (else: None until `attach`)
    lists_address: bool = True


class FleetHarness(Protocol):
    provider: FleetProvider
    workspace: RegisteredWorkspace
    expect: FleetExpectations

    def received_specs(self) -> list[AgentSpec]:
        """What reached the backend, as the seam's specs (LocalFleet: what caliband was
        sent; K8sFleet: what each CR stands for)."""
        ...

    async def make_unreachable(self) -> None: ...

    async def end(self, agent_id: str) -> None:
        """Bring the agent to a terminal status by the backend's own means."""
        ...

    def long_running_spec(self, **overrides: object) -> AgentSpec:
        """A spec whose agent stays running until killed (`overrides`: AgentSpec fields)."""
        ...


class FleetProviderConformance:
    async def _status(self, h: FleetHarness, agent_id: str) -> AgentStatus | None:
        for rec in await h.provider.list_agents(h.workspace):
            if rec.id == agent_id:
                return rec.status
        return None

    async def test_spawn_lists_agent_with_its_spec(self, harness: FleetHarness) -> None:
        spec = harness.long_running_spec(label="conf-a", tool_allowlist=["Read", "Edit"], interactive=True)
        reply = await harness.provider.spawn(harness.workspace, spec)
        assert isinstance(reply, SpawnOutcome) and reply.id
        records = {r.id: r for r in await harness.provider.list_agents(harness.workspace)}
        assert reply.id in records
        rec = records[reply.id]
        assert isinstance(rec, ListedAgent) and isinstance(rec.spec, AgentSpec)
        name = "conf-a" if harness.expect.label_names_agent else reply.id
        assert rec.name == name
        assert rec.spec.tool_allowlist == ("Read", "Edit")
        assert rec.spec.interactive is True
        assert rec.spec.prompt == spec.prompt
        assert rec.status in (AgentStatus.spawning, AgentStatus.running, AgentStatus.idle)
        assert any(s.label == name and s.prompt == spec.prompt for s in harness.received_specs())

    async def test_a_spawn_outcome_says_created(self, harness: FleetHarness) -> None:
        spec = harness.long_running_spec(label="twice")
        first = await harness.provider.spawn(harness.workspace, spec)
        assert first.created is True
        again = await harness.provider.spawn(harness.workspace, spec)
        if harness.expect.identical_spawn_creates:
            assert (again.created, again.id != first.id) == (True, True)
        else:  # the same agent, found: the manager records no second spawn
            assert (again.created, again.id) == (False, first.id)
        listed = [r.id for r in await harness.provider.list_agents(harness.workspace)]
        assert first.id in listed and again.id in listed

    async def test_the_posture_reaches_only_a_backend_that_keeps_it(
        self, harness: FleetHarness
    ) -> None:
        spec = harness.long_running_spec(label="postured", posture="autonomous")
        reply = await harness.provider.spawn(harness.workspace, spec)
        received = [s for s in harness.received_specs() if s.prompt == spec.prompt]
        assert received
        want = "autonomous" if harness.expect.keeps_posture else None
        assert {s.posture for s in received} == {want}
        assert any(r.id == reply.id for r in await harness.provider.list_agents(harness.workspace))

    async def test_addresses_are_prosperos_or_not_known_yet(self, harness: FleetHarness) -> None:
        reply = await harness.provider.spawn(harness.workspace, harness.long_running_spec())
        rec = {r.id: r for r in await harness.provider.list_agents(harness.workspace)}[reply.id]
        if harness.expect.lists_address:
            assert isinstance(reply.address, UnixAddress | TcpAddress)
            assert isinstance(rec.address, UnixAddress | TcpAddress)
        else:  # explicitly unknown until `attach` asks (never a fake empty address)
            assert reply.address is None and rec.address is None

    async def test_attach_resolves_endpoint(self, harness: FleetHarness) -> None:
        reply = await harness.provider.spawn(harness.workspace, harness.long_running_spec())

        async def running() -> bool:
            return await self._status(harness, reply.id) == AgentStatus.running

        await wait_until(running, 10, what="status running")
        address = await harness.provider.attach(harness.workspace, reply.id)
        assert isinstance(address, UnixAddress | TcpAddress)
        assert address.scheme in ("unix", "tcp")

    async def test_unknown_ids_are_not_found(self, harness: FleetHarness) -> None:
        for op in (
            harness.provider.attach(harness.workspace, "nope"),
            harness.provider.kill(harness.workspace, "nope"),
            harness.provider.respawn(harness.workspace, "nope"),
            harness.provider.remove(harness.workspace, "nope", True),
        ):
            with pytest.raises(AgentNotFound):
                await op

    async def test_kill_marks_killed(self, harness: FleetHarness) -> None:
        reply = await harness.provider.spawn(harness.workspace, harness.long_running_spec())
        await harness.provider.kill(harness.workspace, reply.id)
        want = AgentStatus.killed if harness.expect.kill_keeps_record else None

        async def killed() -> bool:
            return await self._status(harness, reply.id) == want

        await wait_until(killed, 10, what=f"status {want}")

    async def test_respawn_gives_new_id_with_same_spec(self, harness: FleetHarness) -> None:
        reply = await harness.provider.spawn(harness.workspace, harness.long_running_spec(label="re"))
        await harness.end(reply.id)
        assert await self._status(harness, reply.id) in (AgentStatus.killed, AgentStatus.done)
        new_id = await harness.provider.respawn(harness.workspace, reply.id)
        records = {r.id: r for r in await harness.provider.list_agents(harness.workspace)}
        if harness.expect.respawn_new_id:
            assert new_id != reply.id
            assert new_id in records and reply.id not in records
            assert records[new_id].spec.label == "re"
        else:
            assert new_id == reply.id and new_id in records
            assert not records[new_id].status.terminal  # a fresh run under the same id
            assert records[new_id].spec.prompt == "long task"

    async def test_rm_refuses_active_without_force(self, harness: FleetHarness) -> None:
        reply = await harness.provider.spawn(harness.workspace, harness.long_running_spec())
        if harness.expect.rm_refuses_active:
            with pytest.raises(InvalidState):
                await harness.provider.remove(harness.workspace, reply.id, False)
            await harness.provider.remove(harness.workspace, reply.id, True)
        else:
            await harness.provider.remove(harness.workspace, reply.id, False)
        assert await self._status(harness, reply.id) is None

    async def test_rm_terminal_without_force(self, harness: FleetHarness) -> None:
        reply = await harness.provider.spawn(harness.workspace, harness.long_running_spec())
        await harness.end(reply.id)
        await harness.provider.remove(harness.workspace, reply.id, False)
        assert await self._status(harness, reply.id) is None

    async def test_unreachable_is_typed(self, harness: FleetHarness) -> None:
        """The seam's own error, whatever the backend's transport said (caliband's socket,
        the Kubernetes API server)."""
        await harness.make_unreachable()
        with pytest.raises(FleetUnreachable) as listing:
            await harness.provider.list_agents(harness.workspace)
        assert listing.value.kind == "unreachable" and str(listing.value)
        with pytest.raises(FleetUnreachable):
            await harness.provider.spawn(harness.workspace, harness.long_running_spec())
        with pytest.raises(FleetUnreachable):
            await harness.provider.kill(harness.workspace, "nope")
