"""NdjsonDriver's resume state: the snapshot forms, and saving and loading them.

`ResumeState` is mixed into `NdjsonDriver` (see its module docstring). The state is the line
cursor, the normaliser state and the terminal flag. A sink whose `emit_batch` takes `cursor=`
gets the full snapshot with every batch, so the store commits the cursor in the same
transaction as the events it covers: a restarted prosperod re-emits nothing already stored.
That snapshot is the compact form (`_snapshot(compact=True)`: a small header and the held
digests as raw bytes, a few microseconds per read); `_load_state` reads it and the JSON form
the `CursorStore` path saves. Other sinks use the `CursorStore` (periodically and at the end
of every connection; after a crash up to ~`save_interval` seconds of events may repeat).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import orjson

from prospero.core.drivers.base import CursorStore, DriverTarget
from prospero.core.drivers.line_cursor import LineCursor
from prospero.core.normalize import Normalizer

log = logging.getLogger("prospero.core.drivers.ndjson")

STATE_VERSION = 1
# The compact snapshot (what goes with every batch to a cursor-taking sink, see `_snapshot`):
# this prefix (never the start of JSON), the header's length (4 bytes, big-endian), the
# header (JSON: everything but the digests), then the cursor's held digests as raw bytes.
COMPACT_MAGIC = b"\x00PC2"
COMPACT_VERSION = 2


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

    def _snapshot(self, *, compact: bool = False) -> bytes:
        """The resume state. `compact` (taken with every batch a cursor-taking sink commits,
        so it must be cheap): a small JSON header and the held digests as they are, with no
        per-snapshot encoding (a few microseconds, where the JSON form's base64 of the 16 KiB
        of digests costs tens). `_load_state` reads either form."""
        if compact:
            header = orjson.dumps(
                {
                    "v": COMPACT_VERSION,
                    "protocol": self.protocol,
                    "seen": self.cursor.seen,
                    "normalizer": self.normalizer.state(),
                    "terminal": self._terminal,
                }
            )
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
    def _parse_state(data: bytes, cursor: LineCursor[bytes | None]) -> dict[str, Any]:
        """Restore `cursor` from a snapshot (either form); returns the rest of the state.
        Raises ValueError (or orjson.JSONDecodeError) when it is unreadable."""
        if data.startswith(COMPACT_MAGIC):
            at = len(COMPACT_MAGIC)
            size = int.from_bytes(data[at : at + 4], "big")
            end = at + 4 + size
            if len(data) < end:
                raise ValueError("truncated compact cursor state")
            state = orjson.loads(data[at + 4 : end])
            if not isinstance(state, dict) or state.get("v") != COMPACT_VERSION:
                raise ValueError(f"unsupported cursor state version {state!r:.40}")
            cursor.restore_blob(state.get("seen"), data[end:])  # type: ignore[arg-type]
            return state
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
            data = self._snapshot(compact=via_sink)  # synchronously: consistent with the sink
            try:
                if via_sink:
                    assert self._batch_sink is not None
                    await self._batch_sink([], cursor=data)  # ordered after queued events
                else:
                    assert store is not None
                    await store.save_cursor(self.target.agent_id, data)
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
        except Exception as e:
            log.warning("agent %s: cannot load the stream cursor: %s", self.target.agent_id, e)
            return
        if not data:
            return
        try:
            cursor: LineCursor[bytes | None] = LineCursor(self.cursor.window, self.cursor.ring)
            state = self._parse_state(bytes(data), cursor)
        except (ValueError, orjson.JSONDecodeError) as e:
            log.warning(
                "agent %s: ignoring an unreadable stream cursor (history may repeat): %s",
                self.target.agent_id,
                e,
            )
            return
        self.cursor = cursor
        self.normalizer.restore(state.get("normalizer"))
        self._terminal = state.get("terminal") is True
        log.info(
            "agent %s: resuming the stream after %d lines%s",
            self.target.agent_id,
            cursor.seen,
            " (finished)" if self._terminal else "",
        )
