"""One mapping from an agent_finished outcome to the run's result: the agent's status in the
fleet view and the outcome /api/usage counts never disagree."""

from __future__ import annotations

import pytest

from prospero.core.drivers.acp.auth import AUTH_REQUIRED_OUTCOME
from prospero.core.drivers.acp.mapping import NOT_RESUMABLE, STOP_OUTCOMES
from prospero.core.fleet.meta import outcome_status
from prospero.types.events import run_result
from prospero.types.model import AgentStatus

# caliban's StopCondition labels (caliband-wire.md §5.1) and what Prospero's drivers add.
NDJSON_OUTCOMES = [
    "EndOfTurn",
    "MaxTurnsReached",
    "Cancelled",
    "ProviderError",
    "HookDenied",
    "CompactionFailed",
    "MaxTokensExhausted",
    "Refusal",
    "ContentFilter",
    "StreamIdle",
    "ThinkingBudgetExhausted",
]
OUTCOMES = sorted(
    {*NDJSON_OUTCOMES, *STOP_OUTCOMES.values(), NOT_RESUMABLE, AUTH_REQUIRED_OUTCOME, "killed", "crashed"}
)


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_status_and_usage_read_an_outcome_alike(outcome: str) -> None:
    assert outcome_status(outcome) == AgentStatus(run_result(outcome))


def test_only_a_clean_end_is_done_as_caliband_reads_exit_codes() -> None:
    done = [o for o in OUTCOMES if run_result(o) == "done"]
    assert done == ["EndOfTurn"]
    assert run_result("killed") == "killed" and run_result("crashed") == "crashed"
    assert run_result("MaxTurnsReached") == "failed"  # caliban: exit 75, agent `failed`
    assert run_result("Cancelled") == "failed"  # caliban: exit 124, agent `failed`
