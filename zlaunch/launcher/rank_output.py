"""Where a rank's output goes: its log (every byte), its tail (for the failure report), the
console (rank-tagged, without known noise and `zlaunch stacks` dumps, progress bars at their
latest state, identical lines of many ranks collapsed) and the live view. One per attempt; the
controller's thread only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from zlaunch.console import (
    Console,
    JobView,
    LineCollapser,
    NoiseFilter,
    ProgressTracker,
    Shown,
    StackDumpFilter,
    collapse_wanted,
)
from zlaunch.launcher.hang import StackCapture
from zlaunch.launcher.rank_tail import RankTail, tail_chars
from zlaunch.wire import frames, protocol

__all__ = ["LogSink", "RankOutput", "TAIL_LINES"]


class LogSink(Protocol):
    """Where a rank's bytes are kept (the recorder's rank log)."""

    def write(self, data: bytes) -> Any: ...

    def close(self) -> Any: ...


TAIL_LINES = 20
DUE_EVERY = 0.02
"""Seconds between two looks at the collapser's held lines (a look costs little, but the loop
turns once per frame)."""


class RankOutput:
    def __init__(self, console: Console, view: JobView, collapse: bool | None = None):
        self.console = console
        self.collapse = collapse
        """--collapse / --no-collapse; None: by the number of ranks shown (console/collapse)."""
        self.collapser: LineCollapser | None = None
        self._collapse_decided = False
        self._due_at = 0.0
        self._failure_seen = False
        self.view = view
        self.noise = NoiseFilter()  # known-harmless lines: off the console, in the rank logs
        self.stack_dumps = StackDumpFilter()  # `zlaunch stacks` dumps: off the console too
        self.progress = ProgressTracker()  # \r-redrawn lines (tqdm): their latest state
        self.logs: dict[int, LogSink] = {}
        self.hosts: dict[int, str] = {}
        self.tails: dict[int, RankTail] = {}
        self.bars: dict[int, str] = {}
        """rank -> the latest state of its progress bar (ranks.json)."""
        self.output_at: dict[int, float] = {}
        """rank -> wall time of its last output line or progress state (ranks.json)."""
        self.capture: StackCapture | None = None
        """A hang was declared: the ranks' stack dumps are collected from their output."""

    def add_rank(self, rank: int, host: str, log: LogSink, world: int = 1) -> None:
        """``world``: how many ranks share the tails' memory (rank_tail.tail_chars)."""
        self.logs[rank] = log
        self.hosts[rank] = host
        self.tails[rank] = RankTail(TAIL_LINES, max_chars=tail_chars(world))

    def tail(self, rank: int) -> tuple[str, ...]:
        tail = self.tails.get(rank)
        return tail.lines() if tail is not None else ()

    def lines(self, rank: int, stream: str, lines: Sequence[str], partial: bool) -> None:
        """One OUT frame: ``partial``, the last line continues in the next frame."""
        log = self.logs.get(rank)
        if log is None:
            return
        data = frames.line_bytes("\n".join(lines))  # one encode for the frame, not per line
        log.write(data if partial else data + b"\n")  # the log keeps the worker's bytes
        self.tails[rank].add(stream, lines, partial)
        shown, bar, ended = self.progress.feed(rank, stream, lines, partial)
        self._seen(rank, stream, bar, ended)
        shown, first_hidden = self.noise.keep(shown)
        for kind in first_hidden:
            self.console.note(kind.note)
        if stream == protocol.STDERR:
            shown = self.stack_dumps.keep(rank, shown, time.monotonic())
        if shown:
            self._show(rank, stream, shown)
        if self.capture is not None:
            self.capture.lines(rank, list(lines), time.monotonic())

    # ---- the console: one line per rank line, or identical lines of many ranks once ----------

    def _show(self, rank: int, stream: str, shown: Sequence[str]) -> None:
        collapser = self._collapser()
        if collapser is None or not self.console.shows(rank):
            self.console.lines(self.hosts[rank], rank, stream, shown)
            return
        now = time.monotonic()
        out: list[Shown] = []
        for text in shown:
            out += collapser.add(now, rank, stream, text)
        self._print(out)  # the lead's lines; held ones come with tick()

    def _collapser(self) -> LineCollapser | None:
        """Decided at the first line shown, when every rank of the attempt is known."""
        if not self._collapse_decided:
            self._collapse_decided = True
            shown = sorted(r for r in self.logs if self.console.shows(r))
            if shown and collapse_wanted(self.collapse, len(shown)):
                self.collapser = LineCollapser(lead=shown[0], shown=len(shown))
        return self.collapser

    def tick(self, now: float) -> None:
        """Held lines whose time has come (the controller's loop: after every frame, and at
        least every POLL seconds); looked at every DUE_EVERY seconds at most."""
        if self.collapser is None or now < self._due_at:
            return
        self._due_at = now + DUE_EVERY
        if self.collapser.pending:
            self._print(self.collapser.due(now))

    def rank_failed(self, rank: int) -> None:
        """Before zlaunch's note about the first failed rank: its held lines (and the older
        ones). Only the first: later exits are the stop's doing (no note follows them), and
        flushing at each would split a traceback every rank prints into pieces."""
        if self.collapser is None or self._failure_seen:
            return
        self._failure_seen = True
        self._print(self.collapser.flush_rank(rank))

    def flush(self) -> None:
        """Every held line (the attempt ends; the failure report follows)."""
        if self.collapser is not None:
            self._print(self.collapser.flush())

    def _print(self, out: list[Shown]) -> None:
        if out:
            self.console.collapsed(out, self.hosts)

    def _seen(self, rank: int, stream: str, bar: str | None, ended: bool) -> None:
        self.output_at[rank] = time.time()
        self.view.output_seen(rank)
        if bar is not None:
            self.bars[rank] = bar
            self.view.progress(rank, self.hosts[rank], stream, bar)
        elif ended:
            self.view.progress(rank, self.hosts[rank], stream, None)

    def close(self) -> None:
        self.flush()
        for log in self.logs.values():
            log.close()
