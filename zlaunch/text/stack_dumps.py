"""Stack dumps read from rank output: parse one rank's dump, group ranks by stack.

A dump is in faulthandler's format, whoever wrote it (the worker's stacks thread,
zlaunch/worker/stack_dumper.py, or faulthandler standing in for it), after a marker line that says
which one did (`DUMP_MARKER`).

Pure text functions shared by ``zlaunch stacks`` (reading the rank logs), the hang report (the
controller's capture) and the console's filter that keeps dumps off the job's console.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "DUMP_MARKER",
    "FAULTHANDLER",
    "MAIN_DUMPER",
    "THREAD_DUMPER",
    "dump_marker",
    "parse_dump_by",
    "QUIET_AFTER",
    "STACK_FRAME",
    "STACK_HEADER",
    "group_ranks",
    "parse_dump",
    "stack_line_count",
]

THREAD_DUMPER = "its stacks thread"
"""Who dumped (zlaunch/worker/stack_dumper.py): the worker's own thread, under the GIL."""
MAIN_DUMPER = "its main thread"
"""The worker's main thread, where the stacks signal reached a Python handler."""
FAULTHANDLER = "faulthandler"
"""faulthandler, from the signal handler without the GIL (the agent's fallback)."""
UNMARKED = "faulthandler"
"""A dump with no marker before it: faulthandler armed by the runtime itself."""
DUMP_MARKER = re.compile(r"^Stack dump of process (\d+) by (.+?)(?: \((.*)\))?:$")
# faulthandler's output: thread headers, frames, and the marker of a thread in C code only.
STACK_HEADER = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):$")
# A frame's line is "???" where faulthandler cannot tell it (a frame inside a C call's setup).
STACK_FRAME = re.compile(r'^  File ".*", line (\d+|\?\?\?) in .*$|^  <no Python frame>$')

_BOOT_LINE = 'File "<string>", line 1 in <module>'  # the boot's -c (zlaunch/worker/python_start.py)
_BOOT_FILES = ("<frozen runpy>", "runpy.py", "zlaunch/worker/boot.py")
# zlaunch's own threads in a worker (its collectives, its group watch, its stacks thread when
# faulthandler dumps it): no part of where the script stands
_OWN_THREADS = (
    "zlaunch/worker/collective_records.py",
    "zlaunch/worker/group.py",
    "zlaunch/worker/stack_dumper.py",
)
QUIET_AFTER = 0.3
"""Seconds without new stack lines after which a rank's dump is taken as complete."""


def dump_marker(pid: int, by: str, why: str = "") -> str:
    """The line before a dump: whose stacks follow and who dumped them (`DUMP_MARKER`)."""
    return f"Stack dump of process {pid} by {by}" + (f" ({why})" if why else "") + ":"


def parse_dump(text: str) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    """The thread stacks in a chunk of rank log (other lines ignored), thread ids dropped;
    None when it holds no dump. The main thread (faulthandler's "current") comes first."""
    return parse_dump_by(text)[0]


def parse_dump_by(text: str) -> tuple[tuple[tuple[str, tuple[str, ...]], ...] | None, str]:
    """The first dump in the text and who made it (`THREAD_DUMPER`, `FAULTHANDLER`, or
    ``"faulthandler"`` for a dump with no marker line). A rank that answers late (its GIL held
    while faulthandler stood in for it) dumps twice: the first dump is the answer."""
    lines = text.splitlines()
    sections: list[tuple[str, list[str]]] = [(UNMARKED, [])]
    for line in lines:
        marker = DUMP_MARKER.match(line)
        if marker:
            sections.append((marker.group(2), []))
        else:
            sections[-1][1].append(line)
    for by, section in sections:
        dump = _parse_section(section)
        if dump:
            return dump, by
    return None, UNMARKED


def _parse_section(lines: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    threads: list[tuple[str, list[str]]] = []
    for line in lines:
        header = STACK_HEADER.match(line)
        if header:
            threads.append(("main" if header.group(1) == "Current thread" else "thread", []))
        elif threads and STACK_FRAME.match(line):
            threads[-1][1].append(line.strip())
    if not threads:
        return None
    for _, frames in threads:  # the boot's frames under the script (its -c line, runpy, it)
        if len(frames) > 1 and frames[-1] == _BOOT_LINE and "runpy" in frames[-2]:
            frames.pop()  # a `python -c` program's own line stays: runpy is not above it
        while frames and _is_boot_frame(frames[-1]):
            frames.pop()
    threads = [
        t
        for t in threads
        if t[0] == "main" or not any(own in f for f in t[1] for own in _OWN_THREADS)
    ]
    threads.sort(key=lambda t: t[0] != "main")
    return tuple((kind, tuple(frames)) for kind, frames in threads)


def _is_boot_frame(frame: str) -> bool:
    return any(name in frame for name in _BOOT_FILES)


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
