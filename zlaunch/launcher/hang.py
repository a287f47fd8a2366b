"""The hang watchdog: no rank has reached a step boundary for ``--hang-timeout`` seconds.

Progress is what the runtime reports: a rank that finished ``runtime.initialize`` (the
``runtime_ready`` event) and every optimizer step's metrics. The watch is armed by the first
such report, so a script that never calls the runtime is never declared hung.

When the watch fires, the controller asks every rank that can for its Python stacks (as
``zlaunch stacks`` does) and gathers them from the rank output for up to `STACKS_WAIT`
seconds: a rank stopped with SIGSTOP, or stuck in C code that never returns to Python, does not
answer, and the report says so. The report (reason ``hang``) groups the ranks by identical
stack, so the one rank that stands elsewhere than its peers is named at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from zlaunch.rundir.records import REASON_HANG, Failure
from zlaunch.stack_dumps import QUIET_AFTER, group_ranks, parse_dump

__all__ = ["EXIT_HANG", "STACKS_WAIT", "HangWatch", "StackCapture", "hang_failure"]

EXIT_HANG = 124
"""Exit code of a job stopped as hung (timeout(1)'s code)."""
STACKS_WAIT = 5.0
"""Seconds the controller waits for the ranks' stack dumps once a hang is declared."""


class HangWatch:
    """When did any rank last make progress, and is that longer ago than the timeout?"""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.last: float | None = None
        self.fired = False

    def progress(self, now: float) -> None:
        self.last = now

    def due(self, now: float) -> bool:
        return (
            self.timeout > 0
            and not self.fired
            and self.last is not None
            and now - self.last >= self.timeout
        )


class StackCapture:
    """The output of ranks asked for their stacks, until every dump is complete (no new
    stack line for `QUIET_AFTER` seconds) or `STACKS_WAIT` has passed."""

    def __init__(self, ranks: Iterable[int], now: float, wait: float = STACKS_WAIT):
        self.text: dict[int, list[str]] = {r: [] for r in ranks}
        self.deadline = now + wait
        self._stack_lines = dict.fromkeys(self.text, 0)
        self._changed = dict.fromkeys(self.text, now)

    def lines(self, rank: int, lines: list[str], now: float) -> None:
        if rank not in self.text:
            return
        self.text[rank].extend(lines)
        dump = parse_dump("\n".join(self.text[rank]))
        count = sum(len(frames) + 1 for _, frames in dump) if dump else 0
        if count != self._stack_lines[rank]:
            self._stack_lines[rank], self._changed[rank] = count, now

    def complete(self, rank: int, now: float) -> bool:
        return self._stack_lines[rank] > 0 and now - self._changed[rank] >= QUIET_AFTER

    def done(self, now: float) -> bool:
        return now >= self.deadline or all(self.complete(r, now) for r in self.text)

    def dumps(self) -> dict[int, Any]:
        out = {}
        for rank, lines in self.text.items():
            dump = parse_dump("\n".join(lines))
            if dump is not None:
                out[rank] = dump
        return out


def hang_failure(
    timeout: float,
    idle_s: float,
    hosts_of: dict[int, str],
    dumps: dict[int, Any],
    silent: list[int],
) -> Failure:
    """The failure record of a hang: where every rank stands (stack groups), who did not
    answer. ``silent``: running ranks that cannot dump (no runtime.initialize yet)."""
    groups = [
        {
            "ranks": ranks,
            "hosts": sorted({hosts_of[r] for r in ranks}),
            "threads": [{"thread": kind, "frames": list(frames)} for kind, frames in dump],
        }
        for ranks, dump in group_ranks(dumps)
    ]
    no_dump = sorted(set(hosts_of) - set(dumps) - set(silent))
    outliers = groups[1:] if len(groups) > 1 else []
    named = [r for g in outliers for r in g["ranks"]] + no_dump
    message = f"no rank reached a step boundary for {idle_s:.0f} s (--hang-timeout {timeout:g})"
    if named:
        message += f"; rank(s) {', '.join(map(str, sorted(named)))} stand apart"
    return Failure(
        reason=REASON_HANG,
        host=", ".join(sorted(set(hosts_of.values()))),
        rank="all",
        exit_code=EXIT_HANG,
        time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        message=message,
        hang={
            "timeout_s": timeout,
            "idle_s": round(idle_s, 1),
            "stack_groups": groups,
            "no_dump": no_dump,
            "cannot_dump": sorted(silent),
        },
    )
