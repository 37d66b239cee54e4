"""Declarative fault plans for the fake caliban worker, and the scripts the fault suite plays.

A `FaultPlan` says what goes wrong on one agent's attach stream, in terms of the worker's own
line count `n` (every line written so far, injected bad frames included, 1-based):

- `cut_at` / `cut_every`: right after line `n` is written, every connected reader is cut
  (transport aborted: what a dropped network path looks like). Lines still queued for that
  reader are lost *to it*; the worker keeps playing.
- `refuse_ms`: after each cut, the endpoint refuses connections for that long (the listener is
  closed, so a dial gets ECONNREFUSED — a Unix socket file stays in place, dead — then it
  listens again on the same address). `refuse_until_exit`: after the first cut, it never listens again, so the worker
  ends its run while nobody is connected ("exit while detached"; after the exit the Unix socket
  is unlinked as usual).
- `slow_readers`: at line `at`, the readers connected then stop reading for the next `lines`
  lines. The worker's per-reader broadcast queue (1024 deep, like caliban's tokio broadcast)
  then loses its *oldest* lines for that reader, silently, and the reader continues with what
  is left — exactly caliban's lag behaviour. Nothing is lost from the ring or the transcript.
- `crash_at`: right after line `n`, the worker exits with `crash_code` (non-zero) without
  writing `RunEnd` — a worker whose stream errored.
- `bad_frames`: after line `after` (0 = before the first), write `count` bad lines of a kind:
  `malformed` (not JSON), `oversized` (one line over 1 MiB), `unknown_type` (a well-formed
  object with a `type` no vocabulary knows).
- `line_delay`: pacing of this agent's lines (seconds), instead of the caliband's default.

Everything a worker writes still goes to `<session_dir>/stdout.ndjson`, bad lines included,
and the plan changes nothing else: same replay ring, same exit codes, same linger and unlink.

Scripts: `periodic_script` (period 1 = thousands of identical deltas), `mixed_script`
(distinct lines around an identical run longer than the replay ring), plus the builders in
`prospero.testkit.scripts`. `wire_lines(script)` is what a worker playing it writes.

`Scenario` (JSON, `fake_caliband --scenario FILE`) picks a script and a plan per spawn by the
prompt's first word, for a fake caliband running as a process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field

from prospero.core.transport import MAX_LINE
from prospero.testkit import scripts

BadFrameKind = Literal["malformed", "oversized", "unknown_type"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SlowReader(_Model):
    at: int = Field(ge=0)
    lines: int = Field(ge=1)


class BadFrames(_Model):
    after: int = Field(ge=0)
    kind: BadFrameKind
    count: int = Field(default=1, ge=1)


class FaultPlan(_Model):
    cut_at: tuple[int, ...] = ()
    cut_every: int | None = Field(default=None, ge=1)
    refuse_ms: int = Field(default=0, ge=0)
    refuse_until_exit: bool = False
    slow_readers: tuple[SlowReader, ...] = ()
    crash_at: int | None = Field(default=None, ge=0)
    crash_code: int = Field(default=1, ge=1, le=255)
    bad_frames: tuple[BadFrames, ...] = ()
    line_delay: float | None = Field(default=None, ge=0)

    def cuts_after(self, n: int) -> bool:
        return n in self.cut_at or (self.cut_every is not None and n % self.cut_every == 0)

    def bad_lines_after(self, n: int) -> list[bytes]:
        out: list[bytes] = []
        for b in self.bad_frames:
            if b.after == n:
                out += [bad_line(b.kind, i) for i in range(b.count)]
        return out

    def describe(self) -> str:
        parts = []
        if self.cut_at:
            parts.append(f"cut@{','.join(map(str, self.cut_at))}")
        if self.cut_every:
            parts.append(f"cut/{self.cut_every}")
        if self.refuse_ms:
            parts.append(f"refuse{self.refuse_ms}ms")
        if self.refuse_until_exit:
            parts.append("refuse-until-exit")
        for s in self.slow_readers:
            parts.append(f"slow@{s.at}+{s.lines}")
        if self.crash_at is not None:
            parts.append(f"crash@{self.crash_at}")
        for b in self.bad_frames:
            parts.append(f"{b.kind}x{b.count}@{b.after}")
        return " ".join(parts) or "no-fault"


def bad_line(kind: BadFrameKind, i: int = 0) -> bytes:
    if kind == "malformed":
        return b'{"type":"AssistantTextDelta","text":"unterminated ' + str(i).encode()
    if kind == "oversized":
        return (
            b'{"type":"AssistantTextDelta","turn_index":0,"text":"' + b"x" * (MAX_LINE + 64) + b'"}'
        )
    return orjson.dumps({"type": "FromTheFuture", "turn_index": 0, "n": i})


# --- applying a plan to a running worker ---------------------------------------------------


class Reader(Protocol):
    """A connected reader as the worker keeps it: `stalled` holds its live queue back."""

    stalled: bool
    wake: asyncio.Event


class PlannedWorker(Protocol):
    """What a FaultRunner needs of the worker it acts on (FakeAgentWorker)."""

    @property
    def exiting(self) -> bool: ...

    def readers(self) -> Iterable[Reader]: ...

    def cut_connections(self) -> None: ...

    def stop_listening(self) -> None: ...

    async def listen_again(self) -> None: ...

    def write_line(self, line: bytes) -> None: ...


class FaultRunner:
    """Applies a FaultPlan to one worker: the worker calls `after_line(n)` right after
    writing its line `n`, and `close()` when it exits."""

    def __init__(self, plan: FaultPlan, worker: PlannedWorker) -> None:
        self.plan = plan
        self.worker = worker
        self.cuts = 0
        self.refused_windows = 0
        self._stalls: dict[int, list[Reader]] = {}  # line at which slow readers catch up
        self._refuse_until = 0.0
        self._refusing_forever = False
        self._task: asyncio.Task[None] | None = None

    def after_line(self, n: int) -> None:
        plan, worker = self.plan, self.worker
        for r in self._stalls.pop(n, []):
            r.stalled = False
            r.wake.set()
        for slow in plan.slow_readers:
            if slow.at == n:
                stalled = [r for r in worker.readers() if not r.stalled]
                for r in stalled:
                    r.stalled = True
                self._stalls.setdefault(n + slow.lines, []).extend(stalled)
        if plan.cuts_after(n):
            self.cuts += 1
            worker.cut_connections()
            if plan.refuse_until_exit and not self._refusing_forever:
                self._refusing_forever = True
                self._stop_listening()
            elif plan.refuse_ms > 0 and not self._refusing_forever:
                self._refuse(plan.refuse_ms / 1000)
        for bad in plan.bad_lines_after(n):
            worker.write_line(bad)

    def close(self) -> None:
        """The worker exits: slow readers get what their queue kept; no more listening."""
        for stalled in self._stalls.values():
            for r in stalled:
                r.stalled = False
                r.wake.set()
        self._stalls.clear()
        if self._task is not None and not self._task.done():
            if self._task is not asyncio.current_task():
                self._task.cancel()

    def _stop_listening(self) -> None:
        self.refused_windows += 1
        self.worker.stop_listening()

    def _refuse(self, secs: float) -> None:
        """Stop listening for `secs` (extended by a cut meanwhile), then listen again."""
        loop = asyncio.get_running_loop()
        self._refuse_until = max(self._refuse_until, loop.time() + secs)
        if self._task is not None and not self._task.done():
            return
        self._stop_listening()
        self._task = loop.create_task(self._listen_later())

    async def _listen_later(self) -> None:
        loop = asyncio.get_running_loop()
        while (left := self._refuse_until - loop.time()) > 0:
            await asyncio.sleep(left)
        if not self.worker.exiting and not self._refusing_forever:
            await self.worker.listen_again()


# --- scripts --------------------------------------------------------------------------------


def periodic_script(
    n: int, period: int, *, turn_index: int = 0, stopped_for: Any = "EndOfTurn"
) -> scripts.Script:
    """TurnStart, `n` text deltas cycling through `period` texts (1 = all identical), TurnEnd,
    RunEnd: `n + 3` lines."""
    texts = [f"tick {k}\n" for k in range(period)]
    script: scripts.Script = [scripts.turn_start(turn_index)]
    script += [scripts.text_delta(texts[i % period], turn_index, 0) for i in range(n)]
    script.append(scripts.turn_end(turn_index, content=[scripts.text_block("ticks")]))
    script.append(scripts.run_end(stopped_for, turn_count=turn_index + 1))
    return script


def mixed_script(head: int, run: int, tail: int, *, period: int = 1) -> scripts.Script:
    """Distinct deltas, then `run` periodic ones (period `period`), then distinct again."""
    script: scripts.Script = [scripts.turn_start(0)]
    script += [scripts.text_delta(f"head {i:05d}\n") for i in range(head)]
    script += [scripts.text_delta(f"same {i % period}\n") for i in range(run)]
    script += [scripts.text_delta(f"tail {i:05d}\n") for i in range(tail)]
    script.append(scripts.turn_end(0, content=[scripts.text_block("mixed")]))
    script.append(scripts.run_end(turn_count=1))
    return script


def wire_lines(script: Sequence[scripts.ScriptEntry], plan: FaultPlan | None = None) -> list[bytes]:
    """The lines a worker playing `script` under `plan` writes (non-interactive): what its
    `stdout.ndjson` holds at exit. A crash plan ends it at `crash_at`."""
    out: list[bytes] = []

    def write(line: bytes) -> None:
        out.append(line)
        if plan is not None:
            for bad in plan.bad_lines_after(len(out)):
                write(bad)

    def crashed() -> bool:
        return plan is not None and plan.crash_at is not None and len(out) >= plan.crash_at

    if plan is not None:
        for bad in plan.bad_lines_after(0):
            write(bad)
    for e in script:
        if crashed():
            break
        if isinstance(e, str):
            write(e.encode())
        elif "$raw" in e:
            write(str(e["$raw"]).encode())
        elif "$exit" in e:
            break
        elif not scripts.is_directive(e):
            write(orjson.dumps(e))
    return out


# --- scenarios (fake caliband as a process) -------------------------------------------------


class ScriptSpec(_Model):
    kind: Literal["long", "periodic", "mixed", "tool_run", "text", "file"]
    n: int = 100
    period: int = 1
    per_turn: int = 100
    head: int = 0
    tail: int = 0
    path: str | None = None

    def build(self) -> scripts.Script:
        if self.kind == "long":
            return scripts.long_script(self.n, per_turn=self.per_turn)
        if self.kind == "periodic":
            return periodic_script(self.n, self.period)
        if self.kind == "mixed":
            return mixed_script(self.head, self.n, self.tail, period=self.period)
        if self.kind == "tool_run":
            return scripts.tool_run_script()
        if self.kind == "text":
            return scripts.text_script(self.n)
        if self.path is None:
            raise ValueError("a file script needs a path")
        return scripts.load_script(self.path)


class ScenarioAgent(_Model):
    prompt: str  # matched against the first word of the spawn's initial prompt
    script: ScriptSpec
    plan: FaultPlan | None = None


class Scenario(_Model):
    agents: tuple[ScenarioAgent, ...] = ()

    @classmethod
    def load(cls, path: str | Path) -> Scenario:
        return cls.model_validate_json(Path(path).read_bytes())

    def entry(self, prompt: str) -> ScenarioAgent | None:
        word = prompt.split(maxsplit=1)[0] if prompt.strip() else ""
        return next((a for a in self.agents if a.prompt == word), None)
