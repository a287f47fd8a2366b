"""The job as it runs: rank logs scrolling above a pinned panel of progress, metrics and health.

``open_view(console)`` picks the view for the terminal:

- ``LiveView`` when stdout is a terminal: a rich ``Live`` panel (progress bar with step/total
  and ETA when the total is known, the latest step metrics, throughput, the script's own
  metrics, and ranks alive/expected per host; drawn by `live_panel`). Every rank line and controller note is printed
  *through the same rich console* above the panel, by the one thread that owns the console, so
  the panel is erased and redrawn around each batch and nothing is ever garbled. The view takes
  over the plain console's output streams, so ``Console`` keeps its formatting (prefixes,
  colors) and this module only decides where the bytes go.
- ``PlainView`` otherwise (pipes, files, ``TERM=dumb``, ``ZLAUNCH_LIVE=0``): no panel, no
  cursor movement; each metrics event becomes one plain ``zlaunch: step ...`` line on stderr
  (escape-free when stderr is not a terminal, like every note), the line ranks log too
  (`zlaunch.wire.metrics_format`).

The launcher calls ``start(run_id, expected)`` once the plan is known, ``rank_started`` /
``rank_exited`` / ``metrics`` as frames arrive, ``tick()`` from its loop, and ``close()``
before printing the outcome.
"""

from __future__ import annotations

import io
import os
import sys
import time
from typing import IO, Any

from zlaunch.console.job_view import JobView
from zlaunch.console.live_panel import MAX_BARS_SHOWN, progress_lines, render_panel
from zlaunch.console.terminal import Console, is_terminal
from zlaunch.rundir import RunStatus
from zlaunch.text import rank_ranges
from zlaunch.wire import format_line

__all__ = ["JobView", "PlainView", "LiveView", "open_view", "format_metrics", "live_wanted"]

LIVE_ENV = "ZLAUNCH_LIVE"
# Lines are printed at most this often (the panel is redrawn with each print); the rest wait
# for the next tick, so a flood of output does not turn into a flood of panel redraws.
PRINT_INTERVAL = 0.05
LINES_PER_PRINT = 500
"""Rank lines one print takes (10,000 a second at most, a quarter of a core in rich: 25 us a
line). Beyond that the terminal cannot keep up: the lines are dropped from it, counted, and
said in a note in their place; the rank logs keep them, and zlaunch's notes always print."""
PANEL_INTERVAL = 0.5
PLAIN_PROGRESS_INTERVAL = 5.0


def format_metrics(event: dict[str, Any]) -> str:
    """One metrics event as one plain line (the ranks' line, fields two spaces apart)."""
    return format_line(event, sep="  ")


class PlainView(JobView):
    """No panel: one ``zlaunch: step ...`` line per metrics event, through the console notes."""

    def __init__(self, console: Console):
        super().__init__(console)
        self.bar_printed: dict[int, float] = {}
        """rank -> when its bar was last printed; at most MAX_BARS_SHOWN ranks ever print."""
        self.bars_capped = False

    def metrics(self, rank: int, host: str | None, event: dict[str, Any]) -> None:
        super().metrics(rank, host, event)
        # Every step arrives; the printed record keeps the runtime's report steps (the first,
        # every steps_per_print-th, skipped, the last): a readable log, not one line per step.
        if event.get("report", True) is not False:
            self.console.note(format_metrics(event))

    def starting(self, line: str) -> None:
        super().starting(line)
        if line:  # a line per call: the caller says it at a plain console's pace
            self.console.note(line)

    def progress(self, rank: int, host: str, stream: str, text: str | None) -> None:
        super().progress(rank, host, stream, text)
        # A readable record: a rank's bar at most every PLAIN_PROGRESS_INTERVAL seconds (its
        # final state prints as a line when it ends); the rank log keeps every byte.
        # Like the panel, the bars of the first MAX_BARS_SHOWN ranks only: a thousand ranks
        # each drawing one would be a thousand lines every few seconds.
        if text is None or not self.console.shows(rank):
            return
        if rank not in self.bar_printed and len(self.bar_printed) >= MAX_BARS_SHOWN:
            if not self.bars_capped:
                self.bars_capped = True
                self.console.note(
                    f"more than {MAX_BARS_SHOWN} ranks draw a progress bar: the console shows "
                    f"those of ranks {rank_ranges(self.bar_printed)} (each rank's log has its "
                    "own; `zlaunch status` shows every rank's latest)"
                )
            return
        now = time.monotonic()
        if now - self.bar_printed.get(rank, -PLAIN_PROGRESS_INTERVAL) >= PLAIN_PROGRESS_INTERVAL:
            self.bar_printed[rank] = now
            self.console.lines(host, rank, stream, [text])


class _BytesOut(io.RawIOBase):
    """Stands in for the console's stdout: bytes go to the live view."""

    def __init__(self, view: LiveView):
        self.view = view

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:
        self.view.queue(bytes(data).decode("utf-8", "replace"), droppable=True)
        return len(data)

    def flush(self) -> None:
        self.view.flush_lines()

    def isatty(self) -> bool:
        return True


class _TextOut(io.TextIOBase):
    """Stands in for the console's stderr: notes go to the live view, at once."""

    def __init__(self, view: LiveView):
        self.view = view

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.view.queue(text)
        return len(text)

    def flush(self) -> None:
        self.view.flush_lines(force=True)

    def isatty(self) -> bool:
        return True


class LiveView(JobView):
    """The rich live panel pinned under the scrolling rank logs (a terminal only)."""

    def __init__(self, console: Console, stream: IO[str] | None = None):
        super().__init__(console)
        from rich.console import Console as RichConsole
        from rich.live import Live

        self.rich = RichConsole(file=stream or sys.stdout, highlight=False, soft_wrap=True)
        self.pending: list[str] = []
        self.pending_lines = 0
        """Rank lines in ``pending``."""
        self.dropped = 0
        """Rank lines dropped since the start (LINES_PER_PRINT)."""
        self.unsaid = 0
        """Of those, the ones no note has counted yet."""
        self.last_print = 0.0
        self.last_panel = 0.0
        self.saved = (console.out, console.err)
        console.out = _BytesOut(self)
        if is_terminal(console.err):  # notes to a redirected stderr stay there, off the terminal
            console.err = _TextOut(self)
        self.live = Live(
            self._panel(),
            console=self.rich,
            auto_refresh=False,  # only the console's thread draws: no interleaving
            redirect_stdout=False,
            redirect_stderr=False,
            transient=False,
        )
        self._echo = _quiet_terminal_input()
        self.live.start()
        self.closed = False

    # ---- output -----------------------------------------------------------------------------

    def queue(self, text: str, *, droppable: bool = False) -> None:
        if droppable:
            lines = text.count("\n")
            if self.pending_lines + lines > LINES_PER_PRINT:
                self.dropped += lines
                self.unsaid += lines
                return
            self.pending_lines += lines
        self.pending.append(text)

    def flush_lines(self, force: bool = False) -> None:
        now = time.monotonic()
        if (self.pending or self.unsaid) and (force or now - self.last_print >= PRINT_INTERVAL):
            self._print_pending()

    def _print_pending(self) -> None:
        from rich.text import Text

        if self.unsaid:
            self.pending.append(
                f"zlaunch: the console fell behind: {self.unsaid} line(s) not shown here "
                "(every line is in the rank logs: zlaunch logs)\n"
            )
            self.unsaid = 0
        text = "".join(self.pending)
        self.pending.clear()
        self.pending_lines = 0
        if text.endswith("\n"):
            text = text[:-1]
        self.rich.print(Text.from_ansi(text), soft_wrap=True)
        self.last_print = time.monotonic()

    # ---- state -------------------------------------------------------------------------------

    def start(self, run_id: str, expected: dict[str, int]) -> None:
        super().start(run_id, expected)
        self._redraw()

    def rank_exited(self, rank: int, host: str, code: int) -> None:
        super().rank_exited(rank, host, code)
        self._redraw_soon()

    def rank_lost(self, rank: int, host: str) -> None:
        super().rank_lost(rank, host)
        self._redraw_soon()

    def starting(self, line: str) -> None:
        super().starting(line)
        self._redraw()

    def _redraw_soon(self) -> None:
        """Draw now unless the panel was drawn in the last PRINT_INTERVAL; then the next tick
        draws it (within PANEL_INTERVAL). A thousand ranks ending together must not draw the
        panel a thousand times while the controller is stopping the job."""
        if time.monotonic() - self.last_panel >= PRINT_INTERVAL:
            self._redraw()

    def metrics(self, rank: int, host: str | None, event: dict[str, Any]) -> None:
        super().metrics(rank, host, event)
        # Steps may come hundreds a second: redraw on report steps, else at the panel's pace.
        due = time.monotonic() - self.last_panel >= PANEL_INTERVAL
        if event.get("report", True) is not False or due:
            self._redraw()

    def set_status(self, status: RunStatus) -> None:
        super().set_status(status)
        self._redraw()

    def progress(self, rank: int, host: str, stream: str, text: str | None) -> None:
        super().progress(rank, host, stream, text)
        if text is None or time.monotonic() - self.last_panel >= PRINT_INTERVAL * 4:
            self._redraw()

    def tick(self) -> None:
        if self.closed:
            return
        if self.pending or self.unsaid:
            self.flush_lines()
        if time.monotonic() - self.last_panel >= PANEL_INTERVAL:
            self._redraw()

    def _redraw(self) -> None:
        if self.closed:
            return
        if self.pending or self.unsaid:
            self._print_pending()
        self.live.update(self._panel(), refresh=True)
        self.last_panel = time.monotonic()

    def close(self) -> None:
        if self.closed:
            return
        if self.pending or self.unsaid:
            self._print_pending()
        self.live.update(self._panel(), refresh=True)
        self.live.stop()
        self.closed = True
        _restore_terminal_input(self._echo)
        self.console.out, self.console.err = self.saved
        self.console.dropped_elsewhere += self.dropped  # said in the job's last words

    # ---- the panel ---------------------------------------------------------------------------

    def _panel(self) -> Any:
        from rich.console import Group

        panel = render_panel(self)
        if not self.bars or self.closed:
            return panel
        # Ranks redrawing a progress line (tqdm) show it just above the panel.
        return Group(*progress_lines(self.bars), panel)


def _quiet_terminal_input() -> Any:
    """Stop the terminal echoing typed keys (Ctrl-C's "^C") while the panel is drawn.

    An echoed "^C" moves the cursor under the panel, so the next redraw erases one line too
    few and leaves a stray top border behind. zlaunch reads nothing from the terminal, so
    nothing typed needs echoing. Returns the settings to restore (None: nothing changed).
    """
    try:
        import termios

        fd = sys.stdin.fileno()
        if not os.isatty(fd):
            return None
        saved = termios.tcgetattr(fd)
        quiet = list(saved)
        quiet[3] &= ~(termios.ECHO | termios.ECHOCTL)
        termios.tcsetattr(fd, termios.TCSANOW, quiet)
        return fd, saved
    except (ImportError, AttributeError, ValueError, OSError):
        return None


def _restore_terminal_input(saved: Any) -> None:
    if saved is None:
        return
    import termios

    fd, attrs = saved
    try:
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
    except (termios.error, OSError):
        pass


def live_wanted(console: Console) -> bool:
    """The panel only on a real terminal that can move the cursor, unless ZLAUNCH_LIVE=0."""
    if os.environ.get(LIVE_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    if os.environ.get("TERM", "") == "dumb":
        return False
    try:
        return sys.stdout.isatty() and console.out in (sys.stdout.buffer, sys.stdout)
    except (AttributeError, ValueError):
        return False


def open_view(console: Console) -> JobView:
    return LiveView(console) if live_wanted(console) else PlainView(console)
