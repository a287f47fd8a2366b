"""Progress bars (lines redrawn with carriage returns) as a terminal would show them.

A tqdm bar writes ``\\r 10%|█ |`` then ``\\r 20%|██|`` ... and a newline only at the end. The
agent forwards such a line's pieces as they come (at most every 0.2 s); this module keeps, per
rank and stream, only the latest state: the last non-empty segment between carriage returns.
What the console prints for a finished line is that final state, never the megabytes of
intermediate ones; the rank log keeps every byte. Lines without a carriage return pass through.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ProgressTracker", "visible"]


def visible(text: str) -> str:
    """What a terminal shows of a line redrawn with carriage returns: its last drawn state."""
    if "\r" not in text:
        return text
    segments = [segment for segment in text.split("\r") if segment.strip()]
    return segments[-1] if segments else ""


class ProgressTracker:
    """Per (rank, stream): the latest state of a line still being redrawn."""

    def __init__(self) -> None:
        self.pending: dict[tuple[int, str], str] = {}

    def feed(
        self, rank: int, stream: str, lines: Sequence[str], partial: bool
    ) -> tuple[list[str], str | None, bool]:
        """(lines to print, the latest progress state or None, whether a progress line ended).

        ``partial``: the last line has no newline yet (the next frame continues it).
        """
        key = (rank, stream)
        shown: list[str] = []
        state: str | None = None
        ended = False
        for index, line in enumerate(lines):
            unfinished = partial and index == len(lines) - 1
            carry = self.pending.pop(key, None) if index == 0 else None
            if carry is None and "\r" not in line:
                shown.append(line)  # a plain line, or a piece of a long one (as before)
                continue
            current = visible((carry or "") + line) or (carry or "")
            if unfinished:
                self.pending[key] = current
                state = current
            else:
                shown.append(current)
                ended = True
        return shown, state, ended
