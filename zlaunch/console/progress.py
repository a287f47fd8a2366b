"""Progress bars (lines redrawn with carriage returns) as a terminal would show them.

A tqdm bar writes ``\\r 10%|█ |`` then ``\\r 20%|██|`` ... and a newline only at the end. The
agent forwards such a line's pieces as they come (at most every 0.2 s); this module keeps, per
rank and stream, only the latest state: the last non-empty segment between carriage returns.
What the console prints for a finished line is that final state, never the megabytes of
intermediate ones; the rank log keeps every byte. Lines without a carriage return pass through.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ProgressTracker", "Redraw", "visible"]


def visible(text: str) -> str:
    """What a terminal shows of a line redrawn with carriage returns: its last drawn state."""
    if "\r" not in text:
        return text
    segments = [segment for segment in text.split("\r") if segment.strip()]
    return segments[-1] if segments else ""


class Redraw:
    """A line being redrawn: what it shows now, and its raw text since its last carriage
    return (tqdm clears a bar with ``\r``, blanks and ``\r`` before it writes a line there)."""

    __slots__ = ("state", "raw")

    def __init__(self) -> None:
        self.state = ""
        self.raw = ""

    def add(self, text: str) -> str:
        """The next piece of the line; its state now."""
        raw = self.raw + text
        self.state = visible(raw) or self.state
        self.raw = raw[raw.rfind("\r") :] if "\r" in raw else raw
        return self.state

    def ended_by(self, text: str) -> bool:
        """``text`` is a line of its own, not more of this one: it redraws nothing (no
        ``\r``), it is not the newline that ends the bar, and the bar was not cleared for
        it. Something else wrote on the stream while the bar was up; a terminal would glue
        the two, a log reader wants the bar's last state and the line apart."""
        return "\r" not in text and text != "" and bool(self.raw.replace("\r", "").strip())


class ProgressTracker:
    """Per (rank, stream): the latest state of a line still being redrawn."""

    def __init__(self) -> None:
        self.pending: dict[tuple[int, str], Redraw] = {}

    def feed(
        self, rank: int, stream: str, lines: Sequence[str], partial: bool
    ) -> tuple[list[str], str | None, bool]:
        """(lines to print, the latest progress state or None, whether a progress line ended).

        ``partial``: the last line has no newline yet (the next frame continues it). A bar
        that other output interrupts ends at its last state, on its own line.
        """
        key = (rank, stream)
        if key not in self.pending and "\r" not in "".join(lines):
            return list(lines), None, False  # no bar drawn, none to go on with: plain lines
        shown: list[str] = []
        state: str | None = None
        ended = False
        for index, line in enumerate(lines):
            unfinished = partial and index == len(lines) - 1
            carry = self.pending.pop(key, None) if index == 0 else None
            if carry is not None and carry.ended_by(line):
                shown.append(carry.state)
                ended = True
                carry = None
            if carry is None and "\r" not in line:
                shown.append(line)  # a plain line, or a piece of a long one (as before)
                continue
            redraw = carry or Redraw()
            current = redraw.add(line)
            if unfinished:
                self.pending[key] = redraw
                state = current
            else:
                shown.append(current)
                ended = True
        return shown, state, ended
