"""The ACP driver's resume state: what a restarted prosperod needs to rejoin a session without
driving any turn twice (docs/adr/0005 decision 6, issue 9 deliverable 6).

`AcpResumeState` is typed and versioned (`v`). The driver never mutates it directly: the
ordered output folds every event it hands to the sink into the state (`apply`), plus explicit
marks queued between events (`begin_turn`, `set_cost`, ...), and commits the state together
with the batch it covers (`_AgentSink.emit_batch(kinds, cursor=state.dump())`). So the stored
state always describes exactly the stored history: a turn is "in flight" in the store iff its
prompt was committed as sent and neither its `turn_finished` nor its `turn_lost` is stored;
the open tool calls are those whose `tool_started` is stored without a `tool_finished`.

Version 1 (issue 4) states are read and upgraded: they lack `initial_prompt_sent` (derived
from `turns > 0`) and `open_tools` (empty: a v1 crash left no record of them).
"""

from __future__ import annotations

import logging

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prospero.types.events import (
    AgentFinished,
    AgentInit,
    EventKind,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnLost,
    Usage,
)

log = logging.getLogger(__name__)

STATE_VERSION = 2
PROTOCOL = "acp"
MAX_OPEN_TOOLS = 256


class OpenTool(BaseModel):
    """A tool call whose `tool_started` is stored and whose `tool_finished` is not."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str = ""


class AcpResumeState(BaseModel):
    model_config = ConfigDict(validate_assignment=False)

    v: int = STATE_VERSION
    protocol: str = PROTOCOL
    session_id: str | None = None
    # Prompts committed as sent on the session (the next turn's 0-based index).
    turns: int = 0
    # The spawn prompt went out (or was committed as about to): never send it again.
    initial_prompt_sent: bool = False
    # The turn whose prompt was sent and whose end is not stored.
    in_flight: int | None = None
    open_tools: list[OpenTool] = Field(default_factory=list)
    terminal: bool = False
    outcome: str | None = None
    last_stop: str | None = None
    last_detail: str | None = None
    model: str | None = None
    cost_total: float | None = None
    usage_total: Usage | None = None

    # ---- folding -----------------------------------------------------------------------------

    def apply(self, ev: EventKind) -> None:
        """Fold one event handed to the sink into the state."""
        if isinstance(ev, ToolStarted):
            if not any(t.id == ev.id for t in self.open_tools):
                self.open_tools.append(OpenTool(id=ev.id, name=ev.name))
                del self.open_tools[:-MAX_OPEN_TOOLS]
        elif isinstance(ev, ToolFinished):
            self.open_tools = [t for t in self.open_tools if t.id != ev.id]
        elif isinstance(ev, TurnFinished):
            self.in_flight = None
            self.open_tools = []
            self.last_stop = ev.stop_reason
            if ev.usage is not None:
                self.usage_total = (
                    ev.usage if self.usage_total is None else self.usage_total.plus(ev.usage)
                )
            if ev.model:
                self.model = ev.model
        elif isinstance(ev, TurnLost):
            self.in_flight = None
            self.open_tools = []
            self.last_stop = "lost"
            self.last_detail = f"turn {ev.turn} was lost: {ev.reason}"
        elif isinstance(ev, AgentInit):
            if ev.session_id:
                self.session_id = ev.session_id
            if ev.model:
                self.model = ev.model
        elif isinstance(ev, AgentFinished):
            self.terminal = True
            self.in_flight = None
            self.open_tools = []
            self.outcome = ev.outcome

    def begin_turn(self, turn: int, *, initial: bool) -> None:
        self.turns = max(self.turns, turn + 1)
        self.in_flight = turn
        self.open_tools = []
        if initial:
            self.initial_prompt_sent = True

    # ---- persistence -------------------------------------------------------------------------

    def dump(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"))

    def copy_state(self) -> AcpResumeState:
        return self.model_copy(deep=True)

    @classmethod
    def load(cls, data: bytes | None, agent_id: str = "") -> AcpResumeState | None:
        """Parse stored bytes; None (logged) when absent, unreadable or of another driver."""
        if not data:
            return None
        try:
            raw = orjson.loads(data)
            if not isinstance(raw, dict):
                raise ValueError("not an object")
            if raw.get("protocol") != PROTOCOL:
                raise ValueError(f"state of a {raw.get('protocol')!r} driver")
            version = raw.get("v")
            if version == 1:
                raw = _upgrade_v1(raw)
            elif version != STATE_VERSION:
                raise ValueError(f"unsupported state version {version!r}")
            return cls.model_validate(raw)
        except (ValueError, orjson.JSONDecodeError, ValidationError) as e:
            log.warning("agent %s: ignoring unreadable ACP session state: %s", agent_id, e)
            return None


def _upgrade_v1(raw: dict[str, object]) -> dict[str, object]:
    out = {k: v for k, v in raw.items() if k in AcpResumeState.model_fields}
    out["v"] = STATE_VERSION
    turns = raw.get("turns")
    out["initial_prompt_sent"] = isinstance(turns, int) and turns > 0
    out["open_tools"] = []
    cost = raw.get("cost_total")
    if isinstance(cost, bool) or not isinstance(cost, int | float):
        out["cost_total"] = None
    return out
