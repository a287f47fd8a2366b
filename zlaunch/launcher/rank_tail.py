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

from zlaunch.console.progress import Redraw

__all__ = ["RankTail", "TRACEBACK_START"]

TRACEBACK_START = "Traceback (most recent call last):"
_HISTORY = 400  # lines held to choose from; a deep traceback fits


class _Line:
    __slots__ = ("text", "redraw")

    def __init__(self, text: str, redraw: Redraw | None = None):
        self.text = text
        self.redraw = redraw
        """Set while the line is being redrawn (a progress bar)."""


class RankTail:
    """One rank's recent output lines, progress bars collapsed to their latest state."""

    def __init__(self, shown: int = 20, history: int = _HISTORY):
        self.shown = shown
        self._lines: collections.deque[_Line] = collections.deque(maxlen=max(shown, history))
        self._open: dict[str, _Line] = {}
        """stream -> its line still being redrawn (no newline yet)."""

    def add(self, stream: str, lines: Sequence[str], partial: bool) -> None:
        """One OUT frame's lines; ``partial``: the last one continues in the next frame."""
        for index, text in enumerate(lines):
            unfinished = partial and index == len(lines) - 1
            line = self._open.pop(stream, None) if index == 0 else None
            if line is not None and line.redraw is not None and line.redraw.ended_by(text):
                line = None  # the bar stays at its last state; this is a line of its own
            if line is None and "\r" not in text:
                self._lines.append(_Line(text))  # a plain line (or a piece of a long one)
                continue
            if line is None:
                line = _Line("", Redraw())
                self._lines.append(line)
            line.text = line.redraw.add(text)
            if unfinished:
                self._open[stream] = line

    def lines(self) -> tuple[str, ...]:
        """At most ``shown`` lines: the last ones, the last traceback first (see the module)."""
        texts = [line.text for line in self._lines]
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
