"""Session always-rules: a human's `allow_always` / `reject_always` answer answers the later
requests of the same ACP session for the same tool kind and title. Kept in memory per session
(loaded from the store on first use) and stored alongside; forgotten per agent when another
replica may have added some (`forget_agent`, on a takeover)."""

from __future__ import annotations

import logging

from prospero.core.errors import StoreError
from prospero.core.store.decisions import DecisionStore, SessionRule
from prospero.types.decisions import Decision
from prospero.types.events import DecisionOption, DecisionToolCall

log = logging.getLogger(__name__)

_SessionKey = tuple[str, str]


def rule_of_answer(d: Decision, opt: DecisionOption, created_at: str) -> SessionRule | None:
    """The session rule a human's answer makes (None unless it is an `*_always` option)."""
    if opt.kind not in ("allow_always", "reject_always"):
        return None
    return SessionRule(
        agent_id=d.agent_id,
        session_id=d.session_id,
        tool_kind=d.tool_call.kind or "",
        title=d.tool_call.title,
        action="allow" if opt.kind == "allow_always" else "reject",
        option_kind=opt.kind,
        decision_id=d.id,
        created_at=created_at,
    )


class SessionRules:
    def __init__(self, store: DecisionStore) -> None:
        self.store = store
        self._rules: dict[_SessionKey, dict[tuple[str, str], SessionRule]] = {}
        self._loaded: set[_SessionKey] = set()

    def forget_agent(self, agent_id: str) -> None:
        """Drop what is cached of the agent's sessions: their rules are read from the store
        again at the next request (a replica that takes an agent over reads the rules the
        previous owner stored)."""
        for key in [k for k in self._rules if k[0] == agent_id]:
            del self._rules[key]
        self._loaded = {k for k in self._loaded if k[0] != agent_id}

    def remember(self, rule: SessionRule) -> None:
        key = (rule.agent_id, rule.session_id)
        self._rules.setdefault(key, {})[(rule.tool_kind, rule.title)] = rule

    async def find(
        self, agent_id: str, session_id: str, tc: DecisionToolCall
    ) -> SessionRule | None:
        """The rule of this session for the tool call's kind and title, if any."""
        key = (agent_id, session_id)
        if key not in self._loaded:
            try:
                stored = await self.store.session_rules(agent_id, session_id)
            except StoreError as e:
                log.warning("agent %s: cannot read session rules: %s", agent_id, e)
                stored = []
            else:
                self._loaded.add(key)
            mine = self._rules.setdefault(key, {})
            for r in stored:
                mine.setdefault((r.tool_kind, r.title), r)
        return self._rules.get(key, {}).get((tc.kind or "", tc.title))
