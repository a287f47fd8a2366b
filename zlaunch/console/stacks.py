"""Stack dumps asked for by `zlaunch stacks`, kept off the job's console.

A dump is faulthandler's text on the rank's stderr (after a line saying who dumped); shown on the console it reads like a crash
(red `!` lines full of `File ...`). `zlaunch stacks` prints the dumps grouped in the terminal
that asked, and the rank logs keep them, so the job's console shows one line instead (the
controller's note of the request, which says that nothing crashed). Only stack-shaped lines of ranks that were asked, within
a short window after the request, are held back: anything else the rank prints still shows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from zlaunch.text import DUMP_MARKER, STACK_FRAME, STACK_HEADER

__all__ = ["STACK_HEADER", "STACK_FRAME", "StackDumpFilter", "EXPECT_SECONDS"]

# faulthandler's other lines inside a thread: a thread collecting garbage, a cut-off stack.
_STACK_OTHER = re.compile(r"^  (Garbage-collecting|\.\.\.)$")
EXPECT_SECONDS = 10.0
"""How long after a request a rank's stack-shaped stderr lines are taken as its dump."""


class StackDumpFilter:
    """Holds back the dump lines of ranks asked for their stacks."""

    def __init__(self) -> None:
        self._until: dict[int, float] = {}
        self._in_dump: set[int] = set()

    def expect(self, ranks: Iterable[int], now: float) -> None:
        """These ranks were just asked to dump their stacks."""
        for rank in ranks:
            self._until[rank] = now + EXPECT_SECONDS

    def keep(self, rank: int, lines: Sequence[str], now: float) -> list[str]:
        """The lines of this rank's stderr to show."""
        if self._until.get(rank, 0.0) < now:
            self._in_dump.discard(rank)
            return list(lines)
        shown: list[str] = []
        for line in lines:
            if STACK_HEADER.match(line) or DUMP_MARKER.match(line):
                self._in_dump.add(rank)
                continue
            in_dump = rank in self._in_dump
            if in_dump and (STACK_FRAME.match(line) or _STACK_OTHER.match(line) or line == ""):
                continue
            self._in_dump.discard(rank)
            shown.append(line)
        return shown
