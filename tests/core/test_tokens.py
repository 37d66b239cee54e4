"""Scoped tokens (types/tokens.py, core/tokens.py): format, parser errors, add_token, the live table."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prospero.core.tokens import TokenTable, load_or_create_session_key
from prospero.types.tokens import (
    NAME_RE,
    Scope,
    TokenFileError,
    add_token,
    format_line,
    generate_token,
    hash_token,
    parse_tokens_text,
    read_tokens_file,
)

NAMES = st.from_regex(r"[A-Za-z0-9_.-]{1,64}", fullmatch=True)
SCOPES = st.sampled_from(list(Scope))
DIGESTS = st.binary(min_size=32, max_size=32)


def test_scopes_are_ordered() -> None:
    assert Scope.read < Scope.operate < Scope.admin
    assert Scope.parse(" Operate ") is Scope.operate
    with pytest.raises(ValueError, match="expected read, operate or admin"):
        Scope.parse("root")


def test_generated_tokens() -> None:
    tokens = {generate_token() for _ in range(50)}
    assert len(tokens) == 50
    for t in tokens:
        assert t.startswith("pspo_") and "=" not in t
        raw = base64.urlsafe_b64decode(t[5:] + "=")
        assert len(raw) == 32
    t = next(iter(tokens))
    assert hash_token(t) == hashlib.sha256(t.encode()).digest()


def test_parse_ok_with_comments_and_blank_lines() -> None:
    h = "ab" * 32
    text = f"# tokens\n\n  ci read sha256:{h}  \nops\toperate\tsha256:{h.upper()}\n"
    entries = parse_tokens_text(text)
    assert [(e.name, e.scope) for e in entries] == [("ci", Scope.read), ("ops", Scope.operate)]
    assert entries[1].digest == bytes.fromhex(h)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("ci read", "expected 'NAME SCOPE sha256:HEX', got 2 field"),
        ("ci read sha256:" + "a" * 64 + " extra", "got 4 field"),
        ("c/i read sha256:" + "a" * 64, "invalid token name 'c/i'"),
        ("x" * 65 + " read sha256:" + "a" * 64, "invalid token name"),
        ("ci root sha256:" + "a" * 64, "unknown scope 'root'"),
        ("ci read sha1:" + "a" * 40, "64 hex digits"),
        ("ci read sha256:" + "g" * 64, "64 hex digits"),
        ("ci read pspo_plaintext", "64 hex digits"),
    ],
)
def test_parse_errors_name_the_line(line: str, message: str) -> None:
    text = "# header\n\n" + line + "\n"
    with pytest.raises(TokenFileError, match=message) as info:
        parse_tokens_text(text, "/etc/t")
    assert info.value.line == 3
    assert str(info.value).startswith("tokens file /etc/t, line 3: ")


def test_duplicate_names_refused() -> None:
    h = "0" * 64
    with pytest.raises(TokenFileError, match=r"line 2: duplicate token name 'ci'"):
        parse_tokens_text(f"ci read sha256:{h}\nci admin sha256:{h}\n")


def test_bad_utf8_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "t"
    p.write_bytes(b"# ok\n\xff\xfe read sha256:" + b"0" * 64 + b"\n")
    with pytest.raises(TokenFileError, match="line 2: not valid UTF-8"):
        read_tokens_file(p)
    with pytest.raises(TokenFileError, match="cannot read"):
        read_tokens_file(tmp_path / "missing")


@given(st.lists(st.tuples(NAMES, SCOPES, DIGESTS), max_size=8, unique_by=lambda t: t[0]))
@settings(max_examples=200, deadline=None)
def test_format_parse_round_trip(rows: list[tuple[str, Scope, bytes]]) -> None:
    text = "".join(format_line(n, s, d) + "\n" for n, s, d in rows)
    parsed = parse_tokens_text(text)
    assert [(e.name, e.scope, e.digest) for e in parsed] == rows


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_parser_never_fails_otherwise(text: str) -> None:
    try:
        entries = parse_tokens_text(text)
    except TokenFileError as e:
        assert e.line is not None and e.line >= 1
        return
    for e in entries:
        assert NAME_RE.match(e.name) and len(e.digest) == 32


def test_add_token_writes_only_the_hash_0600(tmp_path: Path) -> None:
    p = tmp_path / "tokens"
    p.write_text("# kept verbatim\nold read sha256:" + "1" * 64)  # no final newline
    os.chmod(p, 0o644)
    token = add_token(p, "ci", Scope.operate)
    text = p.read_text()
    assert token not in text
    assert text.startswith("# kept verbatim\nold read sha256:")
    assert text.endswith(f"ci operate sha256:{hash_token(token).hex()}\n")
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert [e.name for e in read_tokens_file(p)] == ["old", "ci"]
    with pytest.raises(TokenFileError, match="already exists"):
        add_token(p, "ci", Scope.admin)
    with pytest.raises(TokenFileError, match="invalid token name"):
        add_token(p, "bad name", Scope.read)
    assert [e.name for e in read_tokens_file(p)] == ["old", "ci"]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["tokens"]  # no temp files left


def test_add_token_creates_the_file(tmp_path: Path) -> None:
    p = tmp_path / "new"
    token = add_token(p, "first", Scope.admin)
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    entry = TokenTable(p).match(token)
    assert entry is not None and entry.name == "first" and entry.scope is Scope.admin
    with pytest.raises(TokenFileError, match="does not exist"):
        add_token(tmp_path / "nope" / "t", "x", Scope.read)


def test_add_token_refuses_a_malformed_file(tmp_path: Path) -> None:
    p = tmp_path / "t"
    p.write_text("garbage\n")
    with pytest.raises(TokenFileError, match="line 1"):
        add_token(p, "ci", Scope.read)
    assert p.read_text() == "garbage\n"


def test_concurrent_adds_lose_nothing(tmp_path: Path) -> None:
    p = tmp_path / "t"
    errors: list[BaseException] = []

    def add(i: int) -> None:
        try:
            add_token(p, f"t{i}", Scope.read)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert sorted(e.name for e in read_tokens_file(p)) == sorted(f"t{i}" for i in range(16))


def test_table_matches_and_reloads(tmp_path: Path) -> None:
    p = tmp_path / "t"
    p.write_text("")
    table = TokenTable(p, legacy={"env": "plain-secret"})
    assert table.enabled
    legacy = table.match("plain-secret")
    assert legacy is not None and legacy.name == "env" and legacy.scope is Scope.admin
    tok = add_token(p, "ci", Scope.read)
    hit = table.match(tok)  # added after the table was built: no restart needed
    assert hit is not None and hit.name == "ci" and hit.scope is Scope.read
    assert table.match(tok + "x") is None and table.match("") is None
    # removing the line revokes it
    p.write_text(
        "".join(ln + "\n" for ln in p.read_text().splitlines() if not ln.startswith("ci "))
    )
    assert table.match(tok) is None
    # a broken file fails closed (legacy tokens still work); fixing it restores the entries
    tok2 = add_token(p, "ops", Scope.operate)
    good = p.read_text()
    p.write_text(good + "broken line\n")
    assert table.match(tok2) is None
    assert table.match("plain-secret") is not None
    p.write_text(good)
    assert table.match(tok2) is not None
    p.unlink()
    assert table.match(tok2) is None
    assert table.by_name("env") is not None


def test_table_start_up_errors_and_off(tmp_path: Path) -> None:
    assert not TokenTable().enabled
    assert TokenTable().match("x") is None
    p = tmp_path / "t"
    p.write_text("x y z\n")
    with pytest.raises(TokenFileError, match="line 1"):
        TokenTable(p)


def test_session_key_file(tmp_path: Path) -> None:
    p = tmp_path / "session.key"
    k1 = load_or_create_session_key(p)
    assert len(k1) == 32 and stat.S_IMODE(p.stat().st_mode) == 0o600
    assert load_or_create_session_key(p) == k1
    p.write_bytes(b"short")
    with pytest.raises(OSError, match="fewer than 32 bytes"):
        load_or_create_session_key(p)
