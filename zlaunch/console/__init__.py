"""What the user sees: the job's console (`terminal`), the live view (`live_view`,
`live_panel`, `live_breakdown`), the filters that keep noise, progress redraws and stack
dumps readable (`noise`, `progress`, `stacks`), and `collapse`: a line many ranks print alike,
shown once. The only part of zlaunch that imports rich, and
only when a live view or a table is drawn."""

from __future__ import annotations

from zlaunch.console.bar import byte_progress
from zlaunch.console.collapse import LineCollapser, Shown, collapse_wanted
from zlaunch.console.job_view import JobView
from zlaunch.console.live_view import PlainView, format_metrics, open_view
from zlaunch.console.noise import NoiseFilter
from zlaunch.console.progress import ProgressTracker, Redraw, visible
from zlaunch.console.safe_text import shown
from zlaunch.console.stacks import StackDumpFilter
from zlaunch.console.terminal import (
    Console,
    color_enabled,
    format_failure,
    format_hang,
    is_terminal,
    print_table,
)

__all__ = [
    "Console",
    "JobView",
    "LineCollapser",
    "NoiseFilter",
    "PlainView",
    "ProgressTracker",
    "Redraw",
    "Shown",
    "StackDumpFilter",
    "byte_progress",
    "collapse_wanted",
    "color_enabled",
    "format_failure",
    "format_hang",
    "format_metrics",
    "is_terminal",
    "open_view",
    "print_table",
    "shown",
    "visible",
]
