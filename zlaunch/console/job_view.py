"""What both views of a running job track: the latest metrics and which ranks live on which
host. The live panel draws from it; the views (`live_view`) feed it."""

from __future__ import annotations

import time
from typing import Any

from zlaunch.console.live_breakdown import BreakdownPanel
from zlaunch.console.terminal import Console
from zlaunch.rundir import RunStatus
from zlaunch.wire import META_KEYS

__all__ = ["JobView", "SILENT_AFTER"]

SILENT_AFTER = 30.0
"""An alive rank with no output for this long is named in the panel (a hang shows early)."""


class JobView:
    """What both views track: the latest metrics and which ranks live on which host."""

    def __init__(self, console: Console):
        self.console = console
        self.run_id = ""
        self.expected: dict[str, int] = {}
        self.alive: dict[int, str] = {}
        self.exits: dict[int, int] = {}
        self.lost: set[int] = set()
        """Ranks whose host's agent connection broke: how they ended is unknown."""
        self.stopped: set[int] = set()
        """Ranks that zlaunch stopped (after a failure elsewhere, Ctrl-C, `zlaunch stop`)."""
        self.latest: dict[str, Any] | None = None
        self.latest_at: float | None = None
        self.user: dict[str, Any] = {}
        self.started_at = time.monotonic()
        self.status = RunStatus.STARTING
        self.bars: dict[int, tuple[str, str]] = {}
        """rank -> (host, latest state) of a line it redraws with carriage returns (tqdm)."""
        self.last_output: dict[int, float] = {}
        """rank -> monotonic time of its last output (a hang shows as silence)."""
        self.breakdown = BreakdownPanel()
        self.fleet_line = ""
        """The fleet change under way (a preemption, hosts joining); empty when none."""
        self.start_line = ""
        """Which agents have answered and which are still starting; empty once all are in."""

    def start(self, run_id: str, expected: dict[str, int]) -> None:
        self.run_id = run_id
        self.expected = dict(expected)
        self.status = RunStatus.RUNNING

    def rank_started(self, rank: int, host: str) -> None:
        self.alive[rank] = host

    def rank_exited(self, rank: int, host: str, code: int) -> None:
        self.alive.pop(rank, None)
        self.bars.pop(rank, None)
        self.exits[rank] = code
        if code != 0 and self.status not in (RunStatus.STARTING, RunStatus.RUNNING):
            self.stopped.add(rank)  # ended by zlaunch's stop, not a failure of its own

    def rank_lost(self, rank: int, host: str) -> None:
        self.alive.pop(rank, None)
        self.lost.add(rank)

    def output_seen(self, rank: int) -> None:
        """The rank wrote a line or redrew its progress line just now."""
        self.last_output[rank] = time.monotonic()

    def quiet_ranks(self, now: float) -> list[tuple[int, float]]:
        """Alive ranks silent (no output) for SILENT_AFTER seconds or more, with the silence."""
        quiet = []
        for rank in self.alive:
            since = self.last_output.get(rank, self.started_at)
            if now - since >= SILENT_AFTER:
                quiet.append((rank, now - since))
        return sorted(quiet)

    def progress(self, rank: int, host: str, stream: str, text: str | None) -> None:
        """The latest state of a rank's progress line; None when the line ended."""
        if text is None:
            self.bars.pop(rank, None)
        else:
            self.bars[rank] = (host, text)

    def metrics(self, rank: int, host: str | None, event: dict[str, Any]) -> None:
        if event.get("source") == "user":
            self.user.update({k: v for k, v in event.items() if k not in META_KEYS})
        else:
            self.latest = event
            self.latest_at = time.monotonic()

    def set_status(self, status: RunStatus) -> None:
        self.status = status

    def fleet(self, line: str) -> None:
        """What the fleet change under way waits for (the notes said how it began)."""
        self.fleet_line = line

    def starting(self, line: str) -> None:
        """Who has answered while the agents start (empty: every one has)."""
        self.start_line = line

    def tick(self) -> None:
        pass

    def close(self) -> None:
        pass

    # ---- derived --------------------------------------------------------------------------

    def eta(self) -> float | None:
        event = self.latest
        if not event or not event.get("total_steps") or not event.get("step_time"):
            return None
        left = (event["total_steps"] - event["step"]) * event["step_time"]
        since = time.monotonic() - (self.latest_at or time.monotonic())
        return max(0.0, left - since)

    def health(self) -> list[tuple[str, int, int]]:
        """(host, ranks alive, ranks expected) per host, in plan order."""
        alive: dict[str, int] = {}
        for host in self.alive.values():
            alive[host] = alive.get(host, 0) + 1
        return [(host, alive.get(host, 0), n) for host, n in self.expected.items()]
