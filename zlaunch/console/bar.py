"""One progress bar for a long local operation (``zlaunch convert``): bytes done of a total.

Drawn with rich on a terminal; elsewhere (a pipe, a log file) nothing is drawn and the
command's own summary line says what happened.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

__all__ = ["byte_progress"]


@contextlib.contextmanager
def byte_progress(label: str) -> Iterator[Callable[[int], Callable[[int], None]]]:
    """Yields ``start(total) -> advance(n)``; the bar is drawn between start and exit."""
    if not sys.stderr.isatty():
        yield lambda total: lambda n: None
        return
    from rich.console import Console as RichConsole
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn(label), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=RichConsole(stderr=True), transient=False) as progress:

        def start(total: int) -> Callable[[int], None]:
            task = progress.add_task(label, total=total)
            return lambda n: progress.advance(task, n)

        yield start
