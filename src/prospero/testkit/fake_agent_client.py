"""One reader connected to a fake agent worker's stream: its replay snapshot, its bounded
live queue (a reader that falls behind loses its oldest lines, like caliband's broadcast
channel), the loop that writes both to the connection in batches, and the clean close
(half-close, drain the peer, so it sees FIN, not RST)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from prospero.core.aio import wait_for

DRAIN_DEADLINE = 0.5  # how long to wait for the peer's EOF after our half-close
WRITE_BATCH = 64 * 1024


class AttachClient:
    """One connected reader: its replay snapshot and its bounded live queue."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        backlog: list[bytes],
        cap: int,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.backlog = backlog
        self.pending: deque[bytes] = deque()
        self.cap = cap
        self.dropped = 0
        self.eof = False  # close gracefully once pending is written
        self.stalled = False  # a fault plan's slow reader: pending is not written meanwhile
        self.aborted = False  # stop writing now
        self.wake = asyncio.Event()

    def offer(self, line: bytes) -> bool:
        """Queue a live line; when full, lose the oldest one (broadcast lag). False if lost."""
        lost = False
        if len(self.pending) >= self.cap:
            self.pending.popleft()
            self.dropped += 1
            lost = True
        self.pending.append(line)
        self.wake.set()
        return not lost

    async def write_all(self) -> bool:
        """Write backlog then live lines. True when it ended by a graceful EOF."""
        w = self.writer
        batch: list[bytes] = []
        size = 0
        for line in self.backlog:
            batch.append(line + b"\n")
            size += len(line) + 1
            if size >= WRITE_BATCH:
                w.write(b"".join(batch))
                batch, size = [], 0
                await w.drain()
                if self.aborted:
                    return False
        if batch:
            w.write(b"".join(batch))
            await w.drain()
        self.backlog = []
        while not self.aborted:
            if self.pending and not self.stalled:
                batch, size = [], 0
                while self.pending and size < WRITE_BATCH:
                    line = self.pending.popleft()
                    batch.append(line + b"\n")
                    size += len(line) + 1
                w.write(b"".join(batch))
                await w.drain()
                continue
            if self.eof and not self.pending:
                return True
            self.wake.clear()
            await self.wake.wait()
        return False

    async def close(self, rtask: asyncio.Task[None], graceful: bool) -> None:
        """Close the connection: after a graceful end a half-close first (FIN, never RST);
        `rtask` (the inbound reader) is cancelled last."""
        w = self.writer
        try:
            if graceful and not self.aborted and not w.transport.is_closing():
                if w.can_write_eof():
                    # Half-close, then keep draining the peer's bytes until it closes too, so
                    # our close never finds unread data (which would turn FIN into RST).
                    w.write_eof()
                    await asyncio.wait({rtask}, timeout=DRAIN_DEADLINE)
                # TLS: close() sends close_notify and drains until the peer's close_notify.
            w.close()
            with contextlib.suppress(Exception):
                await wait_for(w.wait_closed(), 1.0)
        except Exception:
            w.transport.abort()
        finally:
            rtask.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await rtask
