"""Exact re-attach for a replaying line stream (caliband-wire.md §4.2, §11 item 3).

On every connection a caliban worker writes the last 1024 lines of its history, then live lines,
with no marker between the two and no line numbers. Upstream Prospero deduplicated by counting
lines from the first one, which skips genuinely new lines once a run exceeds 1024 lines.

`LineCursor` instead remembers how many lines it has consumed (`seen`) and a stable digest of
each of the last `window` (>= the worker's 1024) lines. A new connection's first lines are
matched against the candidates "the replay starts at my line s" for
s in [max(1, seen - held + 1, seen - ring + 1), seen + 1] (a replay is at most `ring` lines):
candidate s predicts that incoming line i equals held line s + i for every
i < overlap(s) = seen - s + 1. Candidates die on the first contradiction.
The longest-overlap candidate still alive wins as soon as it is fully verified (so every longer
candidate has died); the buffered lines beyond its overlap are new and are released in order.
If every overlapping candidate dies, the replay does not overlap what we hold: lines were lost
while we were away, a `Gap` is reported before the (new) incoming lines.

Why the longest: the true candidate never dies (unless what we hold has a hole, below), so the
chosen overlap is never shorter than the true one and a line is never delivered twice.

Ambiguity is never silent. When the longest candidate is verified while shorter ones are still
alive (the stream repeats with some period over the overlap: identical or periodic lines), the
true overlap is one of the survivors; the longest is taken (never a duplicate) and a `Gap` with
reason `ambiguous_overlap` and `missing` = longest - shortest surviving overlap (the upper bound
of the lines possibly taken for replayed ones) precedes the new lines. Where the agent's
transcript is readable the driver does not rely on this at all: it reads lines by position from
`stdout.ndjson` (see `transcript`), which is exact.

Lines the worker drops for a slow reader *inside* a connection (broadcast lag) leave a hole in
what we hold; a later replay covering the hole contradicts the true candidate (and with
repeating lines a shorter, coincidental one may survive). So when every candidate dies, or one
dies after verifying `SUSPECT_RUN` lines, the cursor looks for its last held line inside the
replay (an anchor) and accepts a copy only where the replay is what we hold with at most one
hole (`_fit`): the lines after the anchor are new, and a `Gap` with reason `slow_reader` stands
for the hole. The anchor is taken at once when our last line is unique in what we hold, else
once the whole replay (`ring` lines) has been seen, at the latest fitting copy (never a
duplicate). Without an anchor within `ring` lines the replay does not overlap: `no_overlap`.

Remaining ambiguity (documented, inherent to a wire without line numbers):

- A replay that begins, by coincidence, with a copy of our last few lines although lines were
  lost in between is taken for an overlap (the gap goes unreported). This needs both a real loss
  (> 1024 lines produced while detached) and repeated lines at exactly the boundary. The same
  holds for an ambiguous overlap: its bound assumes the replay does overlap.
- A zero-overlap replay is reported as a gap even in the boundary case where exactly 1024 lines
  were produced while detached (contiguous, nothing lost): from the lines alone the two cases
  are indistinguishable, so the count of missing lines is unknown (`missing=None`).
- A slow-reader hole that has already left the worker's ring when we reconnect, or with no
  reconnect after it, or whose length is a multiple of the stream's period, is not detectable on
  the socket (the transcript path has no holes).
- With nothing held yet (`seen == 0`, the first connection) every line is new; lines that had
  already left the worker's ring before that first connection cannot be noticed. Prospero
  attaches right after spawn, so in practice the first replay starts at line 1.
- If a connection ends before the winning candidate (or an anchor) is verified, its buffered
  lines are discarded undecided (they are all old under the surviving longest candidate) and
  the next connection's replay decides again.
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
# Held lines the transcript re-base looks for (the end of what we hold).
ANCHOR_LINES = 16
# A candidate that dies after verifying this many replay lines suggests a hole in what we hold.
SUSPECT_RUN = 4

NO_OVERLAP = "no_overlap"
AMBIGUOUS_OVERLAP = "ambiguous_overlap"
SLOW_READER = "slow_reader"


# An initialised hash to copy: cheaper per line than constructing one (no keyword parsing).
_BLANK_DIGEST = hashlib.blake2b(digest_size=DIGEST_SIZE)


def line_digests(lines: list[bytes]) -> list[bytes]:
    """`line_digest` of each line, in bulk (the same digests, computed for speed)."""
    copy = _BLANK_DIGEST.copy
    out: list[bytes] = []
    append = out.append
    for line in lines:
        h = copy()
        h.update(line)
        h.update(b"\n")
        append(h.digest())
    return out


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
    """Continuity not proven: `missing` lines (None = unknown; an upper bound for
    `ambiguous_overlap`) may have been lost, for `reason`."""

    missing: int | None
    detail: str
    reason: str = NO_OVERLAP


class LineCursor(Generic[P]):
    """Dedups a replay-then-live line stream across reconnects. Pure; no I/O.

    Use: `begin_connection()` on each new connection, `push(digest, payload)` per line (returns
    the `NewLine`s / `Gap` now decided, in order), `end_connection()` at EOF or error.
    """

    def __init__(self, window: int = DEFAULT_WINDOW, ring: int = WORKER_RING) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        if ring < 1:
            raise ValueError("ring must be >= 1")
        self.window = window
        self.ring = ring  # the worker's replay length (caliban: 1024)
        self._seen = 0
        self._held: list[bytes] = []  # digests of lines seen-len+1 .. seen
        # The same digests concatenated, kept in step with `_held` (`held_blob`: the resume
        # snapshot's digests without a per-snapshot join or encoding).
        self._held_bytes = bytearray()
        # Bumped whenever the held digests are replaced rather than extended (restore,
        # rebase): a delta snapshot (`tail_blob`) is only valid against a base of one epoch.
        self.epoch = 0
        self._matching = False
        self._buf: list[tuple[bytes, P]] = []
        self._alive: list[int] = []  # candidate replay starts (absolute, ascending), overlap > 0
        # Anchor search (every candidate died): where our last held line occurs in the replay.
        self._anchoring = False
        self._last_unique = False  # our last line occurs once in what we hold
        self._anchors: list[int] = []  # buffer indexes holding a copy of our last line
        self._deaths: dict[int, int] = {}  # candidate start -> replay lines it verified
        self._suspect = False  # a candidate died after verifying SUSPECT_RUN lines

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

    @property
    def anchoring(self) -> bool:
        """True while every overlap candidate died and the cursor looks for its anchor."""
        return self._matching and self._anchoring

    def held_digests(self) -> list[bytes]:
        """Digests of the held lines, oldest first (lines seen-held+1 .. seen)."""
        return self._held[-self.window :]

    def held_blob(self) -> bytes:
        """`held_digests()` concatenated (DIGEST_SIZE bytes each): cheap, for snapshots."""
        return bytes(self._held_bytes[-self.window * DIGEST_SIZE :])

    def tail_blob(self, n: int) -> bytes:
        """The digests of the last `n` lines seen (lines seen-n+1 .. seen), concatenated.
        Raises ValueError when fewer are held."""
        if n < 0 or n > len(self._held):
            raise ValueError(f"{n} digests asked, {len(self._held)} held")
        return bytes(self._held_bytes[len(self._held_bytes) - n * DIGEST_SIZE :])

    def begin_connection(self) -> None:
        self._trim(self.window)
        self._reset_matching()
        # Nothing held: every line is new (the first connection, or a fresh cursor).
        self._matching = self._seen > 0

    def commit_many(self, digests: list[bytes]) -> None:
        """Take lines as new without matching (their position is known: the transcript)."""
        if self._matching:
            raise RuntimeError("commit_many while a replay is being matched")
        self._seen += len(digests)
        self._extend(digests)

    def rebase(self, seen: int, digests: list[bytes]) -> None:
        """Continue from line `seen` whose last lines have `digests` (from the transcript,
        when what we hold turned out to have a hole)."""
        if len(digests) > seen:
            raise ValueError("more digests than lines")
        self._seen = seen
        self._set_held(list(digests[-self.window :]))
        self._reset_matching()

    def push(self, digest: bytes, payload: P) -> list[NewLine[P] | Gap]:
        if not self._matching:
            self._commit(digest)
            return [NewLine(payload)]
        i = len(self._buf)
        self._buf.append((digest, payload))
        if self._anchoring:
            return self._anchor_step(i, digest)
        held = self._held
        seen = self._seen
        first = seen - len(held) + 1  # absolute number of held[0]
        if i == 0:
            # A replay is at most `ring` lines, so no true overlap is longer than that.
            lo = max(0, len(held) - self.ring)
            self._alive = [first + j for j in range(lo, len(held)) if held[j] == digest]
            self._deaths = {}
        else:
            prev = self._alive
            alive = [s for s in prev if s + i > seen or held[s + i - first] == digest]
            if len(alive) != len(prev):
                for s in set(prev).difference(alive):
                    self._deaths[s] = i
                if i >= SUSPECT_RUN:
                    self._suspect = True
            self._alive = alive
        if not self._alive or self._suspect:
            if not held:
                return self._decide(0)
            # Every candidate died, or one died after verifying a run of lines: a hole (slow
            # reader) in what we hold, or no overlap at all. A survivor may be a coincidence
            # of repeating lines, so look for where our last line really is.
            self._anchoring = True
            self._last_unique = held.count(held[-1]) == 1
            out: list[NewLine[P] | Gap] = []
            for idx in range(i + 1):  # the anchor may already be in the buffer
                out = self._anchor_step(idx, self._buf[idx][0])
                if out or not self._matching:
                    break
            return out
        longest = seen - self._alive[0] + 1
        if len(self._buf) >= longest:
            shortest = seen - self._alive[-1] + 1
            return self._decide(longest, shortest)
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
            self._extend(rest_d)
            if out:
                out.extend(payloads[i:])
            else:
                out = payloads[i:] if i else list(payloads)
        return gap, out

    def settle(self) -> tuple[Gap | None, list[P]]:
        """The connection has gone quiet while the anchor is looked for: the whole replay is
        in (a worker writes it at once), so decide with what is buffered, as `_anchor_step`
        does at `ring` lines. A no-op unless `anchoring`."""
        if not self.anchoring:
            return None, []
        if len(self._buf) < min(self.ring, self._seen):
            # The worker has at least `seen` lines, so its replay is at least min(ring, seen)
            # long: a replay shorter than that is not all in yet (a stall mid-replay, e.g. a
            # starved worker), and deciding now could take old lines for new ones.
            return None, []
        if self._anchors:
            fits = [(p, h) for p in self._anchors if (h := self._fit(p)) is not None]
            if fits:
                p, hole = fits[-1]
                items = self._decide_anchor(p, hole, exact=len(fits) == 1 and self._last_unique)
            else:
                items = self._decide_anchor(self._anchors[-1], None, exact=False)
        else:
            items = self._decide(0)
        gap = next((x for x in items if isinstance(x, Gap)), None)
        return gap, [x.payload for x in items if isinstance(x, NewLine)]

    def end_connection(self) -> int:
        """The connection ended. Returns how many undecided lines were discarded."""
        dropped = len(self._buf) if self._matching else 0
        self._reset_matching()
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
        self.restore_blob(seen, base64.b64decode(raw, validate=True))

    def restore_blob(self, seen: int, blob: bytes) -> None:
        """`restore` from `seen` and `held_blob()` (a compact snapshot). Raises ValueError."""
        if type(seen) is not int or seen < 0:
            raise ValueError("cursor state lacks seen")
        if len(blob) % DIGEST_SIZE:
            raise ValueError("cursor digests are truncated")
        held = [blob[k : k + DIGEST_SIZE] for k in range(0, len(blob), DIGEST_SIZE)]
        if len(held) > seen:
            raise ValueError("cursor holds more digests than lines seen")
        self._seen = seen
        self._set_held(held[-self.window :])
        self._reset_matching()
        self._matching = False

    # ---- internals ----------------------------------------------------------------------------

    def _commit(self, digest: bytes) -> None:
        self._seen += 1
        self._held.append(digest)
        self._held_bytes += digest
        if len(self._held) > 2 * self.window:
            self._trim(self.window)

    def _extend(self, digests: list[bytes]) -> None:
        self._held.extend(digests)
        self._held_bytes += b"".join(digests)
        if len(self._held) > 2 * self.window:
            self._trim(self.window)

    def _trim(self, keep: int) -> None:
        extra = len(self._held) - keep
        if extra > 0:
            del self._held[:extra]
            del self._held_bytes[: extra * DIGEST_SIZE]

    def _set_held(self, held: list[bytes]) -> None:
        self.epoch += 1
        self._held = held
        self._held_bytes = bytearray(b"".join(held))

    def _reset_matching(self) -> None:
        self._buf = []
        self._alive = []
        self._anchoring = False
        self._anchors = []
        self._deaths = {}
        self._suspect = False

    def _anchor_step(self, i: int, digest: bytes) -> list[NewLine[P] | Gap]:
        """Buffer line `i` arrived while looking for the anchor: decide if we can.

        An anchor is a copy of our last held line at replay index p < ring. It *fits* when
        the replay up to it is what we hold with at most one hole: the `sc` lines before it
        match our last `sc` lines and either that reaches the replay's start (a plain overlap,
        no hole) or the replay's start matches our held lines at the offset that leaves
        `L >= 1` lines between (the hole). A fitting anchor is taken at once when our last
        line is unique in what we hold and no other copy was seen; otherwise the whole replay
        is awaited and the latest fitting anchor (else the latest copy at all) is taken:
        never a duplicate, and the possible loss is reported."""
        held = self._held
        if i < self.ring and digest == held[-1]:
            self._anchors.append(i)
            if self._last_unique and len(self._anchors) == 1:
                hole = self._fit(i)
                if hole is not None:
                    return self._decide_anchor(i, hole, exact=True)
        if len(self._buf) >= self.ring:
            if not self._anchors:
                return self._decide(0)
            fits = [(p, h) for p in self._anchors if (h := self._fit(p)) is not None]
            if fits:
                p, hole = fits[-1]
                return self._decide_anchor(p, hole, exact=len(fits) == 1)
            return self._decide_anchor(self._anchors[-1], None, exact=False)
        return []

    def _fit(self, p: int) -> int | None:
        """0 if the replay up to index p is exactly our last p+1 lines; the hole length L if
        it is our held lines with one hole of L lines (see `_anchor_step`); else None."""
        held = self._held
        buf = self._buf
        n = len(held)
        sc = 0
        while sc <= p and sc < n and buf[p - sc][0] == held[-1 - sc]:
            sc += 1
        if sc == p + 1:
            return 0
        first = self._seen - n + 1
        best: int | None = None
        for start, verified in self._deaths.items():
            d = start - first  # held index of the replay's first line under this candidate
            hole = d - n + 1 + p
            before = n - sc - d  # replay lines before the hole
            if hole >= 1 and before >= 1 and verified >= before:
                best = hole if best is None else min(best, hole)
        return best

    def _decide_anchor(self, at: int, hole: int | None, *, exact: bool) -> list[NewLine[P] | Gap]:
        """Our last held line is buffer line `at`; `hole` lines (None: unknown) are missing
        before it in what we hold; `exact` when no other reading of the replay fits."""
        out: list[NewLine[P] | Gap] = []
        if not (exact and hole == 0):
            reason = AMBIGUOUS_OVERLAP if hole == 0 else SLOW_READER
            out.append(
                Gap(
                    missing=hole if exact else None,
                    detail=(
                        "the agent's replay disagrees with the lines we hold (the worker drops "
                        "lines for a slow reader, or its lines repeat); continuing after our "
                        f"last line, found {at + 1} lines into the replay"
                        + ("" if exact else "; other readings fit too, so lines may be lost")
                    ),
                    reason=reason,
                )
            )
        buf = self._buf
        self._reset_matching()
        self._matching = False
        for digest, payload in buf[at + 1 :]:
            self._commit(digest)
            out.append(NewLine(payload))
        return out

    def _decide(self, overlap: int, shortest: int | None = None) -> list[NewLine[P] | Gap]:
        out: list[NewLine[P] | Gap] = []
        if overlap == 0:
            out.append(
                Gap(
                    missing=None,
                    detail=(
                        f"reconnected after {self._seen} lines but the agent's replay does not "
                        f"overlap them; lines produced while detached were lost (the worker "
                        f"replays only its last {self.ring} lines)"
                    ),
                    reason=NO_OVERLAP,
                )
            )
        elif shortest is not None and shortest < overlap:
            out.append(
                Gap(
                    missing=overlap - shortest,
                    detail=(
                        f"the agent's replay overlaps our last {overlap} lines as well as our "
                        f"last {shortest} (its lines repeat); taking the longest overlap, so up "
                        f"to {overlap - shortest} new lines may have been taken for replayed "
                        f"ones"
                    ),
                    reason=AMBIGUOUS_OVERLAP,
                )
            )
        buf = self._buf
        self._reset_matching()
        self._matching = False
        for digest, payload in buf[overlap:]:
            self._commit(digest)
            out.append(NewLine(payload))
        return out
