"""One rank log read as it grows, for `zlaunch logs --follow` (pure: bytes in, lines out).

The log keeps the worker's bytes, so a tqdm bar is one long line of carriage-return redraws,
and a line the script wrote on the same stream while the bar was up is glued to the bar's last
state. Read as it grows, the reads tell where the bar's text stopped: the bar ends at its last
state on its own line and the other line follows on its own, as the console shows them
(zlaunch/console/progress.py). A bar cleared for a line (tqdm.write) gives way to that line.
"""

from __future__ import annotations

from zlaunch.console import Redraw, visible
from zlaunch.wire import line_bytes, line_text

__all__ = ["FollowedLog"]


class FollowedLog:
    """Complete lines out of one growing log; a bar's latest state while it is redrawn."""

    def __init__(self) -> None:
        self._rest = b""
        """The unfinished line, while it redraws nothing."""
        self._bar: Redraw | None = None
        """The unfinished line being redrawn."""

    def feed(self, data: bytes) -> list[bytes]:
        """The lines that ``data`` completes, as they are to be printed."""
        lines = (self._rest + data).split(b"\n")
        rest = lines.pop()
        self._rest = b""
        out: list[str] = []
        for index, raw in enumerate(lines):
            text = line_text(raw)
            bar = self._bar if index == 0 else None
            if bar is None:
                out.append(visible(text))
                continue
            self._bar = None
            if bar.ended_by(text):
                out += [bar.state, visible(text)]
            else:
                out.append(bar.add(text))
        if b"\r" in rest:
            self._bar = self._bar or Redraw()
            self._bar.add(line_text(rest))
        else:
            self._rest = rest
        return [line_bytes(line) for line in out]

    def state(self) -> bytes | None:
        """The latest state of the bar being redrawn, or None."""
        return line_bytes(self._bar.state) if self._bar is not None and self._bar.state else None

    def finish(self) -> list[bytes]:
        """At the end of the run: what is left of the unfinished line, as it would be printed."""
        out = []
        if self._bar is not None:
            if self._rest and self._bar.ended_by(line_text(self._rest)):
                out.append(line_bytes(self._bar.state))
                out.append(self._rest)
            else:
                out.append(line_bytes(self._bar.add(line_text(self._rest))))
        elif self._rest:
            out.append(line_bytes(visible(line_text(self._rest))))
        self._bar, self._rest = None, b""
        return out
