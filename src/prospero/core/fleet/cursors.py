"""Driver cursors written through the emitter, so that clustered they are fenced like events.

A driver keeps its resume state with `save_cursor` (the ACP driver's session state; an NDJSON
driver's cursor when its sink takes none). Straight into the store, a replica paused past its
lease TTL could, on waking, overwrite the cursor of the replica that took the agent over. Through
the emitter the cursor is a `CursorMark` of the agent's stream: committed in order after the
events queued before it and, clustered, under the agent's lease fence (a lost lease drops it,
ADR 0012). `save_cursor` returns once it is committed (or dropped), as a store's would.
"""

from __future__ import annotations

from prospero.core.emitter import Emitter
from prospero.core.fleet.state import CursorStoreLike


class EmitterCursors:
    def __init__(self, emitter: Emitter, store: CursorStoreLike, workspace: str) -> None:
        self.emitter = emitter
        self.store = store
        self.workspace = workspace

    async def load_cursor(self, key: str) -> bytes | None:
        return await self.store.load_cursor(key)

    async def save_cursor(self, key: str, data: bytes) -> None:
        agent, sep, _ = key.partition("#")
        if sep:
            # A secondary row (`<agent>#...`) rides with the agent's own cursor (`cursor_extra`
            # of the sink's path); alone it has no mark of its own: written as it is.
            await self.store.save_cursor(key, data)
            return
        await self.emitter.emit_many(self.workspace, agent, [], data)
        await self.emitter.flush()
