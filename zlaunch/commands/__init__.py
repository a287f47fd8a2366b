"""One module per CLI subcommand; each exposes `command` (a click.Command)."""

from __future__ import annotations

from zlaunch.commands.allocation_args import take_back

__all__ = [
    "take_back",
]
