"""Exact re-attach for a replaying line stream (caliband-wire.md §4.2, §11 item 3).

On every connection a caliban worker writes the last 1024 lines of its history, then live lines,
with no marker between the two and no line numbers. Upstream Prospero deduplicated by counting
lines from the first one, which skips genuinely new lines once a run exceeds 1024 lines.

`LineCursor` instead remembers how many lines it has consumed (`seen`) and a stable digest of
each of the last `window` (>= the worker's 1024) lines. A new connection's first lines are
matched against the candidates "the replay starts at my line s" for
s in [max(1, seen - held + 1), seen + 1]: candidate s predicts that incoming line i equals held
line s + i for every i < overlap(s) = seen - s + 1. Candidates die on the first contradiction.
The longest-overlap candidate still alive wins as soon as it is fully verified (so every longer
candidate has died); the buffered lines beyond its overlap are new and are released in order.
If every overlapping candidate dies, the replay does not overlap what we hold: lines were lost
while we were away, a `Gap` is reported before the (new) incoming lines.

Why the longest: the true candidate never dies, so the chosen overlap is never shorter than the
true one and a line is never delivered twice.

Remaining ambiguity (documented, inherent to a wire without line numbers):

- Periodic streams. A longer candidate than the true one survives only if the stream repeats
  with some period d over the whole overlap (e.g. > 1000 identical consecutive lines). Then the
  cursor waits for it to die; if it never does (the stream keeps repeating, or the connection
  ends first) the lines of that connection stay undecided; if it is verified, d genuinely new
  (identical) lines are taken for replayed ones and dropped. Never a duplicate, but possibly a
  silent loss of repeated lines in this pathological case.
- A replay that begins, by coincidence, with a copy of our last few lines although lines were
  lost in between is taken for an overlap (the gap goes unreported). This needs both a real loss
  (> 1024 lines produced while detached) and repeated lines at exactly the boundary.
- A zero-overlap replay is reported as a gap even in the boundary case where exactly 1024 lines
  were produced while detached (contiguous, nothing lost): from the lines alone the two cases
  are indistinguishable, so the count of missing lines is unknown (`missing=None`).
- Lines the worker drops for a slow reader *inside* a connection (broadcast lag) leave a hole in
  what we hold; a later replay covering the hole disagrees with us and is handled as a gap, so
  lines after the hole may then be delivered again.
- With nothing held yet (`seen == 0`, the first connection) every line is new; lines that had
  already left the worker's ring before that first connection cannot be noticed. Prospero
  attaches right after spawn, so in practice the first replay starts at line 1.
- If a connection ends before the winning candidate is verified, its buffered lines are
  discarded undecided (they are all old under the surviving longest candidate) and the next
  connection's replay decides again.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

P = TypeVar("P")

DIGEST_SIZE = 8
DEFAULT_WINDOW = 2048
WORKER_RING = 1024


def line_digests(lines: list[bytes]) -> list[bytes]:
    """`line_digest` of each line, in bulk."""
    b2 = hashlib.blake2b
    return [b2(line + b"\n", digest_size=DIGEST_SIZE).digest() for line in lines]


def line_digest(line: bytes) -> bytes:
    """Stable 8-byte digest of a line *including* its newline (matches OversizedLine.digest)."""
    h = hashlib.blake2b(line, digest_size=DIGEST_SIZE)
    h.update(b"\n")
    return h.digest()


@dataclass(frozen=True, slots=True)
class NewLine(Generic[P]):
    """A line never consumed before: process it."""

    payload: P


@dataclass(frozen=True, slots=True)
class Gap:
    """The replay did not overlap what we hold: `missing` lines (None = unknown) were lost."""

    missing: int | None
    detail: str


class LineCursor(Generic[P]):
    """Dedups a replay-then-live line stream across reconnects. Pure; no I/O.

    Use: `begin_connection()` on each new connection, `push(digest, payload)` per line (returns
    the `NewLine`s / `Gap` now decided, in order), `end_connection()` at EOF or error.
    """

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self._seen = 0
        self._held: list[bytes] = []  # digests of lines seen-len+1 .. seen
        self._matching = False
        self._buf: list[tuple[bytes, P]] = []
        self._alive: list[int] = []  # candidate replay starts (absolute, ascending), overlap > 0

    # ---- inspection ---------------------------------------------------------------------------

    @property
    def seen(self) -> int:
        """Lines consumed so far (decided new) over the cursor's whole life."""
        return self._seen

    @property
    def matching(self) -> bool:
        """True while the current connection's overlap is still undecided."""
        return self._matching

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def held(self) -> int:
        """How many of the most recent lines are held for overlap matching (<= window)."""
        return min(len(self._held), self.window)

    # ---- connection lifecycle -----------------------------------------------------------------

    def begin_connection(self) -> None:
        if len(self._held) > self.window:
            del self._held[: len(self._held) - self.window]
        self._buf = []
        self._alive = []
        # Nothing held: every line is new (the first connection, or a fresh cursor).
        self._matching = self._seen > 0

    def push(self, digest: bytes, payload: P) -> list[NewLine[P] | Gap]:
        if not self._matching:
            self._commit(digest)
            return [NewLine(payload)]
        i = len(self._buf)
        self._buf.append((digest, payload))
        held = self._held
        seen = self._seen
        first = seen - len(held) + 1  # absolute number of held[0]
        if i == 0:
            self._alive = [first + j for j, d in enumerate(held) if d == digest]
        else:
            self._alive = [s for s in self._alive if s + i > seen or held[s + i - first] == digest]
        if not self._alive:
            return self._decide(0)
        longest = seen - self._alive[0] + 1
        if len(self._buf) >= longest:
            return self._decide(longest)
        return []

    def push_many(self, digests: list[bytes], payloads: list[P]) -> tuple[Gap | None, list[P]]:
        """`push` for a batch of lines (same decisions, line for line), shaped for speed.

        Returns the `Gap` decided within this batch, if any, and the payloads of the lines now
        decided new, in order. Within one connection there is at most one decision, so the gap
        always precedes every payload returned with it.
        """
        if len(digests) != len(payloads):
            raise ValueError("digests and payloads differ in length")
        gap: Gap | None = None
        out: list[P] = []
        i = 0
        n = len(digests)
        while self._matching and i < n:
            for item in self.push(digests[i], payloads[i]):
                if isinstance(item, Gap):
                    gap = item
                else:
                    out.append(item.payload)
            i += 1
        if i < n:
            # Not matching: every remaining line is new (the `_commit` fast path, in bulk).
            rest_d = digests[i:] if i else digests
            self._seen += len(rest_d)
            held = self._held
            held.extend(rest_d)
            if len(held) > 2 * self.window:
                del held[: len(held) - self.window]
            if out:
                out.extend(payloads[i:])
            else:
                out = payloads[i:] if i else list(payloads)
        return gap, out

    def end_connection(self) -> int:
        """The connection ended. Returns how many undecided lines were discarded."""
        dropped = len(self._buf) if self._matching else 0
        self._buf = []
        self._alive = []
        self._matching = False
        return dropped

    # ---- persistence --------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Committed state only (an undecided connection is simply replayed again)."""
        held = self._held[-self.window :]
        return {"seen": self._seen, "held": base64.b64encode(b"".join(held)).decode("ascii")}

    def restore(self, state: Any) -> None:
        """Inverse of `state()`. Raises ValueError on malformed input."""
        if not isinstance(state, dict):
            raise ValueError("cursor state is not an object")
        seen = state.get("seen")
        raw = state.get("held")
        if (
            not isinstance(seen, int)
            or isinstance(seen, bool)
            or seen < 0
            or not isinstance(raw, str)
        ):
            raise ValueError("cursor state lacks seen/held")
        blob = base64.b64decode(raw, validate=True)
        if len(blob) % DIGEST_SIZE:
            raise ValueError("cursor digests are truncated")
        held = [blob[k : k + DIGEST_SIZE] for k in range(0, len(blob), DIGEST_SIZE)]
        if len(held) > seen:
            raise ValueError("cursor holds more digests than lines seen")
        self._seen = seen
        self._held = held[-self.window :]
        self._buf = []
        self._alive = []
        self._matching = False

    # ---- internals ----------------------------------------------------------------------------

    def _commit(self, digest: bytes) -> None:
        self._seen += 1
        self._held.append(digest)
        if len(self._held) > 2 * self.window:
            del self._held[: len(self._held) - self.window]

    def _decide(self, overlap: int) -> list[NewLine[P] | Gap]:
        out: list[NewLine[P] | Gap] = []
        if overlap == 0:
            out.append(
                Gap(
                    missing=None,
                    detail=(
                        f"reconnected after {self._seen} lines but the agent's replay does not "
                        f"overlap them; lines produced while detached were lost (the worker "
                        f"replays only its last {WORKER_RING} lines)"
                    ),
                )
            )
        buf = self._buf
        self._buf = []
        self._alive = []
        self._matching = False
        for digest, payload in buf[overlap:]:
            self._commit(digest)
            out.append(NewLine(payload))
        return out
