"""Identical lines from many ranks shown once: ``[ranks 0-1023] UserWarning: ...``.

A thousand ranks importing the same library print the same warning a thousand times; the
console should show it once, with the ranks that said it. `LineCollapser` is that decision,
pure: lines come in as (time, rank, stream, text), console lines (`Shown`) come out. The rank
logs are written before this and keep every line; only the console collapses.

The rules, which README.md ("Watching a job") states for users:

- **Exact text.** Lines collapse when their text is identical, byte for byte, on the same
  stream (stdout and stderr are never merged). Lines that differ only in a number (a rank, a
  step, a time) are different lines: normalising digits would merge lines that mean different
  things ("shard 3 missing" from rank 3 and "shard 5 missing" from rank 5).
- **The lead rank is never delayed.** The lowest rank shown (rank 0 unless ``--ranks`` says
  otherwise) prints each line at once, as without collapsing; the same text from other ranks
  is folded into one follow-up line naming them (``[ranks 1-1023] ...``), so every rank is
  named exactly once and the follow-up is readable on its own.
- **Other ranks wait a little.** A line of another rank is held while more ranks may say the
  same: it prints once no new rank has joined it for ``quiet`` seconds, once every shown rank
  has said it, or ``max_hold`` seconds after it was first seen, whichever comes first. A line
  only one rank said prints as it does today (``[host:rank] ...``).
- **A rank's lines stay in order.** Held lines print in the order they were first seen, and a
  rank joins a held line only if that line comes after the rank's own held lines (the oldest
  such: a rank's second "epoch done" joins the others' second); otherwise its line starts a
  new one, printed after them.
- **Bounded.** At most ``max_pending`` held lines and ``max_bytes`` of held text (and rank
  lists); beyond that the oldest prints at once. Time is the caller's clock (the
  controller's), so the rules are testable with an injected one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = [
    "COLLAPSE_ABOVE",
    "LineCollapser",
    "MAX_HOLD",
    "MAX_PENDING",
    "MAX_PENDING_BYTES",
    "QUIET",
    "Shown",
    "collapse_wanted",
]

COLLAPSE_ABOVE = 8
"""Collapsing is on by default when the console shows more ranks than this (one 8-GPU node
keeps one line per rank, as before)."""
QUIET = 0.5
"""Seconds without a new rank saying a held line after which it prints."""
MAX_HOLD = 2.0
"""The longest a line is held, in seconds from when it was first seen (ranks on many hosts
start up to a second or two apart, so their import warnings come that far apart)."""
MAX_PENDING = 4096
"""Held lines at most (distinct texts waiting); the oldest prints beyond it."""
MAX_PENDING_BYTES = 16 * 1024 * 1024
"""Held text and rank lists at most, in bytes; the oldest prints beyond it."""
_RANK_BYTES = 8  # what one rank in a held line's rank list is counted as


def collapse_wanted(requested: bool | None, shown_ranks: int) -> bool:
    """``--collapse``/``--no-collapse`` win; by default, on above COLLAPSE_ABOVE ranks shown."""
    if requested is not None:
        return requested
    return shown_ranks > COLLAPSE_ABOVE


@dataclass(frozen=True)
class Shown:
    """One console line: ``text`` said on ``stream`` by ``ranks`` (sorted; one rank is shown
    with its host tag as usual, several as ``[ranks 0-3,5]``)."""

    ranks: tuple[int, ...]
    stream: str
    text: str


class _Held:
    """A line waiting for more ranks to say it (a plain class: one is made per line held)."""

    __slots__ = ("seq", "stream", "text", "first_at", "joined_at", "ranks", "lead_said")

    def __init__(self, seq: int, stream: str, text: str, now: float):
        self.seq = seq
        self.stream = stream
        self.text = text
        self.first_at = now
        self.joined_at = now
        self.ranks: list[int] = []
        """Ranks that said it, the lead excepted (each at most once)."""
        self.lead_said = False
        """The lead rank said it too: already printed, so not named again."""

    @property
    def size(self) -> int:
        return len(self.text) + _RANK_BYTES * len(self.ranks)


class LineCollapser:
    """Rank lines in, console lines out. ``lead``: the rank printed at once; ``shown``: how
    many ranks the console shows (a line every one of them said prints without waiting)."""

    def __init__(
        self,
        lead: int,
        shown: int,
        *,
        quiet: float = QUIET,
        max_hold: float = MAX_HOLD,
        max_pending: int = MAX_PENDING,
        max_bytes: int = MAX_PENDING_BYTES,
    ):
        self.lead = lead
        self.shown = shown
        self.quiet = quiet
        self.max_hold = max_hold
        self.max_pending = max_pending
        self.max_bytes = max_bytes
        self._held: deque[_Held] = deque()
        """Held lines, oldest first: the order they print in."""
        self._by_text: dict[tuple[str, str], deque[_Held]] = {}
        """(stream, text) -> the held lines with that text, oldest first."""
        self._last_seq: dict[int, int] = {}
        """rank -> seq of the newest held line it said (a rank joins only later ones)."""
        self._seq = 0
        self._bytes = 0

    @property
    def pending(self) -> int:
        """Lines held now."""
        return len(self._held)

    def add(self, now: float, rank: int, stream: str, text: str) -> list[Shown]:
        """One complete line of ``rank``; returns what prints now: the lead's own line, and
        older held lines pushed out by the bounds (before it)."""
        held = self._joinable(rank, (stream, text), now)
        self._last_seq[rank] = held.seq
        if rank == self.lead:  # printed at once, whatever is held
            held.lead_said = True
            out = self._bounded()
            out.append(Shown((rank,), stream, text))
            return out
        held.ranks.append(rank)
        held.joined_at = now
        self._bytes += _RANK_BYTES
        return self._bounded()

    def due(self, now: float) -> list[Shown]:
        """Held lines whose time has come, oldest first (a line waits for older ones)."""
        out: list[Shown] = []
        while self._held and self._ready(self._held[0], now):
            self._release(out)
        return out

    def flush(self) -> list[Shown]:
        """Everything held (the attempt ends, or a failure report follows)."""
        out: list[Shown] = []
        while self._held:
            self._release(out)
        return out

    def flush_rank(self, rank: int) -> list[Shown]:
        """Everything held up to ``rank``'s last held line (its lines before a note about it);
        nothing for the lead, whose lines are never held."""
        out: list[Shown] = []
        if rank == self.lead:
            return out
        last = self._last_seq.get(rank, -1)
        while self._held and self._held[0].seq <= last:
            self._release(out)
        return out

    # ---- inside ------------------------------------------------------------------------------

    def _ready(self, held: _Held, now: float) -> bool:
        # every other shown rank said it: nothing more can join (the lead prints anyway)
        everyone = len(held.ranks) >= self.shown - 1
        return (
            everyone or now - held.joined_at >= self.quiet or now - held.first_at >= self.max_hold
        )

    def _joinable(self, rank: int, key: tuple[str, str], now: float) -> _Held:
        """The oldest held line with this text that comes after the rank's own held lines
        (its k-th saying of a text joins the others' k-th), else a new held line."""
        same = self._by_text.get(key)
        if same is None:
            same = self._by_text[key] = deque()
        last = self._last_seq.get(rank, -1)
        i = len(same)
        while i > 0 and same[i - 1].seq > last:  # the few held after the rank's last line
            i -= 1
        if i < len(same):
            return same[i]
        held = _Held(self._seq, key[0], key[1], now)
        self._seq += 1
        self._held.append(held)
        same.append(held)
        self._bytes += held.size
        return held

    def _bounded(self) -> list[Shown]:
        out: list[Shown] = []
        while self._held and (len(self._held) > self.max_pending or self._bytes > self.max_bytes):
            self._release(out)
        return out

    def _release(self, out: list[Shown]) -> None:
        held = self._held.popleft()
        self._bytes -= held.size
        key = (held.stream, held.text)
        same = self._by_text[key]
        same.popleft()  # held lines print in order, so it is the oldest of its text
        if not same:
            del self._by_text[key]
        if held.ranks:  # the lead's own line printed already
            out.append(Shown(tuple(sorted(held.ranks)), held.stream, held.text))
