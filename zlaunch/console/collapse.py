"""Identical lines from many ranks shown once: ``[ranks 0-1023] UserWarning: ...``.

A thousand ranks importing the same library print the same warning a thousand times; the
console should show it once, with the ranks that said it. `LineCollapser` is that decision,
pure: lines come in as (time, rank, stream, text), console lines (`Shown`) come out. The rank
logs are written before this and keep every line; only the console collapses.

The rules, which docs/watching.md states for users:

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
  has said it, or ``max_hold`` seconds after it was first seen, whichever comes first (and
  after the held lines before it, none of which is held longer). A line only one rank said
  prints as it does today (``[host:rank] ...``).
- **A rank's lines stay in order.** Held lines print in one order; a rank joins a held line
  only where that keeps its own lines in order: after all of its held lines, or before some
  of them when those are lines of its own alone, which then move just before the line it
  joins (its "rank 3 at step 5" and then the "epoch done" every rank says). Otherwise its line
  starts a new one, printed after them. A rank's k-th saying of a text joins the others' k-th.
- **Bounded.** At most ``max_pending`` held lines and ``max_bytes`` of held text (and rank
  lists); beyond that the oldest prints at once. Time is the caller's clock (the
  controller's), so the rules are testable with an injected one.
"""

from __future__ import annotations

import bisect
import math
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
SCAN = 32
"""Held lines of one text looked at for a rank's line to join (a rank that repeats a line
fast holds many of that text); beyond them its line is held on its own."""


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
    """A line waiting for more ranks to say it (a plain class: one is made per line held).
    Held lines form a doubly linked list in the order they print; ``label`` grows along it
    (floats, so a line can be put between two others; renumbered when a gap runs out)."""

    __slots__ = (
        "label",
        "stream",
        "text",
        "first_at",
        "joined_at",
        "ranks",
        "lead_said",
        "prev",
        "next",
        "pending",
    )

    def __init__(self, stream: str, text: str, now: float):
        self.label = 0.0
        self.stream = stream
        self.text = text
        self.first_at = now
        self.joined_at = now
        self.ranks: list[int] = []
        """Ranks that said it, the lead excepted (each at most once)."""
        self.lead_said = False
        """The lead rank said it too: already printed, so not named again."""
        self.prev: _Held | None = None
        self.next: _Held | None = None
        self.pending = True
        """Still held (False once printed)."""

    @property
    def size(self) -> int:
        return len(self.text) + _RANK_BYTES * len(self.ranks)


class LineCollapser:
    """Rank lines in, console lines out. ``lead``: the rank printed at once; ``shown``: how
    many ranks the console shows (a line every other one said prints without waiting)."""

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
        self._head: _Held | None = None
        """The held line that prints first; ``_tail`` the last."""
        self._tail: _Held | None = None
        self._count = 0
        self._bytes = 0
        self._by_text: dict[tuple[str, str], list[_Held]] = {}
        """(stream, text) -> the held lines with that text."""
        self._chains: dict[int, deque[_Held]] = {}
        """rank -> its held lines, in its order (the lead's are never held)."""
        self._barriers: dict[int, _Held] = {}
        """rank -> the last of its held lines that other ranks said too: it can join only
        lines that print after it (its held lines after it are its own alone, and movable)."""

    @property
    def pending(self) -> int:
        """Lines held now."""
        return self._count

    def add(self, now: float, rank: int, stream: str, text: str) -> list[Shown]:
        """One complete line of ``rank``; returns what prints now: the lead's own line, and
        older held lines pushed out by the bounds (before it)."""
        key = (stream, text)
        if rank == self.lead:  # printed at once, whatever is held
            same = self._by_text.get(key, ())
            held = next((h for h in same[:SCAN] if not h.lead_said), None)
            if held is None:
                held = self._append(key, now)
            held.lead_said = True
            out = self._bounded()
            out.append(Shown((rank,), stream, text))
            return out
        chain = self._chains.get(rank)
        if chain is None:
            chain = self._chains[rank] = deque()
        held = self._joinable(rank, chain, key)
        if held is None:
            held = self._append(key, now)
        if held.ranks:  # said by others too: a barrier for this rank, and for a lone sayer
            if len(held.ranks) == 1:
                self._raise_barrier(held.ranks[0], held)
            self._barriers[rank] = held
        held.ranks.append(rank)
        held.joined_at = now
        self._bytes += _RANK_BYTES
        chain.append(held)
        return self._bounded()

    def due(self, now: float) -> list[Shown]:
        """Held lines whose time has come, in print order (a line waits for those before it,
        which are due no later than it is, but for the quiet period)."""
        out: list[Shown] = []
        while self._head is not None and self._ready(self._head, now):
            self._release(out)
        return out

    def flush(self) -> list[Shown]:
        """Everything held (the attempt ends, or a failure report follows)."""
        out: list[Shown] = []
        while self._head is not None:
            self._release(out)
        return out

    def flush_rank(self, rank: int) -> list[Shown]:
        """Everything held up to ``rank``'s last held line (its lines before a note about it);
        nothing for the lead, whose lines are never held."""
        out: list[Shown] = []
        chain = self._chains.get(rank)
        while chain:
            self._release(out)
        return out

    # ---- inside ------------------------------------------------------------------------------

    def _ready(self, held: _Held, now: float) -> bool:
        # every other shown rank said it: nothing more can join (the lead prints anyway)
        everyone = len(held.ranks) >= self.shown - 1
        return (
            everyone or now - held.joined_at >= self.quiet or now - held.first_at >= self.max_hold
        )

    def _joinable(self, rank: int, chain: deque[_Held], key: tuple[str, str]) -> _Held | None:
        """The first held line with this text that the rank can join, else None.

        It can join a line that prints after all of its own held lines. It can also join one
        that prints before some of them when those are lines of its own alone (a rank's "rank
        3 at step 5" before the "epoch done" every rank says): they are moved just before the
        line it joins, which keeps its order, and nobody else's. A held line it already said
        it cannot join (its second "epoch done" joins the others' second). At most SCAN lines
        of the text are looked at: a rank repeating one line a thousand times costs no more
        per line than one saying it once."""
        same = self._by_text.get(key)
        if not same:
            return None
        barrier = self._barriers.get(rank)
        floor = barrier.label if barrier is not None and barrier.pending else -math.inf
        # lines of the text that print after the barrier; the first not its own alone
        start = bisect.bisect_right(same, floor, key=_label)
        best = None
        for held in same[start : start + SCAN]:
            if not (len(held.ranks) == 1 and held.ranks[0] == rank):
                best = held
                break
        if best is None:
            return None
        moved: list[_Held] = []  # its own lines alone held after ``best``: they go before it
        for mine in reversed(chain):
            if mine.label < best.label:
                break
            moved.append(mine)
        if moved:
            moved.reverse()
            self._move_before(best, moved)
        return best

    def _raise_barrier(self, rank: int, held: _Held) -> None:
        """Another rank joined a line ``rank`` said alone: it is that rank's barrier now, if
        later than its own."""
        barrier = self._barriers.get(rank)
        if barrier is None or not barrier.pending or barrier.label < held.label:
            self._barriers[rank] = held

    def _append(self, key: tuple[str, str], now: float) -> _Held:
        held = _Held(key[0], key[1], now)
        tail = self._tail
        held.label = tail.label + 1.0 if tail is not None else 0.0
        held.prev = tail
        if tail is not None:
            tail.next = held
        else:
            self._head = held
        self._tail = held
        self._count += 1
        self._bytes += held.size
        same = self._by_text.get(key)
        if same is None:
            self._by_text[key] = [held]
        else:
            same.append(held)
        return held

    def _move_before(self, target: _Held, moved: list[_Held]) -> None:
        """Put ``moved`` (in their order) just before ``target``; they print no later than
        it must (their max_hold counts from its first sighting if that is earlier)."""
        for held in moved:
            self._unlink(held)
        lo = target.prev.label if target.prev is not None else target.label - 1.0
        step = (target.label - lo) / (len(moved) + 1)
        if step <= abs(target.label) * 1e-9 + 1e-12:  # the gap ran out: renumber every line
            self._renumber()
            lo = target.prev.label if target.prev is not None else target.label - 1.0
            step = (target.label - lo) / (len(moved) + 1)
        for i, held in enumerate(moved, 1):
            held.label = lo + i * step
            held.prev, held.next = target.prev, target
            if target.prev is not None:
                target.prev.next = held
            else:
                self._head = held
            target.prev = held
            held.first_at = min(held.first_at, target.first_at)
        for key in {(held.stream, held.text) for held in moved}:
            self._by_text[key].sort(key=_label)  # kept in print order, for the bisection

    def _unlink(self, held: _Held) -> None:
        if held.prev is not None:
            held.prev.next = held.next
        else:
            self._head = held.next
        if held.next is not None:
            held.next.prev = held.prev
        else:
            self._tail = held.prev
        held.prev = held.next = None

    def _renumber(self) -> None:
        held, label = self._head, 0.0
        while held is not None:
            held.label = label
            label += 1.0
            held = held.next

    def _bounded(self) -> list[Shown]:
        out: list[Shown] = []
        while self._head is not None and (
            self._count > self.max_pending or self._bytes > self.max_bytes
        ):
            self._release(out)
        return out

    def _release(self, out: list[Shown]) -> None:
        held = self._head
        assert held is not None
        self._unlink(held)
        held.pending = False
        self._count -= 1
        self._bytes -= held.size
        key = (held.stream, held.text)
        same = self._by_text[key]
        same.remove(held)
        if not same:
            del self._by_text[key]
        for rank in held.ranks:  # the first line to print holds each rank's first held line
            chain = self._chains[rank]
            chain.popleft()
            if not chain:
                del self._chains[rank]
                self._barriers.pop(rank, None)
        if held.ranks:  # the lead's own line printed already
            out.append(Shown(tuple(sorted(held.ranks)), held.stream, held.text))


def _label(held: _Held) -> float:
    return held.label
