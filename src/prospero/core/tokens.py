"""The live token table of prosperod (ADR 0009) and the dashboard session key.

The tokens file format, generation and hashing are `prospero.types.tokens` (shared with the
CLI); they are re-exported here.

`TokenTable` matches a presented token against every entry in constant time (SHA-256 of the
presented string compared with `hmac.compare_digest` to each stored digest, no early exit) and
re-reads the file whenever its (inode, size, mtime, ctime) changes: a token added with the CLI
works without restarting prosperod, a removed line stops working (also for cookie sessions, which
carry a prefix of the token's hash). A file that cannot be read or parsed on reload fails
closed: its tokens are dropped until it is fixed (the error is logged once per change).
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from prospero.types.tokens import (
    FILE_MODE,
    Scope,
    TokenEntry,
    TokenFileError,
    add_token,
    format_line,
    generate_token,
    hash_token,
    legacy_entries,
    parse_tokens_text,
    read_tokens_file,
)

log = logging.getLogger(__name__)


def load_or_create_session_key(path: Path) -> bytes:
    """The HMAC key of dashboard session cookies: 32 random bytes in a 0600 file, created on
    first use (so sessions survive a restart). A short or unreadable file raises OSError."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) < 32:
            raise OSError(f"session key file {path} holds fewer than 32 bytes") from None
        return key
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
        f.flush()
        os.fsync(f.fileno())
    return key


def _file_sig(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class TokenTable:
    """The tokens prosperod accepts: a hashed tokens file (reloaded on change) plus legacy
    plaintext tokens. `enabled` is true when any source is configured: then every non-open
    route needs a token (an empty file accepts nothing until a token is added)."""

    def __init__(
        self,
        path: Path | None = None,
        legacy: Mapping[str, str] | None = None,
        entries: Iterable[TokenEntry] = (),
    ) -> None:
        self.path = path
        self._static = [*legacy_entries(legacy or {}), *entries]
        self._file: list[TokenEntry] = []
        self._sig: tuple[int, int, int, int] | None = None
        self._lock = threading.Lock()
        if path is not None:
            # At start-up a bad file is an error (prosperod exits 2 with the message).
            self._file = read_tokens_file(path)
            self._sig = _file_sig(path)

    @classmethod
    def from_plaintext(cls, tokens: Mapping[str, str]) -> TokenTable:
        return cls(legacy=tokens)

    @property
    def enabled(self) -> bool:
        return self.path is not None or bool(self._static)

    def entries(self) -> list[TokenEntry]:
        self._maybe_reload()
        return [*self._static, *self._file]

    def __len__(self) -> int:
        return len(self.entries())

    def _maybe_reload(self) -> None:
        if self.path is None:
            return
        sig = _file_sig(self.path)
        if sig == self._sig:
            return
        with self._lock:
            if sig == self._sig:
                return
            try:
                self._file = read_tokens_file(self.path) if sig is not None else []
                if sig is None:
                    log.error("tokens file %s is gone: its tokens are refused", self.path)
                else:
                    log.info("tokens file %s reloaded (%d token(s))", self.path, len(self._file))
            except TokenFileError as e:
                self._file = []
                log.error("%s; refusing its tokens until it is fixed", e)
            self._sig = sig

    def match(self, presented: str) -> TokenEntry | None:
        """The entry whose hash equals the presented token's, compared in constant time."""
        digest = hash_token(presented)
        found: TokenEntry | None = None
        for entry in self.entries():
            if hmac.compare_digest(digest, entry.digest) and found is None:
                found = entry
        return found

    def by_name(self, name: str) -> TokenEntry | None:
        found: TokenEntry | None = None
        for entry in self.entries():
            if entry.name == name and found is None:
                found = entry
        return found


__all__ = [
    "Scope",
    "TokenEntry",
    "TokenFileError",
    "TokenTable",
    "add_token",
    "format_line",
    "generate_token",
    "hash_token",
    "legacy_entries",
    "load_or_create_session_key",
    "parse_tokens_text",
    "read_tokens_file",
]
