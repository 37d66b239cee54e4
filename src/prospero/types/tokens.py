"""The scoped API tokens file (ADR 0009): token generation, hashing, and the file's one reader
and writer. It is a format shared by prosperod (which reads it, `core/tokens.py` TokenTable) and
the CLI (`prospero token new` writes it), like a wire, so it lives in the types layer.

Tokens file (`prosperod --api-tokens-file F`): UTF-8 lines

    NAME SCOPE sha256:HEX

`#` comments and blank lines are ignored. NAME is `[A-Za-z0-9_.-]{1,64}` and unique; SCOPE is
`read`, `operate` or `admin` (`read < operate < admin`); HEX is the lowercase SHA-256 of the
whole token string. A token is `pspo_` + base64url(32 random bytes) without padding. The file
never holds a token, only its hash, so reading it does not let anyone call the API. Writes are
atomic (temp file + rename, mode 0600) under an flock, so concurrent `token new` lose nothing.

Legacy plaintext tokens (`--api-token-file` lines `name:token`, `PROSPERO_API_TOKEN` named
`env`) become `admin` entries (`legacy_entries`, held as hashes too).
"""

from __future__ import annotations

import base64
import contextlib
import enum
import fcntl
import hashlib
import logging
import os
import re
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

TOKEN_PREFIX = "pspo_"
TOKEN_BYTES = 32
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
HASH_RE = re.compile(r"^sha256:([0-9a-fA-F]{64})$")
FILE_MODE = 0o600


class Scope(enum.IntEnum):
    """What a token may do; a larger scope includes every smaller one."""

    read = 1
    operate = 2
    admin = 3

    @classmethod
    def parse(cls, value: str) -> Scope:
        try:
            return cls[value.strip().lower()]
        except KeyError:
            raise ValueError(f"unknown scope {value!r} (expected read, operate or admin)") from None

    def __str__(self) -> str:
        return self.name


class TokenFileError(Exception):
    """A tokens file that cannot be read or parsed; the message names the file and line."""

    def __init__(self, path: Path | str, message: str, line: int | None = None) -> None:
        where = f"tokens file {path}" + (f", line {line}" if line is not None else "")
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line


@dataclass(frozen=True)
class TokenEntry:
    name: str
    scope: Scope
    digest: bytes  # sha256 of the whole token string (32 bytes)
    source: str = "file"  # "file" | "legacy"

    @property
    def hash_hex(self) -> str:
        return self.digest.hex()


def generate_token() -> str:
    raw = base64.urlsafe_b64encode(secrets.token_bytes(TOKEN_BYTES)).rstrip(b"=")
    return TOKEN_PREFIX + raw.decode("ascii")


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def format_line(name: str, scope: Scope, digest: bytes) -> str:
    return f"{name} {scope.name} sha256:{digest.hex()}"


def parse_tokens_text(text: str, path: Path | str = "<tokens>") -> list[TokenEntry]:
    """Parse the file's text; raises TokenFileError naming the first bad line."""
    entries: list[TokenEntry] = []
    seen: set[str] = set()
    if text.startswith("\ufeff"):
        text = text[1:]
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 3:
            raise TokenFileError(
                path, f"expected 'NAME SCOPE sha256:HEX', got {len(fields)} field(s)", lineno
            )
        name, scope_s, hash_s = fields
        if not NAME_RE.match(name):
            raise TokenFileError(
                path, f"invalid token name {name!r} (allowed: A-Z a-z 0-9 _ . -, 1-64)", lineno
            )
        try:
            scope = Scope.parse(scope_s)
        except ValueError as e:
            raise TokenFileError(path, str(e), lineno) from None
        m = HASH_RE.match(hash_s)
        if m is None:
            raise TokenFileError(
                path, "the hash must be 'sha256:' followed by 64 hex digits", lineno
            )
        if name in seen:
            raise TokenFileError(path, f"duplicate token name {name!r}", lineno)
        seen.add(name)
        entries.append(TokenEntry(name, scope, bytes.fromhex(m.group(1))))
    return entries


def read_tokens_file(path: Path) -> list[TokenEntry]:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TokenFileError(path, f"cannot read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise TokenFileError(path, "not valid UTF-8", line) from None
    return parse_tokens_text(text, path)


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` to a 0600 temp file beside `path`, fsync, rename over `path`."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Exclusive lock on the file at `path` (created 0600 when absent). Retries when the path
    was replaced between open and lock, so two concurrent writers never lose an update."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                yield
                return
        finally:
            os.close(fd)


def add_token(path: Path, name: str, scope: Scope) -> str:
    """Append a new token to the tokens file (created 0600 when absent) and return the token.

    The file is rewritten atomically with mode 0600; existing lines (and comments) are kept
    verbatim. A duplicate name, an invalid name or a malformed existing file raises
    TokenFileError (nothing is written)."""
    if not NAME_RE.match(name):
        raise TokenFileError(
            path, f"invalid token name {name!r} (allowed: A-Z a-z 0-9 _ . -, 1-64)"
        )
    if not path.parent.is_dir():
        raise TokenFileError(path, f"directory {path.parent} does not exist")
    try:
        with _locked(path):
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise TokenFileError(path, "not valid UTF-8") from None
            entries = parse_tokens_text(text, path)
            if any(e.name == name for e in entries):
                raise TokenFileError(path, f"a token named {name!r} already exists")
            token = generate_token()
            if text and not text.endswith("\n"):
                text += "\n"
            text += format_line(name, scope, hash_token(token)) + "\n"
            _write_atomic(path, text)
            return token
    except OSError as e:
        raise TokenFileError(path, f"cannot write: {e.strerror or e}") from None


def legacy_entries(tokens: Mapping[str, str]) -> list[TokenEntry]:
    """Plaintext `name -> token` (legacy `--api-token-file`, `PROSPERO_API_TOKEN`) as admin."""
    return [TokenEntry(n, Scope.admin, hash_token(t), "legacy") for n, t in tokens.items()]
