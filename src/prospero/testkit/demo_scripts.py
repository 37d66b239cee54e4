"""Scripted caliban sessions for `prospero demo` (played by the fake caliband).

Each script is a list of TurnEvent frames in the full shapes a real caliban worker writes
(caliband-wire.md §5.1: TurnStart, thinking/text deltas, ToolCallStart + streamed
ToolCallInputDelta fragments, ToolCallEnd with content/result_text, TurnEnd with the assistant
message, tool results and Usage, RunEnd with the whole conversation and total_usage), plus
`$sleep` / `$wait_input` directives so the demo feels live. Models come from the default rate
card, so costs show up.

`script_for(spec)` picks a session for agents spawned while the demo runs (API, CLI or
dashboard): a keyword in the prompt selects a flavour, the default is a tool-using session
about the prompt.

ACP agents (ADR 0011, `drive_protocol: "acp"`) play an `AcpScript` instead (steps documented
in `prospero.testkit.acp_scripts`), built with `AcpSession`: streamed text and thinking, tool
calls with their real `rawInput` (sometimes arriving late, as real agents send it) and
`rawOutput`, a plan, a `usage_update` with a USD cost, then `end_turn`. The fleet's ACP
agents (`DEMO_ACP_FLEET`) are seeded when prosperod has an ACP driver; `acp_script_for(spec)`
serves later ACP spawns.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prospero.testkit import acp_scripts as acp
from prospero.testkit.acp_scripts import AcpScript
from prospero.testkit.scripts import Script, message, text_block
from prospero.types.model import DriveProtocol, Posture

DEMO_MODEL = "claude-sonnet-4-6"
# Tokens a real agent spends on the system prompt and tool schemas before any message.
BASE_CONTEXT_TOKENS = 3100


def _tokens(text: str) -> int:
    """Rough token estimate (~4 characters a token), never zero for non-empty text."""
    return max(1, (len(text) + 3) // 4) if text else 0


def _chunks(text: str, size: int) -> list[str]:
    """Split text into stream-sized pieces at word boundaries (like provider deltas)."""
    if size <= 0 or len(text) <= size:
        return [text] if text else []
    parts = re.findall(r"\S+\s*|\s+", text)
    out: list[str] = []
    cur = ""
    for p in parts:
        if cur and len(cur) + len(p) > size:
            out.append(cur)
            cur = ""
        cur += p
    if cur:
        out.append(cur)
    return out


class Session:
    """Builds one realistic run turn by turn.

    `pace` is the pause between streamed deltas (seconds); tool calls pause for their
    `runtime`. The builder keeps the conversation and token counts so TurnEnd, RunEnd and the
    final messages agree with what was streamed.
    """

    def __init__(
        self,
        prompt: str,
        *,
        model: str = DEMO_MODEL,
        pace: float = 0.0,
        chunk: int = 48,
        id_prefix: str = "toolu_demo",
    ) -> None:
        self.prompt = prompt
        self.model = model
        self.pace = pace
        self.chunk = chunk
        self.id_prefix = id_prefix
        self.entries: Script = []
        self.messages: list[dict[str, Any]] = [message("user", text_block(prompt))]
        self.turn = -1
        self.total_in = 0
        self.total_out = 0
        self.total_cache_read = 0
        self._context = BASE_CONTEXT_TOKENS + _tokens(prompt)
        self._prev_context = 0
        self._blocks: list[dict[str, Any]] = []
        self._pending: list[tuple[str, str, str, bool, float]] = []
        self._turn_out = 0
        self._tool_seq = 0
        self._turns_without_edit = 0
        self._edited_this_turn = False

    # --- low level ---------------------------------------------------------------------------

    def _sleep(self, secs: float) -> None:
        if secs > 0:
            self.entries.append({"$sleep": round(secs, 3)})

    def _frame(self, frame: dict[str, Any]) -> None:
        self.entries.append(frame)

    def pause(self, secs: float) -> Session:
        self._sleep(secs)
        return self

    # --- turn content ------------------------------------------------------------------------

    def begin_turn(self) -> Session:
        if self.turn >= 0 and (self._blocks or self._pending):
            raise RuntimeError("end the current turn first")
        self.turn += 1
        self._blocks = []
        self._pending = []
        self._turn_out = 0
        self._edited_this_turn = False
        self._frame(
            {
                "type": "TurnStart",
                "turn_index": self.turn,
                "message_id": f"msg_01{self.id_prefix[-4:]}{self.turn:02d}",
                "model": self.model,
            }
        )
        self._sleep(self.pace * 2)
        return self

    def think(self, text: str) -> Session:
        idx = len(self._blocks)
        for piece in _chunks(text, self.chunk):
            self._frame(
                {
                    "type": "AssistantThinkingDelta",
                    "turn_index": self.turn,
                    "content_block_index": idx,
                    "text": piece,
                }
            )
            self._sleep(self.pace)
        self._blocks.append(
            {"type": "thinking", "thinking": text, "signature": f"sig_{self.turn}_{idx}"}
        )
        self._turn_out += _tokens(text)
        return self

    def say(self, text: str) -> Session:
        idx = len(self._blocks)
        for piece in _chunks(text, self.chunk):
            self._frame(
                {
                    "type": "AssistantTextDelta",
                    "turn_index": self.turn,
                    "content_block_index": idx,
                    "text": piece,
                }
            )
            self._sleep(self.pace)
        self._blocks.append(text_block(text))
        self._turn_out += _tokens(text)
        return self

    def tool(
        self,
        name: str,
        tool_input: dict[str, Any],
        result: str,
        *,
        is_error: bool = False,
        runtime: float = 0.0,
    ) -> Session:
        """A tool call: start + input fragments now; its result when the turn's model output
        ends (caliban runs the tools after the model stopped)."""
        self._tool_seq += 1
        tid = f"{self.id_prefix}_{self._tool_seq:02d}"
        self._frame(
            {"type": "ToolCallStart", "turn_index": self.turn, "tool_use_id": tid, "name": name}
        )
        args = json.dumps(tool_input, separators=(",", ":"))
        for piece in _fragments(args):
            self._frame(
                {
                    "type": "ToolCallInputDelta",
                    "turn_index": self.turn,
                    "tool_use_id": tid,
                    "partial_json": piece,
                }
            )
        self._sleep(self.pace)
        self._blocks.append({"type": "tool_use", "id": tid, "name": name, "input": tool_input})
        self._pending.append((tid, name, result, is_error, runtime))
        self._turn_out += _tokens(args) + 12
        if name in ("Edit", "Write", "MultiEdit") and not is_error:
            self._edited_this_turn = True
        return self

    def end_turn(self) -> Session:
        results: list[dict[str, Any]] = []
        for tid, _name, result, is_error, runtime in self._pending:
            self._sleep(runtime)
            cap = 8192
            self._frame(
                {
                    "type": "ToolCallEnd",
                    "turn_index": self.turn,
                    "tool_use_id": tid,
                    "is_error": is_error,
                    "content": [text_block(result)],
                    "result_text": result[:cap],
                    "truncated": len(result) > cap,
                }
            )
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": tid,
                    "content": [text_block(result)],
                    "is_error": is_error,
                }
            )
        assistant = message("assistant", *self._blocks)
        tool_results = [message("user", *results)] if results else []
        # Prompt caching: what the previous request already sent is read from the cache.
        cached = self._prev_context
        fresh = max(self._context - cached, 1)
        out = max(self._turn_out, 8)
        usage: dict[str, Any] = {"input_tokens": fresh, "output_tokens": out}
        if cached:
            usage["cache_read_input_tokens"] = cached
        self._frame(
            {
                "type": "TurnEnd",
                "turn_index": self.turn,
                "assistant_message": assistant,
                "tool_results": tool_results,
                "stop_reason": "tool_use" if results else "end_turn",
                "usage": usage,
                "ttft": {"secs": 0, "nanos": 380_000_000 + 17_000_000 * (self.turn % 7)},
                "tbt": {"secs": 0, "nanos": 16_000_000 + 1_000_000 * (self.turn % 5)},
            }
        )
        self.total_in += fresh
        self.total_out += out
        self.total_cache_read += cached
        self.messages.append(assistant)
        self.messages.extend(tool_results)
        self._prev_context = self._context
        self._context += out + sum(_tokens(r) for _t, _n, r, _e, _rt in self._pending)
        self._turns_without_edit = 0 if self._edited_this_turn else self._turns_without_edit + 1
        self._blocks = []
        self._pending = []
        return self

    def wait_input(self) -> Session:
        """Interactive boundary: the agent reports idle until a message or end-input arrives."""
        self.entries.append({"$wait_input": True})
        return self

    def finish(self, stopped_for: Any = "EndOfTurn") -> Script:
        total_usage: dict[str, Any] = {
            "input_tokens": self.total_in,
            "output_tokens": self.total_out,
        }
        if self.total_cache_read:
            total_usage["cache_read_input_tokens"] = self.total_cache_read
        self._frame(
            {
                "type": "RunEnd",
                "final_messages": self.messages,
                "total_usage": total_usage,
                "turn_count": self.turn + 1,
                "stopped_for": stopped_for,
                "turns_without_edit": self._turns_without_edit,
                "no_edit_nudge_emitted": False,
            }
        )
        return self.entries


def _fragments(args: str) -> list[str]:
    """Split tool-input JSON the way providers stream it: a few uneven fragments."""
    if len(args) <= 12:
        return [args]
    cuts = sorted({len(args) // 5, len(args) // 2, (len(args) * 4) // 5})
    out, prev = [], 0
    for c in [*cuts, len(args)]:
        if c > prev:
            out.append(args[prev:c])
            prev = c
    return out


# ---------------------------------------------------------------------------- the demo fleet


def refunds_validation(prompt: str, *, model: str = DEMO_MODEL, pace: float = 0.08) -> Script:
    """Text, thinking and a clean tool run: Grep, Read, Edit, Bash (tests pass)."""
    s = Session(prompt, model=model, pace=pace, id_prefix="toolu_01Rf")
    s.begin_turn()
    s.think(
        "The refund endpoint lives somewhere under src/payments. I should find the handler, "
        "see how it parses the body, and add validation for the amount and currency."
    )
    s.say("I'll start by finding the refund handler.")
    s.tool(
        "Grep",
        {"pattern": "def create_refund", "path": "src", "output_mode": "content", "-n": True},
        "src/payments/refunds.py:14:def create_refund(request):",
        runtime=0.3,
    )
    s.end_turn()
    s.begin_turn()
    s.tool(
        "Read",
        {"file_path": "src/payments/refunds.py"},
        REFUNDS_PY,
        runtime=0.2,
    )
    s.end_turn()
    s.begin_turn()
    s.think(
        "amount is used as-is: negative or zero refunds and unknown currencies go straight to "
        "the ledger. Validate both and answer 422 with a clear message."
    )
    s.say("The handler trusts the body. I'll validate `amount` and `currency` before booking.")
    s.tool(
        "Edit",
        {
            "file_path": "src/payments/refunds.py",
            "old_string": '    amount = body["amount"]\n',
            "new_string": (
                '    amount = body.get("amount")\n'
                "    if not isinstance(amount, int) or amount <= 0:\n"
                '        return error(422, "amount must be a positive integer (minor units)")\n'
                '    if body.get("currency") not in SUPPORTED_CURRENCIES:\n'
                "        return error(422, f\"unsupported currency: {body.get('currency')!r}\")\n"
            ),
        },
        "The file src/payments/refunds.py has been updated.",
        runtime=0.2,
    )
    s.end_turn()
    s.begin_turn()
    s.say("Now the tests.")
    s.tool(
        "Bash",
        {"command": "python -m pytest -q tests/test_refunds.py", "timeout": 120000},
        "........                                                                 [100%]\n"
        "8 passed in 0.41s",
        runtime=1.5,
    )
    s.end_turn()
    s.begin_turn()
    s.say(
        "Done. `POST /refunds` now rejects non-positive or non-integer amounts and unsupported "
        "currencies with a 422 and a readable message; all 8 refund tests pass."
    )
    s.end_turn()
    return s.finish("EndOfTurn")


def flaky_test_fix(prompt: str, *, model: str = DEMO_MODEL, pace: float = 0.08) -> Script:
    """A failed tool (is_error: the test run fails, then a denied command), a fix, a pass."""
    s = Session(prompt, model=model, pace=pace, id_prefix="toolu_01Fl")
    s.begin_turn()
    s.say("Let me reproduce the failure first.")
    s.tool(
        "Bash",
        {"command": "python -m pytest -q tests/test_webhooks.py -p no:randomly", "timeout": 120000},
        "F..                                                                      [100%]\n"
        "=================================== FAILURES ===================================\n"
        "_____________________ test_retry_backoff_is_bounded ____________________________\n"
        "    assert elapsed < 2.0\n"
        "E   assert 2.31 < 2.0\n"
        "tests/test_webhooks.py:41: AssertionError\n"
        "1 failed, 2 passed in 2.52s",
        is_error=True,
        runtime=2.0,
    )
    s.end_turn()
    s.begin_turn()
    s.think(
        "The test measures wall-clock time around a real sleep. That is the flake: under load "
        "the sleep overshoots. The retry helper accepts a clock; inject a fake one."
    )
    s.tool(
        "Read",
        {"file_path": "tests/test_webhooks.py", "offset": 30, "limit": 20},
        WEBHOOK_TEST,
        runtime=0.2,
    )
    s.tool(
        "Bash",
        {"command": "sudo systemctl restart webhook-relay"},
        "Tool call denied: permission denied: 'Bash' requires interactive approval (no TTY); "
        "re-run with `--allow 'Bash(<glob>)'` to allow specific commands",
        is_error=True,
        runtime=0.1,
    )
    s.end_turn()
    s.begin_turn()
    s.say("No service restart needed. I'll make the test use a fake clock instead of sleeping.")
    s.tool(
        "Edit",
        {
            "file_path": "tests/test_webhooks.py",
            "old_string": "    retry(send, attempts=3)\n    elapsed = time.monotonic() - start\n",
            "new_string": "    clock = FakeClock()\n    retry(send, attempts=3, clock=clock)\n"
            "    elapsed = clock.slept\n",
        },
        "The file tests/test_webhooks.py has been updated.",
        runtime=0.2,
    )
    s.tool(
        "Bash",
        {"command": "python -m pytest -q tests/test_webhooks.py --count 20", "timeout": 120000},
        "............................................................             [100%]\n"
        "60 passed in 0.38s",
        runtime=1.5,
    )
    s.end_turn()
    s.begin_turn()
    s.say(
        "Fixed: `test_retry_backoff_is_bounded` measured real sleeps, which overshoot under load. "
        "It now injects a fake clock and asserts the computed backoff; 20 repeated runs pass."
    )
    s.end_turn()
    return s.finish("EndOfTurn")


def provider_error(prompt: str, *, model: str = "claude-haiku-4-5", pace: float = 0.08) -> Script:
    """One turn of work, then the provider fails: RunEnd(ProviderError) -> the agent fails."""
    s = Session(prompt, model=model, pace=pace, id_prefix="toolu_01Mg")
    s.begin_turn()
    s.say("I'll look at the existing v1 docs to plan the migration guide.")
    s.tool(
        "Glob",
        {"pattern": "docs/**/*.md"},
        "docs/index.md\ndocs/getting-started.md\ndocs/api/v1.md\ndocs/changelog.md",
        runtime=0.2,
    )
    s.end_turn()
    s.pause(1.0)
    return s.finish(
        {"ProviderError": "anthropic: 529 overloaded_error: Overloaded (after 4 retries)"}
    )


def long_upgrade(
    prompt: str, *, model: str = "gpt-5.5", pace: float = 0.15, rounds: int = 8
) -> Script:
    """A long-ish run (about a minute with the default pace) so `follow` has something live."""
    s = Session(prompt, model=model, pace=pace, chunk=32, id_prefix="toolu_01Up")
    s.begin_turn()
    s.think("Upgrade first, then run the suite module by module and fix what breaks.")
    s.say("Bumping the HTTP client and running the suite in slices.")
    s.tool(
        "Bash",
        {"command": "uv add 'httpx>=0.28'"},
        "Resolved 41 packages in 312ms\nUpdated httpx v0.27.2 -> v0.28.1",
        runtime=2.0,
    )
    s.end_turn()
    modules = ["api", "billing", "webhooks", "ledger", "reports", "auth", "admin", "search"]
    for i in range(rounds):
        mod = modules[i % len(modules)]
        s.begin_turn()
        s.say(f"Running the `{mod}` tests.")
        passed = 12 + 3 * i
        s.tool(
            "Bash",
            {"command": f"python -m pytest -q tests/{mod}", "timeout": 300000},
            f"{'.' * passed}\n{passed} passed in {1.2 + i * 0.3:.2f}s",
            runtime=3.5,
        )
        s.end_turn()
        if i == 2:
            s.begin_turn()
            s.say("`httpx.Client(proxies=...)` is gone in 0.28; switching to `proxy=`.")
            s.tool(
                "Grep",
                {"pattern": "proxies=", "path": "src", "output_mode": "files_with_matches"},
                "src/payments/gateway.py",
                runtime=0.3,
            )
            s.tool(
                "Edit",
                {
                    "file_path": "src/payments/gateway.py",
                    "old_string": "proxies=settings.proxy",
                    "new_string": "proxy=settings.proxy",
                },
                "The file src/payments/gateway.py has been updated.",
                runtime=0.3,
            )
            s.end_turn()
    s.begin_turn()
    s.say(
        "Upgrade complete: httpx 0.28.1, one call site moved from `proxies=` to `proxy=`, and "
        f"all {len(modules[:rounds])} test modules pass."
    )
    s.end_turn()
    return s.finish("EndOfTurn")


def interactive_pairing(prompt: str, *, model: str = DEMO_MODEL, pace: float = 0.05) -> Script:
    """Does a first pass, then waits for operator input (the agent shows as `idle`)."""
    s = Session(prompt, model=model, pace=pace, id_prefix="toolu_01Ix")
    s.begin_turn()
    s.say("Let me look at the changelog.")
    s.tool(
        "Read",
        {"file_path": "CHANGELOG.md", "limit": 40},
        "# Changelog\n\n## Unreleased\n\n## 1.4.0\n- Search: filter by tag\n",
        runtime=0.2,
    )
    s.end_turn()
    s.begin_turn()
    s.say(
        "The `Unreleased` section is empty. Which changes should go in — the search speed-up, "
        "the new dark theme, or both? Send me a message (`prospero send ID TEXT`), or end input "
        "(`prospero end-input ID`) and I'll stop here."
    )
    s.end_turn()
    s.wait_input()
    return s.finish("EndOfTurn")


def quick_summary(prompt: str, *, model: str = "claude-haiku-4-5", pace: float = 0.05) -> Script:
    """A short session: read one file, answer."""
    s = Session(prompt, model=model, pace=pace, id_prefix="toolu_01Qs")
    s.begin_turn()
    s.think("Read the README and summarise it in two sentences.")
    s.tool("Read", {"file_path": "README.md"}, DOCS_README, runtime=0.2)
    s.end_turn()
    s.begin_turn()
    s.say(
        "This is the documentation site for the product: Markdown pages under `docs/`, built "
        "with a static generator. It covers getting started, the v1 API and the changelog."
    )
    s.end_turn()
    return s.finish("EndOfTurn")


def generic_session(prompt: str, *, model: str = DEMO_MODEL, pace: float = 0.08) -> Script:
    """The default for agents spawned during the demo: explore, edit, test, report."""
    topic = " ".join(prompt.split())[:80] or "the task"
    s = Session(prompt, model=model, pace=pace, id_prefix="toolu_01Gn")
    s.begin_turn()
    s.think(f"The task: {topic}. Find the relevant code before changing anything.")
    s.say(f"Working on: {topic}. First, a look around.")
    s.tool(
        "Glob", {"pattern": "**/*.py"}, "src/app.py\nsrc/util.py\ntests/test_app.py", runtime=0.3
    )
    s.tool(
        "Grep",
        {"pattern": "TODO", "path": ".", "output_mode": "content", "-n": True},
        "src/app.py:12:    # TODO: handle empty input\nsrc/util.py:3:# TODO: docstring",
        runtime=0.3,
    )
    s.end_turn()
    s.begin_turn()
    s.tool("Read", {"file_path": "src/app.py"}, APP_PY, runtime=0.2)
    s.end_turn()
    s.begin_turn()
    s.say("Making the change.")
    s.tool(
        "Edit",
        {
            "file_path": "src/app.py",
            "old_string": "    # TODO: handle empty input\n",
            "new_string": "    if not items:\n        return []\n",
        },
        "The file src/app.py has been updated.",
        runtime=0.2,
    )
    s.tool(
        "Bash",
        {"command": "python -m pytest -q", "timeout": 120000},
        "......\n6 passed in 0.12s",
        runtime=1.0,
    )
    s.end_turn()
    s.begin_turn()
    s.say(f"Done with “{topic}”: one edit in `src/app.py`, and the test suite passes.")
    s.end_turn()
    return s.finish("EndOfTurn")


# ---------------------------------------------------------------------------- ACP sessions

# Per-token prices used for the demo's cumulative `usage_update.cost` (sonnet-like, USD).
_ACP_IN_PER_TOKEN = 3.0 / 1_000_000
_ACP_OUT_PER_TOKEN = 15.0 / 1_000_000
ACP_CONTEXT_SIZE = 200_000


class AcpSession:
    """Builds one ACP turn (a list of AcpScript steps) the way a real agent streams it."""

    def __init__(
        self, prompt: str, *, pace: float = 0.08, chunk: int = 48, id_prefix: str = "call"
    ) -> None:
        self.prompt = prompt
        self.pace = pace
        self.chunk = chunk
        self.id_prefix = id_prefix
        self.steps: list[dict[str, Any]] = []
        self._seq = 0
        self._used = BASE_CONTEXT_TOKENS + _tokens(prompt)
        self._out = 0
        self._msg = 0

    def _sleep(self, secs: float) -> None:
        if secs > 0:
            self.steps.append(acp.sleep(round(secs, 3)))

    def pause(self, secs: float) -> AcpSession:
        self._sleep(secs)
        return self

    def think(self, text: str) -> AcpSession:
        self._msg += 1
        for piece in _chunks(text, self.chunk):
            self.steps.append(acp.thought(piece, message_id=f"th_{self._msg:02d}"))
            self._sleep(self.pace)
        self._out += _tokens(text)
        return self

    def say(self, text: str) -> AcpSession:
        self._msg += 1
        for piece in _chunks(text, self.chunk):
            self.steps.append(acp.text(piece, message_id=f"msg_{self._msg:02d}"))
            self._sleep(self.pace)
        self._out += _tokens(text)
        return self

    def plan(self, *entries: tuple[str, str]) -> AcpSession:
        """Entries are (content, status); the whole plan is sent every time (ACP semantics)."""
        self.steps.append(
            acp.plan(*({"content": c, "priority": "medium", "status": st} for c, st in entries))
        )
        return self

    def tool(
        self,
        kind: str,
        title: str,
        raw_input: dict[str, Any],
        result: str,
        *,
        failed: bool = False,
        runtime: float = 0.0,
        late_input: bool = False,
    ) -> AcpSession:
        """A tool call: announced (with its input, or with the input in a later update, as
        claude-agent-acp does), in progress, then completed/failed with rawOutput + content."""
        self._seq += 1
        tid = f"{self.id_prefix}_{self._seq:02d}"
        self.steps.append(
            acp.tool_call(
                tid, title, kind, raw_input=None if late_input else raw_input, status="pending"
            )
        )
        self._sleep(self.pace)
        self.steps.append(
            acp.tool_update(tid, status="in_progress", raw_input=raw_input if late_input else None)
        )
        self._sleep(runtime)
        self.steps.append(
            acp.tool_update(
                tid, status="failed" if failed else "completed", raw_output=result, content=result
            )
        )
        self._used += _tokens(json.dumps(raw_input)) + _tokens(result) + 12
        self._sleep(self.pace)
        return self

    def ask(
        self,
        kind: str,
        title: str,
        raw_input: dict[str, Any],
        result: str,
        *,
        denied_text: str,
        runtime: float = 0.0,
    ) -> AcpSession:
        """A tool call that asks permission first: allowed -> it runs; denied -> failed."""
        self._seq += 1
        tid = f"{self.id_prefix}_{self._seq:02d}"
        self.steps.append(acp.tool_call(tid, title, kind, raw_input=raw_input, status="pending"))
        allowed = [
            acp.tool_update(tid, status="in_progress"),
            *([acp.sleep(runtime)] if runtime > 0 else []),
            acp.tool_update(tid, status="completed", raw_output=result, content=result),
        ]
        denied = [
            acp.tool_update(tid, status="failed", raw_output="Permission denied"),
            acp.text(denied_text),
        ]
        self.steps.append(
            acp.permission(
                tid,
                title=title,
                kind=kind,
                raw_input=raw_input,
                on_allow=allowed,
                on_reject=denied,
            )
        )
        self._used += _tokens(json.dumps(raw_input)) + 12
        return self

    def usage(self) -> AcpSession:
        self._used += self._out
        cost = self._used * _ACP_IN_PER_TOKEN + self._out * _ACP_OUT_PER_TOKEN
        self.steps.append(acp.usage(self._used, ACP_CONTEXT_SIZE, cost=round(cost, 6)))
        return self

    def finish(self, stop: str = "end_turn") -> list[dict[str, Any]]:
        self.usage()
        # the turn's tokens ride on the prompt response, as agents that report usage do
        self.steps.append(
            acp.stop(stop, input_tokens=self._used - self._out, output_tokens=self._out)
        )
        return self.steps


def acp_currency_audit(prompt: str, *, model: str = DEMO_MODEL, pace: float = 0.08) -> AcpScript:
    """The seeded ACP agent: plan, thinking, a search, a read whose input arrives late, an
    edit, a passing test run, a summary; later prompts are echoed."""
    s = AcpSession(prompt, pace=pace, id_prefix="call_cur")
    s.plan(
        ("Find where refunds handle currencies", "in_progress"),
        ("Reject unsupported currencies", "pending"),
        ("Run the refund tests", "pending"),
    )
    s.think(
        "Currencies are checked somewhere near the refund handler. Find every use of "
        "SUPPORTED_CURRENCIES before touching anything."
    )
    s.say("I'll look for the currency handling first.")
    s.tool(
        "search",
        "grep SUPPORTED_CURRENCIES src",
        {"pattern": "SUPPORTED_CURRENCIES", "path": "src"},
        'src/payments/refunds.py:6:SUPPORTED_CURRENCIES = {"EUR", "USD", "GBP"}',
        runtime=0.3,
    )
    s.tool(
        "read",
        "Read src/payments/refunds.py",
        {"path": "src/payments/refunds.py"},
        REFUNDS_PY,
        runtime=0.2,
        late_input=True,
    )
    s.plan(
        ("Find where refunds handle currencies", "completed"),
        ("Reject unsupported currencies", "in_progress"),
        ("Run the refund tests", "pending"),
    )
    s.say("The set is defined but never checked. Adding the check before booking.")
    s.tool(
        "edit",
        "Edit src/payments/refunds.py",
        {
            "path": "src/payments/refunds.py",
            "old_string": '    amount = body["amount"]\n',
            "new_string": (
                '    if body.get("currency") not in SUPPORTED_CURRENCIES:\n'
                '        return error(422, "unsupported currency")\n'
                '    amount = body["amount"]\n'
            ),
        },
        "The file src/payments/refunds.py has been updated.",
        runtime=0.2,
    )
    s.tool(
        "execute",
        "python -m pytest -q tests/test_refunds.py",
        {"command": "python -m pytest -q tests/test_refunds.py"},
        "........                                                                 [100%]\n"
        "8 passed in 0.39s",
        runtime=1.2,
    )
    s.plan(
        ("Find where refunds handle currencies", "completed"),
        ("Reject unsupported currencies", "completed"),
        ("Run the refund tests", "completed"),
    )
    s.say(
        "Done: refunds with a currency outside EUR/USD/GBP now get a 422 before anything is "
        "booked, and the 8 refund tests pass."
    )
    return AcpScript(turns=[s.finish()], model=model)


def acp_generic_session(prompt: str, *, model: str = DEMO_MODEL, pace: float = 0.08) -> AcpScript:
    """The default for ACP agents spawned during the demo: explore, read, ask permission to
    edit (prosperod's default policy denies it), report; later prompts are echoed."""
    topic = " ".join(prompt.split())[:80] or "the task"
    s = AcpSession(prompt, pace=pace, id_prefix="call_gen")
    s.think(f"The task: {topic}. Look around before changing anything.")
    s.say(f"Working on: {topic}. First, a look around.")
    s.tool(
        "search",
        "Find Python files",
        {"pattern": "**/*.py"},
        "src/app.py\nsrc/util.py\ntests/test_app.py",
        runtime=0.3,
    )
    s.tool("read", "Read src/app.py", {"path": "src/app.py"}, APP_PY, runtime=0.2, late_input=True)
    s.say("One change is needed in `src/app.py`.")
    s.ask(
        "edit",
        "Edit src/app.py",
        {
            "path": "src/app.py",
            "old_string": "    # TODO: handle empty input\n",
            "new_string": "    if not items:\n        return []\n",
        },
        "The file src/app.py has been updated.",
        denied_text=" The edit was not permitted, so I left the file unchanged.",
        runtime=0.2,
    )
    s.say(f" Finished “{topic}”.")
    return AcpScript(turns=[s.finish()], model=model)


def acp_long_session(
    prompt: str, *, model: str = DEMO_MODEL, pace: float = 0.08, steps: int = 40
) -> AcpScript:
    """A ~1 minute ACP turn (try `cancel-turn` on it): a test run module by module."""
    s = AcpSession(prompt, pace=pace, id_prefix="call_long")
    s.say("Running the suite module by module.")
    for i in range(1, steps + 1):
        s.tool(
            "execute",
            f"pytest tests/test_mod_{i:02d}.py",
            {"command": f"python -m pytest -q tests/test_mod_{i:02d}.py"},
            f"{i % 7 + 3} passed",
            runtime=1.2,
        )
        if i % 10 == 0:
            s.say(f" {i} of {steps} modules pass.")
    s.say(" All modules pass.")
    return AcpScript(turns=[s.finish()], model=model)


def acp_crash_session(prompt: str, *, model: str = DEMO_MODEL, pace: float = 0.08) -> AcpScript:
    """The agent process dies mid-turn (exit 1): the turn ends with an error, agent failed."""
    s = AcpSession(prompt, pace=pace, id_prefix="call_crash")
    s.say("Starting the migration.")
    s.tool("read", "Read pyproject.toml", {"path": "pyproject.toml"}, "[project]\n", runtime=0.3)
    steps = [*s.steps, acp.sleep(0.5), acp.exit_(1)]
    return AcpScript(turns=[steps], model=model)


def acp_refusal_session(prompt: str, *, model: str = DEMO_MODEL, pace: float = 0.08) -> AcpScript:
    s = AcpSession(prompt, pace=pace, id_prefix="call_ref")
    s.say("I can't help with that request.")
    return AcpScript(turns=[s.finish("refusal")], model=model)


# ---------------------------------------------------------------------------- the seeded fleet


@dataclass(frozen=True)
class DemoAgent:
    """One agent `prospero demo` spawns at startup."""

    workspace: str
    label: str
    prompt: str
    model: str
    build: Callable[..., Script]
    interactive: bool = False
    shared_tree: bool = False
    drive_protocol: DriveProtocol = "ndjson"
    acp_build: Callable[..., AcpScript] | None = None
    posture: Posture | None = None


DEMO_FLEET: tuple[DemoAgent, ...] = (
    DemoAgent(
        "payments-api",
        "refund-validation",
        "Add input validation to POST /refunds: reject bad amounts and unknown currencies",
        DEMO_MODEL,
        refunds_validation,
    ),
    DemoAgent(
        "payments-api",
        "flaky-webhook-test",
        "Fix the flaky test in tests/test_webhooks.py",
        DEMO_MODEL,
        flaky_test_fix,
    ),
    DemoAgent(
        "payments-api",
        "httpx-upgrade",
        "Upgrade httpx to 0.28 and run the whole test suite module by module",
        "gpt-5.5",
        long_upgrade,
    ),
    DemoAgent(
        "docs-site",
        "migration-guide",
        "Write the v1 to v2 migration guide",
        "claude-haiku-4-5",
        provider_error,
    ),
    DemoAgent(
        "docs-site",
        "changelog-pairing",
        "Help me write the changelog for the next release",
        DEMO_MODEL,
        interactive_pairing,
        interactive=True,
    ),
    DemoAgent(
        "docs-site",
        "readme-summary",
        "Summarise the README for the landing page",
        "claude-haiku-4-5",
        quick_summary,
        shared_tree=True,
    ),
    DemoAgent(
        "payments-api",
        "acp-currency-audit",
        "Make refunds reject unsupported currencies",
        DEMO_MODEL,
        generic_session,  # NDJSON fallback, unused: ACP agents play `acp_build`
        drive_protocol="acp",
        acp_build=acp_currency_audit,
    ),
    DemoAgent(
        "payments-api",
        "acp-supervised-edit",
        "Handle empty input in src/app.py",
        DEMO_MODEL,
        generic_session,  # NDJSON fallback, unused
        drive_protocol="acp",
        acp_build=acp_generic_session,
        # Stops on its permission request until someone runs `prospero approve ID`.
        posture="supervised",
    ),
)

# The ACP agents of the fleet (the demo runs with allow_acp on; seeded when prosperod has an
# ACP driver).
DEMO_ACP_FLEET: tuple[DemoAgent, ...] = tuple(a for a in DEMO_FLEET if a.drive_protocol == "acp")

_SEEDED = {a.prompt: a for a in DEMO_FLEET if a.drive_protocol == "ndjson"}
_SEEDED_ACP = {a.prompt: a for a in DEMO_ACP_FLEET}


# ---------------------------------------------------------------------------- selection


def _get(spec: Any, name: str, default: Any = None) -> Any:
    if isinstance(spec, dict):
        return spec.get(name, default)
    return getattr(spec, name, default)


def script_for(spec: Any) -> Script:
    """Pick a scripted session for a spawn request made while the demo runs.

    Keywords in the prompt: `fail`/`error`/`overload` -> provider error (agent fails);
    `flaky`/`broken` -> a failing tool then a fix; `long`/`slow`/`upgrade` -> a ~1 minute
    run; `summar` -> a short session. Interactive spawns do a first pass, then wait for input.
    Anything else gets a realistic tool-using session about the prompt.
    """
    prompt = str(_get(spec, "initial_prompt") or _get(spec, "prompt") or "")
    model = _get(spec, "model") or None
    low = prompt.lower()
    kw: dict[str, Any] = {"model": model} if model else {}
    seeded = _SEEDED.get(prompt)
    if seeded is not None:
        return seeded.build(prompt, model=model or seeded.model)
    if _get(spec, "interactive", False):
        return interactive_pairing(prompt, **kw)
    if any(w in low for w in ("fail", "error", "overload")):
        return provider_error(prompt, **kw)
    if any(w in low for w in ("flaky", "broken")):
        return flaky_test_fix(prompt, **kw)
    if any(w in low for w in ("long", "slow", "upgrade")):
        return long_upgrade(prompt, **kw)
    if "summar" in low:
        return quick_summary(prompt, **kw)
    return generic_session(prompt, **kw)


def acp_script_for(spec: Any) -> AcpScript:
    """Pick an ACP session for an ACP spawn made while the demo runs.

    Keywords in the prompt: `fail`/`error`/`crash` -> the agent dies mid-turn (failed);
    `refuse` -> a `refusal` stop; `long`/`slow`/`upgrade` -> a ~1 minute turn (cancel-turn
    it); anything else -> a realistic session that asks permission to edit. Every later prompt
    (`prospero send`) is echoed.
    """
    prompt = str(_get(spec, "initial_prompt") or _get(spec, "prompt") or "")
    model = _get(spec, "model") or None
    low = prompt.lower()
    kw: dict[str, Any] = {"model": model} if model else {}
    seeded = _SEEDED_ACP.get(prompt)
    if seeded is not None and seeded.acp_build is not None:
        return seeded.acp_build(prompt, model=model or seeded.model)
    if any(w in low for w in ("fail", "error", "crash")):
        return acp_crash_session(prompt, **kw)
    if "refuse" in low:
        return acp_refusal_session(prompt, **kw)
    if any(w in low for w in ("long", "slow", "upgrade")):
        return acp_long_session(prompt, **kw)
    return acp_generic_session(prompt, **kw)


# ---------------------------------------------------------------------------- file contents

REFUNDS_PY = '''\
"""Refunds: POST /refunds books a refund against a captured payment."""

from payments.ledger import book
from payments.http import error, json_response

SUPPORTED_CURRENCIES = {"EUR", "USD", "GBP"}


def create_refund(request):
    body = request.json()
    payment = request.app.payments.get(body["payment_id"])
    if payment is None:
        return error(404, "unknown payment")
    amount = body["amount"]
    entry = book(payment, -amount, body["currency"])
    return json_response(201, {"refund_id": entry.id})
'''

WEBHOOK_TEST = """\
def test_retry_backoff_is_bounded():
    send = FailingSender(times=2)
    start = time.monotonic()
    retry(send, attempts=3)
    elapsed = time.monotonic() - start
    assert send.calls == 3
    assert elapsed < 2.0
"""

APP_PY = '''\
"""Tiny app module."""


def normalise(items):
    # TODO: handle empty input
    return sorted({i.strip().lower() for i in items})
'''

DOCS_README = """\
# docs-site

Documentation for the product, written in Markdown under `docs/` and built with a static
site generator. Start with `docs/getting-started.md`.
"""

PAYMENTS_README = """\
# payments-api

The payments service: captures, refunds and webhooks. `python -m pytest` runs the tests.
"""

# Files of the two demo workspaces (each becomes a git repo with one commit).
DEMO_WORKSPACES: dict[str, dict[str, str]] = {
    "payments-api": {
        "README.md": PAYMENTS_README,
        "src/payments/__init__.py": "",
        "src/payments/refunds.py": REFUNDS_PY,
        "tests/test_webhooks.py": "import time\n\n\n" + WEBHOOK_TEST,
        "pyproject.toml": '[project]\nname = "payments-api"\nversion = "1.4.0"\n',
    },
    "docs-site": {
        "README.md": DOCS_README,
        "CHANGELOG.md": "# Changelog\n\n## Unreleased\n\n## 1.4.0\n- Search: filter by tag\n",
        "docs/index.md": "# Welcome\n",
        "docs/getting-started.md": "# Getting started\n\nInstall, configure, run.\n",
        "docs/api/v1.md": "# API v1\n\n`GET /items` lists items.\n",
    },
}
