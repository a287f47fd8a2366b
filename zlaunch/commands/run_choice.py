"""Which running job a command without a run id means, when several run (pure, no I/O).

The index of runs is per account, so on a shared account, or with two jobs of one's own,
more than one job runs at a time. A command typed in a job's directory (or below it) means
that job: among the running jobs, those started in the current directory or one of its
parents match, the closest first. Only when that leaves more than one (or none) is the
command refused, naming them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypeVar

__all__ = ["started_here"]

Run = TypeVar("Run")


def started_here(
    running: Sequence[tuple[Run, dict[str, Any]]], cwd: str
) -> list[tuple[Run, dict[str, Any]]]:
    """The running jobs started in ``cwd`` or the closest parent of it that started any."""
    here = os.path.realpath(cwd)
    depth_of: list[tuple[int, tuple[Run, dict[str, Any]]]] = []
    for item in running:
        started = item[1].get("cwd")
        if not isinstance(started, str) or not started:
            continue
        started = os.path.realpath(started)
        if here == started or here.startswith(started.rstrip(os.sep) + os.sep):
            depth_of.append((len(started), item))
    if not depth_of:
        return []
    closest = max(depth for depth, _ in depth_of)
    return [item for depth, item in depth_of if depth == closest]
