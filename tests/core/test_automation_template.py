"""Automation prompt templates (hypothesis for the parser), cron validation and webhook
signing: the pure parts of core/automations."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prospero.core.automations import cron
from prospero.core.automations.signing import SignatureRejected, sign, verify
from prospero.core.automations.template import (
    MAX_VALUE_CHARS,
    TemplateError,
    parse,
    render,
)

CTX: dict[str, Any] = {
    "trigger": "webhook",
    "now": "2026-01-01T00:00:00+00:00",
    "run": {"id": "run-1"},
    "automation": {"id": "au-1", "name": "triage", "workspace": "ws"},
    "payload": {"a": {"b": [10, {"c": "deep"}]}, "s": "text", "n": None, "t": True},
}


def r(text: str, ctx: dict[str, Any] | None = None) -> str:
    return render(parse(text), CTX if ctx is None else ctx)


def test_placeholders_render() -> None:
    assert r("{{trigger}} {{ automation.name }}/{{run.id}}") == "webhook triage/run-1"
    assert r("{{payload.a.b.1.c}} {{payload.a.b.0}} {{payload.s}}") == "deep 10 text"
    assert r("[{{payload.n}}][{{payload.t}}][{{payload.missing.x}}][{{payload.a.b.9}}]") == (
        "[null][true][][]"
    )
    assert r("{{payload.a}}") == '{"b":[10,{"c":"deep"}]}'
    assert r("{{payload.s.x}}") == ""  # no attribute access on a string
    assert r("\\{{trigger}} and }} and \\x") == "{{trigger}} and }} and \\x"
    assert r("{{payload.s}}", {**CTX, "payload": {"s": "{{trigger}}"}}) == "{{trigger}}"
    assert r("{{payload.s}}", {**CTX, "payload": {"s": "x" * 20000}}) == "x" * MAX_VALUE_CHARS


@pytest.mark.parametrize(
    ("text", "offset", "what"),
    [
        ("ab {{", 3, "unclosed"),
        ("{{}}", 0, "empty"),
        ("x\n  {{ env.HOME }}", 4, "unknown placeholder root"),
        ("{{automation.secret}}", 0, "unknown placeholder"),
        ("{{trigger.x}}", 0, "unknown placeholder"),
        ("{{run}}", 0, "unknown placeholder"),
        ("{{payload..a}}", 0, "malformed"),
        ("{{payload.__class__ .x}}", 0, "malformed"),
        ("{{payload[0]}}", 0, "malformed"),
    ],
)
def test_syntax_errors_name_their_position(text: str, offset: int, what: str) -> None:
    with pytest.raises(TemplateError) as e:
        parse(text)
    assert e.value.position == offset and what in str(e.value)
    assert f"offset {offset}" in str(e.value)


literal = st.text(alphabet=st.characters(blacklist_characters="{\\"), max_size=200)
segment = st.from_regex(r"[A-Za-z0-9_-]{1,8}", fullmatch=True)


@given(literal)
def test_text_without_braces_is_itself(text: str) -> None:
    assert r(text) == text


@given(st.text(max_size=300))
def test_any_text_parses_or_fails_cleanly(text: str) -> None:
    try:
        t = parse(text)
    except TemplateError as e:
        assert 0 <= e.position <= len(text)
        return
    out = render(t, CTX)
    assert isinstance(out, str)


@given(st.lists(st.tuples(literal, st.lists(segment, min_size=1, max_size=4)), max_size=6))
def test_payload_paths_substitute_verbatim(parts: list[tuple[str, list[str]]]) -> None:
    """Any payload value lands as is (never re-parsed) and a missing path renders empty."""
    text = "".join(f"{lit}{{{{payload.{'.'.join(path)}}}}}" for lit, path in parts)
    payload: dict[str, Any] = {}
    for i, (_lit, path) in enumerate(parts):
        node = payload
        for seg in path[:-1]:
            nxt = node.get(seg)
            if not isinstance(nxt, dict):
                nxt = node[seg] = {}
            node = nxt
        node[path[-1]] = f"v{i}{{{{trigger}}}}"
    out = render(parse(text), {**CTX, "payload": payload})
    # each placeholder renders what the payload holds at that path at the end
    want = "".join(lit + _at(payload, path) for (lit, path) in parts)
    assert out == want
    assert "{{trigger}}" in out or not parts


def _at(payload: dict[str, Any], path: list[str]) -> str:
    node: Any = payload
    for seg in path:
        if not isinstance(node, dict) or seg not in node:
            return ""
        node = node[seg]
    if isinstance(node, str):
        return node
    import orjson

    return orjson.dumps(node).decode()


def test_cron_validation_and_ticks() -> None:
    assert cron.validate("  */5   *  * * 1-5 ") == "*/5 * * * 1-5"
    for bad in ("* * * *", "* * * * * *", "61 * * * *", "* * 32 * *", "nope", ""):
        with pytest.raises(cron.CronError):
            cron.validate(bad)
    now = datetime(2026, 3, 4, 10, 7, 30, tzinfo=UTC)
    assert cron.latest_tick("*/5 * * * *", now) == datetime(2026, 3, 4, 10, 5, tzinfo=UTC)
    assert cron.latest_tick("7 10 * * *", now) == datetime(2026, 3, 4, 10, 7, tzinfo=UTC)
    assert cron.next_tick("*/5 * * * *", now) == datetime(2026, 3, 4, 10, 10, tzinfo=UTC)
    # a naive datetime is read as UTC
    assert cron.latest_tick("0 * * * *", now.replace(tzinfo=None)) == datetime(
        2026, 3, 4, 10, tzinfo=UTC
    )


def test_signing_modes() -> None:
    body = b'{"a": 1}'
    digest = verify("k", body, sign("k", body), None, now=0, window=300)
    assert len(digest) == 64
    assert verify(
        "k", body, sign("k", body).upper().replace("SHA256", "sha256"), None, now=0, window=300
    )
    ts = "1000"
    assert verify("k", body, sign("k", body, ts), ts, now=1200, window=300)
    cases = [
        (None, None, 1000, "missing"),
        ("sha256=xyz", None, 1000, "malformed"),
        (sign("k", body), "12a", 1000, "malformed"),
        (sign("other", body), None, 1000, "forged"),
        (sign("k", body), ts, 1000, "forged"),  # a timestamp the signature does not cover
        (sign("k", body, ts), ts, 1301, "stale"),
        (sign("k", body, ts), ts, 699, "stale"),
    ]
    for sig, stamp, now, reason in cases:
        with pytest.raises(SignatureRejected) as e:
            verify("k", body, sig, stamp, now=now, window=300)
        assert e.value.reason == reason, (sig, stamp, now)
