"""An agent as the fake caliband keeps it: `AgentEntry` (caliband's record, what runs the agent,
its worktree) and the `manifest.json` caliband keeps in the agent's session dir; the status
sets of the registry; `SpawnFailed`, the error a spawn answers with."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from prospero.core.wire.control import AgentRecord
from prospero.testkit.fake_agent import FakeAgentWorker
from prospero.types.model import AgentStatus

if TYPE_CHECKING:
    from prospero.testkit.fake_acp_listener import AcpAgentListener

ACTIVE = {AgentStatus.spawning, AgentStatus.running, AgentStatus.idle}
FLIPPABLE = {AgentStatus.running, AgentStatus.idle}


class SpawnFailed(Exception):
    """An `internal` error for the spawn reply."""


@dataclass
class AgentEntry:
    record: AgentRecord
    worker: FakeAgentWorker | None = None
    acp: AcpAgentListener | None = None
    worktree: Path | None = None
    branch: str | None = None
    git_dir: Path | None = None
    cleaned: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def write_manifest(self) -> None:
        d = Path(self.record.session_dir)
        if not d.is_dir():
            return
        data = self.record.model_dump(mode="json", exclude={"spec"})
        data["spec"] = self.record.spec.to_wire()
        tmp = d / "manifest.json.tmp"
        with contextlib.suppress(OSError):
            tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
            tmp.replace(d / "manifest.json")
