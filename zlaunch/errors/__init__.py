"""One exception tree with exit codes (`tree`), raised anywhere in the controller and
rendered once in `zlaunch.cli.main`; `assert_never` (`exhaustive`) closes a `match` over a
closed union."""

from __future__ import annotations

from zlaunch.errors.exhaustive import assert_never
from zlaunch.errors.tree import (
    ConfigError,
    HostfileError,
    HostUnreachable,
    Interrupted,
    LaunchError,
    UsageError,
    WorkerFailed,
    ZlaunchError,
)

__all__ = [
    "ConfigError",
    "HostUnreachable",
    "HostfileError",
    "Interrupted",
    "LaunchError",
    "UsageError",
    "WorkerFailed",
    "ZlaunchError",
    "assert_never",
]
