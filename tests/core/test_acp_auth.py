"""ACP `authenticate` (issue 9 deliverable 7): an advertised method the workspace has
credentials for is used once; otherwise the agent finishes at once with `auth_required` naming
the methods — one connection, no prompt, never a redial loop."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

import pytest
from acp import schema as s

from prospero.core.drivers.acp.auth import (
    AUTH_REQUIRED_OUTCOME,
    pick_method,
    workspace_credentials,
)
from prospero.core.drivers.base import DriverExit, DriverOptions, DriverTarget
from prospero.testkit import acp_scripts as S
from prospero.types.events import AgentFinished, TurnFinished
from prospero.types.model import RegisteredWorkspace, RepoProviderConfig
from tests.conformance.agent_driver import Recorder
from tests.core.acp_support import Rig, rig

__all__ = ["rig"]  # the shared fixture

T = 15.0
CODEX_LIKE = [
    {"id": "chatgpt", "name": "Login with ChatGPT"},
    {"id": "codex-api-key", "name": "Use CODEX_API_KEY"},
    {"id": "openai-api-key", "name": "Use OPENAI_API_KEY"},
]
# A budget that would redial many times if the driver looped.
OPTS = DriverOptions(backoff_base=0.005, backoff_cap=0.01, max_failures=50)


def creds(*names: str) -> Any:
    def lookup(_target: DriverTarget) -> Collection[str]:
        return names

    return lookup


async def test_without_matching_credentials_the_agent_finishes_at_once(rig: Rig) -> None:
    peer = await rig.peer(S.simple_script("hi"), auth_methods=CODEX_LIKE, require_auth=True)
    rec = Recorder()
    d = rig.driver(rig.target(peer), rec, OPTS, credentials=creds("HOME", "ANTHROPIC_API_KEY"))
    assert await asyncio.wait_for(d.run(), T) is DriverExit.finished
    assert rec.kinds() == ["agent_finished"]
    end = rec.events[0]
    assert isinstance(end, AgentFinished) and end.outcome == AUTH_REQUIRED_OUTCOME
    assert end.detail is not None
    for mid in ("chatgpt", "codex-api-key", "openai-api-key"):
        assert mid in end.detail
    assert peer.listener.connections_total == 1 and peer.agent.auth_refusals == 1
    assert peer.agent.authentications == [] and peer.agent.prompts == []
    assert await asyncio.wait_for(d.run(), T) is DriverExit.finished  # stays finished


async def test_a_method_naming_a_present_key_is_used_then_session_new_retried(rig: Rig) -> None:
    peer = await rig.peer(S.simple_script("hi"), auth_methods=CODEX_LIKE, require_auth=True)
    rec = Recorder()
    d = rig.driver(rig.target(peer), rec, OPTS, credentials=creds("OPENAI_API_KEY"))
    assert await asyncio.wait_for(d.run(), T) is DriverExit.finished
    assert peer.agent.authentications == ["openai-api-key"]
    assert rec.stdout() == ["hi"] and rec.kinds()[0] == "agent_init"
    end = rec.events[-1]
    assert isinstance(end, AgentFinished) and end.outcome == "EndOfTurn"


async def test_a_refused_authentication_finishes_auth_required_without_a_loop(rig: Rig) -> None:
    peer = await rig.peer(
        S.simple_script("hi"),
        auth_methods=CODEX_LIKE,
        require_auth=True,
        accept_methods=["chatgpt"],
    )
    rec = Recorder()
    d = rig.driver(rig.target(peer), rec, OPTS, credentials=creds("CODEX_API_KEY"))
    assert await asyncio.wait_for(d.run(), T) is DriverExit.finished
    end = rec.events[-1]
    assert isinstance(end, AgentFinished) and end.outcome == AUTH_REQUIRED_OUTCOME
    assert end.detail is not None and "rejected" in end.detail
    assert peer.agent.authentications == ["codex-api-key"]
    assert peer.listener.connections_total == 1


def test_the_method_rule() -> None:
    agent = [s.AuthMethodAgent(id=m["id"], name=m["name"]) for m in CODEX_LIKE]
    assert pick_method(agent, ["OPENAI_API_KEY"]) == "openai-api-key"
    assert pick_method(agent, ["CODEX_API_KEY", "OPENAI_API_KEY"]) == "codex-api-key"
    assert pick_method(agent, ["PATH", "HOME"]) is None
    assert pick_method(agent, [], preferred="chatgpt") == "chatgpt"
    assert pick_method(agent, [], preferred="unknown") is None
    env = s.EnvVarAuthMethod(
        type="env_var",
        id="gemini",
        name="Gemini key",
        vars=[s.AuthEnvVar(name="GEMINI_API_KEY"), s.AuthEnvVar(name="X_OPT", optional=True)],
    )
    assert pick_method([env], ["GEMINI_API_KEY"]) == "gemini"
    assert pick_method([env], ["X_OPT"]) is None
    term = s.TerminalAuthMethod(type="terminal", id="login-OPENAI_API_KEY", name="Login")
    assert pick_method([term], ["OPENAI_API_KEY"], preferred="login-OPENAI_API_KEY") is None


async def test_workspace_credentials_are_the_names_set_in_the_agent_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Lister:
        async def list_workspaces(self) -> list[RegisteredWorkspace]:
            cfg = RepoProviderConfig(provider="openai", api_key_from_env="MY_KEY", env={"X": ""})
            return [RegisteredWorkspace(name="ws", root="/r", config=cfg)]

    lookup = workspace_credentials(Lister(), {"HOME": "/h"})
    target = DriverTarget(agent_id="a", workspace="ws", resolve_endpoint=_never)
    monkeypatch.setenv("MY_KEY", "sk-test")
    names = await lookup(target)
    assert "OPENAI_API_KEY" in names and "HOME" in names and "X" not in names
    assert "sk-test" not in names
    other = DriverTarget(agent_id="b", workspace="nope", resolve_endpoint=_never)
    assert list(await lookup(other)) == []


async def _never() -> Any:
    raise AssertionError("not dialled")


async def test_a_prompt_refused_for_auth_authenticates_and_is_sent_once_more(rig: Rig) -> None:
    peer = await rig.peer(
        S.simple_script("hi"),
        auth_methods=[{"id": "anthropic-api-key", "name": "Use ANTHROPIC_API_KEY"}],
        require_auth=True,
        auth_on="prompt",
    )
    rec = Recorder()
    d = rig.driver(rig.target(peer), rec, OPTS, credentials=creds("ANTHROPIC_API_KEY"))
    assert await asyncio.wait_for(d.run(), T) is DriverExit.finished
    assert peer.agent.authentications == ["anthropic-api-key"]
    assert peer.agent.prompts == ["do the thing"]  # the refused one did nothing
    turns = [(e.turn, e.stop_reason) for e in rec.events if isinstance(e, TurnFinished)]
    assert turns == [(0, "error"), (1, "end_turn")]
    assert rec.stdout() == ["hi"]


async def test_a_prompt_refused_for_auth_without_credentials_finishes_at_once(rig: Rig) -> None:
    peer = await rig.peer(
        S.simple_script("hi"),
        auth_methods=[{"id": "claude-login", "name": "Log in with Claude"}],
        require_auth=True,
        auth_on="prompt",
    )
    rec = Recorder()
    d = rig.driver(rig.target(peer, interactive=True), rec, OPTS)
    assert await asyncio.wait_for(d.run(), T) is DriverExit.finished
    assert rec.kinds() == ["agent_init", "turn_finished", "agent_finished"]
    end = rec.events[-1]
    assert isinstance(end, AgentFinished) and end.outcome == AUTH_REQUIRED_OUTCOME
    assert end.detail is not None and "claude-login" in end.detail
    assert peer.listener.connections_total == 1 and peer.agent.prompts == []
