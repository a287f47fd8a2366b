"""Faulthandler stack dumps read from rank output: parse one rank's dump, group ranks by stack.

Pure text functions shared by ``zlaunch stacks`` (reading the rank logs), the hang report (the
controller's capture) and the console's filter that keeps dumps off the job's console.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "QUIET_AFTER",
    "STACK_FRAME",
    "STACK_HEADER",
    "group_ranks",
    "parse_dump",
    "stack_line_count",
]

# faulthandler's output: thread headers, frames, and the marker of a thread in C code only.
STACK_HEADER = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):$")
# A frame's line is "???" where faulthandler cannot tell it (a frame inside a C call's setup).
STACK_FRAME = re.compile(r'^  File ".*", line (\d+|\?\?\?) in .*$|^  <no Python frame>$')

_OWN_THREAD = "collective_records.py"  # zlaunch's thread in every worker (its collectives)
QUIET_AFTER = 0.3
"""Seconds without new stack lines after which a rank's dump is taken as complete."""


def parse_dump(text: str) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    """The thread stacks in a chunk of rank log (other lines ignored), thread ids dropped;
    None when it holds no dump. The thread that received the signal ("current") comes first."""
    threads: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        header = STACK_HEADER.match(line)
        if header:
            threads.append(("main" if header.group(1) == "Current thread" else "thread", []))
        elif threads and STACK_FRAME.match(line):
            threads[-1][1].append(line.strip())
    if not threads:
        return None
    for _, frames in threads:  # zlaunch.worker_boot's and runpy's frames under the script
        while frames and ("<frozen runpy>" in frames[-1] or "worker_boot.py" in frames[-1]):
            frames.pop()
    # zlaunch's own collective-records thread is no part of where the script stands
    threads = [t for t in threads if not any(_OWN_THREAD in f for f in t[1])]
    threads.sort(key=lambda t: t[0] != "main")
    return tuple((kind, tuple(frames)) for kind, frames in threads)


def stack_line_count(text: str) -> int:
    return sum(
        1 for line in text.splitlines() if STACK_HEADER.match(line) or STACK_FRAME.match(line)
    )


def group_ranks(dumps: dict[int, Any]) -> list[tuple[list[int], Any]]:
    """Ranks with identical stacks together; the largest group first."""
    groups: dict[Any, list[int]] = {}
    for rank, dump in sorted(dumps.items()):
        groups.setdefault(dump, []).append(rank)
    return sorted(((ranks, dump) for dump, ranks in groups.items()), key=lambda g: -len(g[0]))
