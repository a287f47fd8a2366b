"""What the user sees: the job's console (`terminal`), the live view (`live_view`,
`live_panel`, `live_breakdown`), the filters that keep noise, progress redraws and stack
dumps readable (`noise`, `progress`, `stacks`), and `collapse`: a line many ranks print alike,
shown once. The only part of zlaunch that imports rich, and
only when a live view or a table is drawn."""

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
    "color_enabled",
    "format_failure",
    "format_hang",
    "is_terminal",
    "print_table",
]
