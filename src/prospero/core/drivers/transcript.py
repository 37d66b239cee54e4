"""Positional reading of an agent's transcript, `<session_dir>/stdout.ndjson` (caliband-wire.md
§1.2, §4.2): append-only, the same lines as the attach stream, from line 1.

Line k of the file is line k of the stream, so where the file is readable (a local caliband)
the NDJSON driver needs no overlap matching at all: it checks that the file's lines
`seen - held + 1 .. seen` have the digests it holds, then takes lines `seen + 1 ..` by
position. Only complete lines count (a trailing partial line is still being written); a line
over the 1 MiB limit is digested as it streams by and reported as an `OversizedLine`, exactly
as `LineReader` does on the socket.

All methods here are blocking file I/O. The driver calls them through `asyncio.to_thread`,
except a live tail's read of a little new data (`read_available`): a regular-file read of a few
KiB costs microseconds, far less than a thread round trip (see `ndjson_transcript`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from prospero.core.drivers.line_cursor import DIGEST_SIZE, line_digests
from prospero.core.transport import MAX_LINE, OversizedLine

TRANSCRIPT_NAME = "stdout.ndjson"
CHUNK = 1 << 20
READ_LIMIT = 4 << 20  # bytes per read_new() call (a read is one batch for the driver)


def transcript_path(session_dir: str) -> Path | None:
    return Path(session_dir) / TRANSCRIPT_NAME if session_dir else None


class TranscriptError(Exception):
    """The transcript cannot be used here: `reason` is "unreadable", "short" or "mismatch"."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _new_hash() -> hashlib.blake2b:
    return hashlib.blake2b(digest_size=DIGEST_SIZE)


class Transcript:
    """A positional reader over one transcript file: `line` complete lines lie before
    `offset`; `read_new()` returns the complete lines after it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.line = 0
        self.offset = 0
        self._fd: int | None = None
        self._skip: hashlib.blake2b | None = None  # an oversized line being read
        self._skip_size = 0

    # ---- lifecycle ------------------------------------------------------------------------

    def open(self) -> None:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except OSError as e:
                raise TranscriptError("unreadable", f"{self.path}: {e}") from e

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def grew(self) -> bool:
        """Whether the file may hold bytes past what was read: one fstat, no read (True when
        it cannot tell). Cheap enough to call on the event loop."""
        if self._fd is None:
            return True
        try:
            return os.fstat(self._fd).st_size > self.offset
        except OSError:
            return True

    def read_available(self, limit: int) -> list[bytes] | None:
        """`read_new()` when fewer than `limit` (<= MAX_LINE) bytes are past the position: one
        pread, and no line can be oversized. None (nothing consumed) when there are more, or an
        oversized line is being skipped: use `read_new`."""
        if self._skip is not None or limit > MAX_LINE:
            return None
        self.open()
        data = self._pread(limit, self.offset)
        if len(data) >= limit:
            return None
        end = data.rfind(b"\n")
        if end < 0:
            return []
        lines = data[:end].split(b"\n")
        self.offset += end + 1
        self.line += len(lines)
        return lines

    def _pread(self, n: int, pos: int) -> bytes:
        assert self._fd is not None
        try:
            return os.pread(self._fd, n, pos)
        except OSError as e:
            raise TranscriptError("unreadable", f"{self.path}: {e}") from e

    # ---- positioning ----------------------------------------------------------------------

    def seek_verified(self, seen: int, held: list[bytes]) -> None:
        """Position after line `seen`, checking that the lines before it end with `held`.
        Raises TranscriptError ("short": the file has fewer lines; "mismatch")."""
        self.open()
        first = seen - len(held) + 1
        digests, offset, count = self._scan(first, seen)
        if count < seen:
            raise TranscriptError(
                "short", f"{self.path} has {count} complete lines, we hold {seen}"
            )
        if digests != held:
            bad = next(i for i, (a, b) in enumerate(zip(digests, held, strict=True)) if a != b)
            raise TranscriptError(
                "mismatch",
                f"{self.path} line {first + bad} differs from the line we hold there",
            )
        self.line = seen
        self.offset = offset
        self._skip = None

    def all_digests(self) -> list[bytes]:
        """The digest of every complete line of the file (a full scan)."""
        self.open()
        digests, _, _ = self._scan(1, 1 << 62)
        return digests

    def seek_line(self, line: int) -> None:
        """Position after line `line` (no check)."""
        self.open()
        _, offset, count = self._scan(line + 1, line)
        if count < line:
            raise TranscriptError("short", f"{self.path} has {count} complete lines")
        self.line = line
        self.offset = offset
        self._skip = None

    def _scan(self, first: int, last: int) -> tuple[list[bytes], int, int]:
        """Digests of complete lines first..last (1-based), the offset after line `last` (or
        after the last complete line) and the number of complete lines up to there."""
        digests: list[bytes] = []
        pos = 0
        line = 0  # complete lines before `pos`
        line_start = 0
        h: hashlib.blake2b | None = None
        while line < last:
            chunk = self._pread(CHUNK, pos)
            if not chunk:
                break
            n = chunk.count(b"\n")
            if h is None and line + n + 1 < first:
                # Nothing of this chunk (nor its trailing partial line) is in range: skip it.
                if n:
                    line += n
                    line_start = pos + chunk.rfind(b"\n") + 1
                pos += len(chunk)
                continue
            start = 0
            while line < last:
                nl = chunk.find(b"\n", start)
                in_range = line + 1 >= first
                if nl < 0:
                    if in_range:
                        if h is None:
                            h = _new_hash()
                        h.update(chunk[start:])
                    break
                if in_range:
                    if h is None:
                        h = _new_hash()
                    h.update(chunk[start:nl])
                    h.update(b"\n")
                    digests.append(h.digest())
                    h = None
                line += 1
                start = nl + 1
                line_start = pos + start
            pos += len(chunk)
        return digests, line_start, line

    # ---- reading --------------------------------------------------------------------------

    def read_new(self, limit: int = READ_LIMIT) -> list[bytes | OversizedLine]:
        """The complete lines after the current position (up to about `limit` bytes), in
        order; advances past them. A trailing partial line is left for the next call."""
        self.open()
        out: list[bytes | OversizedLine] = []
        while not out:
            data = self._pread(limit, self.offset)
            if not data:
                return out
            if self._skip is not None:
                nl = data.find(b"\n")
                if nl < 0:
                    self._skip.update(data)
                    self._skip_size += len(data)
                    self.offset += len(data)
                    continue
                self._skip.update(data[: nl + 1])
                out.append(OversizedLine(self._skip_size + nl, self._skip.digest()))
                self._skip = None
                self._skip_size = 0
                self.offset += nl + 1
                self.line += 1
                data = data[nl + 1 :]
            end = data.rfind(b"\n")
            if end < 0:
                if len(data) > MAX_LINE:  # a line over the limit: digest it as it goes
                    h = _new_hash()
                    h.update(data)
                    self._skip = h
                    self._skip_size = len(data)
                    self.offset += len(data)
                    continue
                return out
            lines = data[:end].split(b"\n")
            for ln in lines:
                if len(ln) > MAX_LINE:
                    h = _new_hash()
                    h.update(ln)
                    h.update(b"\n")
                    out.append(OversizedLine(len(ln), h.digest()))
                else:
                    out.append(ln)
            self.offset += end + 1
            self.line += len(lines)
        return out


def digests_of(batch: list[bytes | OversizedLine]) -> list[bytes]:
    if all(type(x) is bytes for x in batch):
        return line_digests(batch)  # type: ignore[arg-type]
    return [x.digest if isinstance(x, OversizedLine) else line_digests([x])[0] for x in batch]
