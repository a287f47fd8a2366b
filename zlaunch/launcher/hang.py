"""The hang watchdog: no rank has reached a step boundary for ``--hang-timeout`` seconds.

Progress is what the runtime reports: a rank that finished ``runtime.initialize`` (the
``runtime_ready`` event) and every optimizer step's metrics. The watch is armed by the first
such report, so a script that never calls the runtime is never declared hung.

When the watch fires, the controller asks every rank that can for its Python stacks (as
``zlaunch stacks`` does) and gathers them from the rank output for up to `STACKS_WAIT`
seconds: a rank stopped with SIGSTOP, or stuck in C code that never returns to Python, does not
answer, and the report says so. With the same request each agent sends its ranks' recent
collectives (zlaunch/worker/collective_records.py). The report (reason ``hang``) groups the ranks by
identical stack and by identical collective records, and names the suspect in the failure's
own fields (``rank``, ``host``, ``pid``): zlaunch/launcher/hang_suspect.py reads who waits for
whom.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from zlaunch.launcher.hang_suspect import find_suspect, group_records
from zlaunch.rundir import REASON_HANG, Failure
from zlaunch.text import (
    FAULTHANDLER,
    QUIET_AFTER,
    group_ranks,
    parse_dump,
    parse_dump_by,
)

__all__ = ["EXIT_HANG", "STACKS_WAIT", "HangWatch", "StackCapture", "hang_failure"]

EXIT_HANG = 124
"""Exit code of a job stopped as hung (timeout(1)'s code)."""
STACKS_WAIT = 5.0
"""Seconds the controller waits for the ranks' stack dumps once a hang is declared."""


class HangWatch:
    """When did any rank last make progress, and is that longer ago than the timeout? A timer
    only: whether a hang may still be declared is the attempt machine's `HangPhase`."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.last: float | None = None

    def progress(self, now: float) -> None:
        self.last = now

    def due(self, now: float) -> bool:
        return self.timeout > 0 and self.last is not None and now - self.last >= self.timeout


class StackCapture:
    """The output of ranks asked for their stacks, until every dump is complete (no new
    stack line for `QUIET_AFTER` seconds) or `STACKS_WAIT` has passed."""

    def __init__(
        self, ranks: Iterable[int], now: float, idle_s: float = 0.0, wait: float = STACKS_WAIT
    ):
        self.idle_s = idle_s
        """How long no rank had made progress when the hang was declared."""
        self.text: dict[int, list[str]] = {r: [] for r in ranks}
        self.records: dict[int, list[dict]] = {}
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

    def collectives(self, rank: int, records: list[dict]) -> None:
        """A rank's collective records, sent by its agent with the request."""
        self.records[rank] = records

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

    def by_faulthandler(self) -> list[int]:
        """The ranks whose dump faulthandler wrote (their stacks thread could not run)."""
        found = {r: parse_dump_by("\n".join(lines)) for r, lines in self.text.items()}
        return sorted(r for r, (dump, by) in found.items() if dump and by == FAULTHANDLER)


def hang_failure(
    timeout: float,
    idle_s: float,
    hosts_of: dict[int, str],
    dumps: dict[int, Any],
    silent: list[int],
    records: dict[int, list[dict]] | None = None,
    pids_of: dict[int, int | None] | None = None,
    headline: str | None = None,
    by_faulthandler: list[int] | None = None,
) -> Failure:
    """The failure record of a hang: where every rank stands (stack groups, collective
    groups), who did not answer, and the suspect. ``silent``: running ranks that cannot dump
    (not Python, or still starting); ``by_faulthandler``: ranks whose dump faulthandler
    wrote, their stacks thread held off by the GIL."""
    records = records or {}
    pids_of = pids_of or {}
    stack_groups = group_ranks(dumps)
    groups = [
        {
            "ranks": ranks,
            "hosts": sorted({hosts_of[r] for r in ranks}),
            "threads": [{"thread": kind, "frames": list(frames)} for kind, frames in dump],
        }
        for ranks, dump in stack_groups
    ]
    no_dump = sorted(set(hosts_of) - set(dumps) - set(silent))
    # a stack apart from a strict majority of identical stacks (two different: no majority)
    majority = len(stack_groups) > 1 and len(stack_groups[0][0]) > len(stack_groups[1][0])
    outliers = [r for ranks, _ in stack_groups[1:] for r in ranks] if majority else []
    suspect = find_suspect(hosts_of, records, no_dump, outliers)
    if headline is None:
        headline = (
            f"no rank reached a step boundary for {idle_s:.0f} s (--hang-timeout {timeout:g})"
        )
    message = f"{headline}: {suspect.message}"
    named = list(suspect.ranks)
    if len(named) == 1:
        rank: int | str | list[int] = named[0]
        pid: int | list[int] | None = pids_of.get(named[0])
    elif named:
        rank, pid = named, [pids_of[r] for r in named if pids_of.get(r) is not None]
    else:
        rank, pid = "all", None
    hosts = sorted({hosts_of[r] for r in (named or hosts_of)})
    return Failure(
        reason=REASON_HANG,
        host=", ".join(hosts),
        rank=rank,
        pid=pid,
        exit_code=EXIT_HANG,
        time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        message=message,
        hang={
            "timeout_s": timeout,
            "idle_s": round(idle_s, 1),
            "suspect": {
                "ranks": named,
                "message": suspect.message,
                "waiting": list(suspect.waiting),
                "positions": {str(r): p for r, p in sorted(suspect.positions.items())},
            },
            "stack_groups": groups,
            "collective_groups": group_records(records, hosts_of),
            "no_dump": no_dump,
            "cannot_dump": sorted(silent),
            "dumped_by_faulthandler": sorted(by_faulthandler or ()),
        },
    )
