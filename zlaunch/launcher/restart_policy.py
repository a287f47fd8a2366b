"""What follows an attempt: a restart (on the same hosts, or without the lost ones), another
try at hosts that do not answer yet, or the end of the job.

Pure decisions, tested table-style (tests/unit/launcher/test_job_state.py); the runner
(zlaunch/launcher/job.py) carries them out, and zlaunch/launcher/elastic.py computes the hosts and batch of
an attempt without some hosts.

    failed attempt, restarts left            -> Restart (without the lost hosts with --min-nodes)
    failed attempt, budget spent             -> GiveUp
    interrupted, incomplete or succeeded     -> GiveUp (nothing to restart)
    hosts unreachable at a first start       -> GiveUp
    hosts unreachable at a restart, in the window        -> Retry after RETRY_WAIT
    hosts unreachable past the window, with --min-nodes  -> GoOnWithout them (new window)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from zlaunch.launcher.state import Ending, Outcome

__all__ = [
    "REACH_WINDOW",
    "RETRY_WAIT",
    "Restart",
    "Retry",
    "GoOnWithout",
    "GiveUp",
    "RestartPolicy",
]

REACH_WINDOW = 30.0
"""Seconds a restart keeps trying to reach hosts that do not answer yet (with --min-nodes it
then goes on without them)."""
RETRY_WAIT = 2.0


@dataclass(frozen=True)
class Restart:
    without: frozenset[str]
    """Hosts to leave out of the next attempt (empty: the same hosts)."""
    restarts_left: int


@dataclass(frozen=True)
class Retry:
    wait: float


@dataclass(frozen=True)
class GoOnWithout:
    hosts: frozenset[str]


@dataclass(frozen=True)
class GiveUp:
    pass


class RestartPolicy:
    """--max-restarts and --min-nodes, across the attempts of one job."""

    def __init__(self, max_restarts: int, min_nodes: int | None, window: float = REACH_WINDOW):
        self.restarts_left = max_restarts
        self.min_nodes = min_nodes
        self.window = window
        self.reach_deadline: float | None = None
        """Until when a restart waits for hosts to answer; None before the first restart."""

    def after(self, outcome: Outcome, lost_hosts: Iterable[str], now: float) -> Restart | GiveUp:
        """The attempt ended with ``outcome``; ``lost_hosts``: hosts whose agent broke off."""
        if outcome.ending != Ending.RANKS_FAILED or self.restarts_left <= 0:
            return GiveUp()
        if outcome.signal_while_stopping is not None:
            return GiveUp()  # the user (or the system) asked to stop: the failure stands
        self.restarts_left -= 1
        self.reach_deadline = now + self.window
        without = frozenset(lost_hosts) if self.min_nodes is not None else frozenset()
        return Restart(without, self.restarts_left)

    def unreachable(self, hosts: Iterable[str], now: float) -> Retry | GoOnWithout | GiveUp:
        """Starting an attempt failed: ``hosts`` did not answer."""
        hosts = frozenset(hosts)
        if self.reach_deadline is None:
            return GiveUp()
        if now <= self.reach_deadline:
            return Retry(RETRY_WAIT)
        if self.min_nodes is None or not hosts:
            return GiveUp()
        self.reach_deadline = now + self.window
        return GoOnWithout(hosts)
