"""NdjsonDriver's resume state: the snapshot forms, and saving and loading them.

`ResumeState` is mixed into `NdjsonDriver` (see its module docstring). The state is the line
cursor, the normaliser state and the terminal flag. A sink whose `emit_batch` takes `cursor=`
gets the full snapshot with every batch, so the store commits the cursor in the same
transaction as the events it covers: a restarted prosperod re-emits nothing already stored.
That snapshot is compact: a small JSON header and digests as raw bytes. A sink that also
takes `cursor_base=` (the FleetManager's) gets it as a *base + delta* pair (`_snapshot_marks`):
the whole digest window is written as the agent's base row (key `<agent>` + BASE_SUFFIX) only
every DELTA_MAX lines (or when the cursor was restored or re-based), and every batch carries
just the header and the digests of the lines since that base; both rows go in the same
transaction as the events they cover, and the base row is written with the delta that first
refers to it. (At 50 agents x 100 lines/s a full 16 KiB window per agent per commit was ~40
MB/s of cursor rows into the WAL; base + delta is ~1/15 of that.) `_load_state` reads every
form: base + delta, the whole compact snapshot, and the JSON form the `CursorStore` path
saves. Other sinks use the `CursorStore` (periodically and at the end of every connection;
after a crash up to ~`save_interval` seconds of events may repeat).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import orjson

from prospero.core.drivers.base import CursorStore, DriverTarget
from prospero.core.drivers.line_cursor import DIGEST_SIZE, LineCursor
from prospero.core.normalize import Normalizer

log = logging.getLogger("prospero.core.drivers.ndjson")

STATE_VERSION = 1
# The compact snapshot (what goes with every batch to a cursor-taking sink, see `_snapshot`):
# this prefix (never the start of JSON), the header's length (4 bytes, big-endian), the
# header (JSON: everything but the digests), then the cursor's held digests as raw bytes.
COMPACT_MAGIC = b"\x00PC2"
COMPACT_VERSION = 2
# The delta form: COMPACT_MAGIC and a header like version 2's, plus "base" (the line the
# agent's base row was taken at); the digests are those of the lines base+1 .. seen.
DELTA_VERSION = 3
# The base row: its key is the agent id + BASE_SUFFIX; BASE_MAGIC, the line it was taken at
# (8 bytes, big-endian), then the cursor's held digests (its whole window) at that line.
BASE_SUFFIX = "#ndjson-base"
BASE_MAGIC = b"\x00PB3"
# A new base once the delta would hold more than this many lines' digests.
DELTA_MAX = 256


def parse_base(data: bytes) -> tuple[int, bytes]:
    """A base row: (the line it was taken at, its digests). Raises ValueError."""
    if not data.startswith(BASE_MAGIC) or len(data) < len(BASE_MAGIC) + 8:
        raise ValueError("not a cursor base row")
    at = len(BASE_MAGIC)
    return int.from_bytes(data[at : at + 8], "big"), data[at + 8 :]


class ResumeState:
    """The persistence half of NdjsonDriver (a mixin: the driver provides the state, and
    bumps `_version` per processed batch)."""

    protocol: str
    target: DriverTarget
    cursor_store: CursorStore | None
    cursor: LineCursor[bytes | None]
    normalizer: Normalizer
    save_interval: float
    _batch_sink: Callable[..., Awaitable[None]] | None
    _sink_takes_cursor: bool
    _terminal: bool
    _loaded: bool
    _version: int
    _saved_version: int
    _in_batch: bool
    _batch_interrupted: bool
    _save_lock: asyncio.Lock
    _sink_takes_base: bool
    # The base row last handed to the sink: the cursor object and epoch it was taken from, and
    # its line (None: the next snapshot writes a new base).
    _base_of: tuple[LineCursor[bytes | None], int] | None = None
    _base_at: int = 0

    def _header(self, version: int, **extra: Any) -> bytes:
        return orjson.dumps(
            {
                "v": version,
                "protocol": self.protocol,
                "seen": self.cursor.seen,
                "normalizer": self.normalizer.state(),
                "terminal": self._terminal,
                **extra,
            }
        )

    def _snapshot_marks(self) -> tuple[bytes, bytes | None]:
        """The resume state as (delta, base row or None): a new base row when there is none
        yet for this cursor and epoch, or the delta would exceed DELTA_MAX lines. The caller
        hands both to the sink in one call (one transaction); if that call raises, the next
        snapshot writes a new base (`_forget_base`)."""
        cur = self.cursor
        seen = cur.seen
        base: bytes | None = None
        of = self._base_of
        if (
            of is None
            or of[0] is not cur
            or of[1] != cur.epoch
            or not (0 <= seen - self._base_at <= DELTA_MAX)
        ):
            base = b"".join((BASE_MAGIC, seen.to_bytes(8, "big"), cur.held_blob()))
            self._base_of = (cur, cur.epoch)
            self._base_at = seen
        header = self._header(DELTA_VERSION, base=self._base_at)
        delta = cur.tail_blob(seen - self._base_at)
        return b"".join((COMPACT_MAGIC, len(header).to_bytes(4, "big"), header, delta)), base

    def _forget_base(self) -> None:
        self._base_of = None

    async def _sink_cursor(self, events: list[Any]) -> None:
        """Hand `events` and the resume state to the cursor-taking sink, in one call."""
        sink = self._batch_sink
        assert sink is not None
        if not self._sink_takes_base:
            await sink(events, cursor=self._snapshot(compact=True))
            return
        delta, base = self._snapshot_marks()
        try:
            if base is None:
                await sink(events, cursor=delta)
            else:
                await sink(events, cursor=delta, cursor_base=base)
        except BaseException:
            self._forget_base()
            raise

    def _snapshot(self, *, compact: bool = False) -> bytes:
        """The resume state. `compact` (taken with every batch a cursor-taking sink commits,
        so it must be cheap): a small JSON header and the held digests as they are, with no
        per-snapshot encoding (a few microseconds, where the JSON form's base64 of the 16 KiB
        of digests costs tens). `_load_state` reads either form."""
        if compact:
            header = self._header(COMPACT_VERSION)
            return b"".join(
                (COMPACT_MAGIC, len(header).to_bytes(4, "big"), header, self.cursor.held_blob())
            )
        return orjson.dumps(
            {
                "v": STATE_VERSION,
                "protocol": self.protocol,
                "cursor": self.cursor.state(),
                "normalizer": self.normalizer.state(),
                "terminal": self._terminal,
            }
        )

    @staticmethod
    def _parse_state(
        data: bytes, cursor: LineCursor[bytes | None], base: bytes | None = None
    ) -> dict[str, Any]:
        """Restore `cursor` from a snapshot (any form; `base`: the agent's base row, for a
        delta); returns the rest of the state. Raises ValueError (or orjson.JSONDecodeError)
        when it is unreadable, or a delta does not fit its base."""
        if data.startswith(COMPACT_MAGIC):
            at = len(COMPACT_MAGIC)
            size = int.from_bytes(data[at : at + 4], "big")
            end = at + 4 + size
            if len(data) < end:
                raise ValueError("truncated compact cursor state")
            state = orjson.loads(data[at + 4 : end])
            version = state.get("v") if isinstance(state, dict) else None
            if version == COMPACT_VERSION:
                cursor.restore_blob(state.get("seen"), data[end:])
                return cast(dict[str, Any], state)
            if version != DELTA_VERSION:
                raise ValueError(f"unsupported cursor state version {state!r:.40}")
            if base is None:
                raise ValueError("the cursor's base row is missing")
            base_at, digests = parse_base(base)
            seen = state.get("seen")
            delta = data[end:]
            if (
                type(seen) is not int
                or state.get("base") != base_at
                or len(delta) != (seen - base_at) * DIGEST_SIZE
            ):
                raise ValueError(
                    f"the cursor (line {seen!r}, base {state.get('base')!r}, "
                    f"{len(delta) // DIGEST_SIZE} new digests) does not fit its base row "
                    f"(line {base_at})"
                )
            cursor.restore_blob(seen, digests + delta)
            return cast(dict[str, Any], state)
        state = orjson.loads(data)
        if not isinstance(state, dict) or state.get("v") != STATE_VERSION:
            raise ValueError(f"unsupported cursor state version {state!r:.40}")
        cursor.restore(state.get("cursor"))
        return cast(dict[str, Any], state)

    async def _save(self) -> None:
        """Persist the state if it changed since the last save. Never raises."""
        store = self.cursor_store
        via_sink = self._sink_takes_cursor
        if store is None and not via_sink:
            return
        if self._in_batch or self._batch_interrupted or not self._loaded:
            return
        async with self._save_lock:
            version = self._version
            if version == self._saved_version:
                return
            try:  # the snapshot is taken synchronously: consistent with the sink
                if via_sink:
                    await self._sink_cursor([])  # ordered after queued events
                else:
                    assert store is not None
                    await store.save_cursor(self.target.agent_id, self._snapshot())
            except Exception as e:
                log.warning("agent %s: cannot save the stream cursor: %s", self.target.agent_id, e)
                return
            self._saved_version = max(self._saved_version, version)

    async def _saver(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(max(0.01, self.save_interval - (time.monotonic() - last)))
            last = time.monotonic()
            await self._save()

    async def _load_state(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        store = self.cursor_store
        assert store is not None
        try:
            data = await store.load_cursor(self.target.agent_id)
            base = (
                await store.load_cursor(self.target.agent_id + BASE_SUFFIX)
                if data and bytes(data).startswith(COMPACT_MAGIC)
                else None
            )
        except Exception as e:
            log.warning("agent %s: cannot load the stream cursor: %s", self.target.agent_id, e)
            return
        if not data:
            return
        try:
            cursor: LineCursor[bytes | None] = LineCursor(self.cursor.window, self.cursor.ring)
            state = self._parse_state(bytes(data), cursor, bytes(base) if base else None)
        except (ValueError, orjson.JSONDecodeError) as e:
            log.warning(
                "agent %s: ignoring an unreadable stream cursor (history may repeat): %s",
                self.target.agent_id,
                e,
            )
            return
        self.cursor = cursor
        if state.get("v") == DELTA_VERSION:  # the stored base row goes on serving
            self._base_of = (cursor, cursor.epoch)
            self._base_at = int(state["base"])
        self.normalizer.restore(state.get("normalizer"))
        self._terminal = state.get("terminal") is True
        log.info(
            "agent %s: resuming the stream after %d lines%s",
            self.target.agent_id,
            cursor.seen,
            " (finished)" if self._terminal else "",
        )
