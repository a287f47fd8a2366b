"""The last lines of a rank, as its failure report shows them (pure, no I/O).

A Trainer rank's output is mostly a tqdm bar redrawn with carriage returns; the agent forwards
its state every 0.2 s as a piece of an unfinished line. Kept piece by piece, the "last 20
lines" of a failed rank were 16 redraws of one bar and no traceback. Here each bar is one
line, updated in place to its latest state (as a terminal shows it), plain lines are kept as
they are, and when more lines are held than are shown, the last traceback comes first: it is
kept whole (its first line and as many of its last lines as fit), and the lines just before it
fill what room is left.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from zlaunch.console import Redraw

__all__ = ["RankTail", "TRACEBACK_START", "tail_chars"]

TRACEBACK_START = "Traceback (most recent call last):"
_HISTORY = 400  # lines held to choose from; a deep traceback fits
LINE_CHARS = 2000
"""A longer line is held (and shown in the failure report) cut to this, marked; the rank log
has it whole."""
TAILS_CHARS = 128 * 1024 * 1024
"""The text all ranks' tails hold together, at most (plus about 64 bytes a line): the
controller's memory stays bounded at 16,384 ranks whatever they print."""
MIN_TAIL_CHARS, MAX_TAIL_CHARS = 8 * 1024, 64 * 1024
_LINE_COST = 64  # what a held line costs beside its text (the str object, the deque slot)


def tail_chars(ranks: int) -> int:
    """The text one rank's tail holds when ``ranks`` ranks share TAILS_CHARS (8-64 KiB: 16,384
    ranks keep about 80 lines of 100 characters each, enough for a traceback)."""
    return max(MIN_TAIL_CHARS, min(MAX_TAIL_CHARS, TAILS_CHARS // max(1, ranks)))


def _clip(text: str) -> str:
    if len(text) <= LINE_CHARS:
        return text
    return f"{text[:LINE_CHARS]}... ({len(text) - LINE_CHARS} more characters in the rank log)"


class _Line:
    __slots__ = ("text", "redraw")

    def __init__(self, text: str, redraw: Redraw | None = None):
        self.text = text
        self.redraw = redraw
        """Set while the line is being redrawn (a progress bar)."""


class RankTail:
    """One rank's recent output lines, progress bars collapsed to their latest state; at most
    ``history`` lines and ``max_chars`` characters of them."""

    def __init__(self, shown: int = 20, history: int = _HISTORY, max_chars: int = MAX_TAIL_CHARS):
        self.shown = shown
        self.history = max(shown, history)
        self.max_chars = max_chars
        self._lines: collections.deque[str | _Line] = collections.deque()
        """Plain lines as str (most of them: no object each), lines being redrawn as _Line."""
        self._chars = 0
        self._open: dict[str, _Line] = {}
        """stream -> its line still being redrawn (no newline yet)."""

    def add(self, stream: str, lines: Sequence[str], partial: bool) -> None:
        """One OUT frame's lines; ``partial``: the last one continues in the next frame."""
        if not self._open and "\r" not in "".join(lines):
            plain = (
                [_clip(text) for text in lines]
                if max(map(len, lines), default=0) > LINE_CHARS
                else lines
            )
            self._lines.extend(plain)  # the common frame: plain lines only
            self._chars += sum(map(len, plain)) + _LINE_COST * len(plain)
            self._trim()
            return
        for index, text in enumerate(lines):
            unfinished = partial and index == len(lines) - 1
            line = self._open.pop(stream, None) if index == 0 else None
            if line is not None and line.redraw is not None and line.redraw.ended_by(text):
                line = None  # the bar stays at its last state; this is a line of its own
            if line is None and "\r" not in text:
                self._append(_clip(text))  # a plain line (or a piece of a long one)
                continue
            if line is None:
                line = _Line("", Redraw())
                self._append(line)
            line.text = _clip(line.redraw.add(text))
            if unfinished:
                self._open[stream] = line

    def _append(self, line: str | _Line) -> None:
        self._lines.append(line)
        self._chars += (len(line) if isinstance(line, str) else LINE_CHARS) + _LINE_COST
        self._trim()

    def _trim(self) -> None:
        lines = self._lines
        while len(lines) > self.history or (self._chars > self.max_chars and len(lines) > 1):
            line = lines.popleft()
            self._chars -= (len(line) if isinstance(line, str) else LINE_CHARS) + _LINE_COST

    def lines(self) -> tuple[str, ...]:
        """At most ``shown`` lines: the last ones, the last traceback first (see the module)."""
        texts = [line if isinstance(line, str) else line.text for line in self._lines]
        if len(texts) <= self.shown:
            return tuple(texts)
        start = _last_traceback(texts)
        if start is None:
            return tuple(texts[-self.shown :])
        block = texts[start:]
        if len(block) >= self.shown:
            return (block[0], *block[len(block) - self.shown + 1 :])
        room = self.shown - len(block)
        return tuple(texts[start - room : start] + block)


def _last_traceback(texts: list[str]) -> int | None:
    for index in range(len(texts) - 1, -1, -1):
        if texts[index].startswith(TRACEBACK_START):
            return index
    return None
