"""First contact: how long each agent is given to say hello once its connection is open, and
what is said of one that has not. Pure (times are passed in; nothing here reads a clock or a
link), so the whole judgement is table-tested; zlaunch/launcher/job.py feeds it.

Judged like liveness (zlaunch/wire/liveness.py): a slow agent is not a gone one.

- **The deadline grows with the hosts.** ``hello_deadline(hosts, ssh_timeout)`` is
  ``max(ssh_timeout, 10) + 5`` seconds (a small job's allowance, unchanged) plus half a second
  per host beyond 8, at most 120 s: 15 s for 1-8 hosts, 43 s at 64, 120 s from 218 on. Every
  agent starts at once, and what they share grows with their number: the controller's host
  runs every SSH session's crypto and every reader thread under one interpreter, and the
  hosts' Pythons load from the same shared filesystem and log in through the same directory
  service. On a loaded 2-core machine, 64 agents took more than 30 s to say hello.
- **Counted from each host's own connection**, not from the last one opened: a host that
  connected first and stays silent is judged first.
- **Silent past the deadline is not yet "no answer".** The agent's process is probed (its
  transport still has it running: the SSH channel has no exit status and its connection is
  up, the local or srun process has not exited). Not running: "no answer from the agent on
  X", at once. Still running: named once as slow, and waited for up to ``hello_bound``:
  four times the deadline, at most 600 s (60 s for a small job, 172 s at 64 hosts). Past that
  the start ends naming it, as still running but silent.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "BASE_SLACK",
    "FirstContact",
    "Judgement",
    "PROGRESS_AFTER",
    "Verdict",
    "connecting_text",
    "hello_bound",
    "hello_deadline",
    "judge",
    "progress_text",
]

MIN_SSH_TIMEOUT = 10.0
BASE_SLACK = 5.0
"""Seconds beyond the SSH timeout a small job gives an agent to start and say hello."""
SMALL_FLEET = 8
"""Up to this many hosts, the base deadline."""
SECONDS_PER_HOST = 0.5
"""Beyond it, this much more per host."""
MAX_DEADLINE = 120.0
BOUND_FACTOR = 4.0
"""An agent still running at its deadline is waited for up to this many deadlines."""
MAX_BOUND = 600.0
PROGRESS_AFTER = 2.0
"""Seconds of waiting before the console starts saying who has answered (a fast start says
nothing)."""
NAMES_SHOWN = 8
"""Hosts named in a progress line; the rest are counted."""


def hello_deadline(hosts: int, ssh_timeout: float) -> float:
    """Seconds from a host's connection to its agent's hello before the agent is probed."""
    extra = SECONDS_PER_HOST * max(0, hosts - SMALL_FLEET)
    return min(MAX_DEADLINE, max(ssh_timeout, MIN_SSH_TIMEOUT) + BASE_SLACK + extra)


def hello_bound(hosts: int, ssh_timeout: float) -> float:
    """Seconds from a host's connection after which even a running agent's silence ends the
    start."""
    deadline = hello_deadline(hosts, ssh_timeout)
    return max(deadline, min(MAX_BOUND, BOUND_FACTOR * deadline))


class Verdict(enum.Enum):
    WAIT = "wait"
    """Within its deadline, or answered: nothing to do."""
    PROBE = "probe"
    """Past its deadline, not probed: look at its process, then judge again."""
    SLOW = "slow"
    """Past its deadline, its process still runs: more time, up to the bound."""
    GONE = "gone"
    """Silent past its deadline and its process is not running: it will never answer."""
    OVERDUE = "overdue"
    """Still running but silent past the bound: the start ends."""


def judge(silent: float, running: bool | None, deadline: float, bound: float) -> Verdict:
    """One agent, ``silent`` seconds since its connection opened without a hello. ``running``
    is what a probe of its process found (None: not probed)."""
    if silent < deadline:
        return Verdict.WAIT
    if running is None:
        return Verdict.PROBE
    if not running:
        return Verdict.GONE
    return Verdict.SLOW if silent < bound else Verdict.OVERDUE


def _names(hosts: Sequence[str]) -> str:
    more = len(hosts) - NAMES_SHOWN
    return ", ".join(hosts[:NAMES_SHOWN]) + (f" (+{more})" if more > 0 else "")


def progress_text(answered: int, total: int, starting: Sequence[str]) -> str:
    """``agents: 41/64 answered; starting: 127.0.1.2, ... (+20)``."""
    return f"agents: {answered}/{total} answered; starting: {_names(starting)}"


def connecting_text(connected: int, total: int, connecting: Sequence[str]) -> str:
    """The same while connections are still opening (slow logins: PAM, a directory service):
    ``agents: 96/500 connected; connecting: node097, ... (+396)``."""
    return f"agents: {connected}/{total} connected; connecting: {_names(connecting)}"


@dataclass
class _Agent:
    name: str
    opened: float | None = None
    answered: bool = False
    said_slow: bool = False


@dataclass(frozen=True)
class Judgement:
    """What one look at the silent agents found (node indexes)."""

    newly_slow: tuple[int, ...] = ()
    """Running but past their deadline, not said before: name them once."""
    gone: tuple[int, ...] = ()
    overdue: tuple[int, ...] = ()


class FirstContact:
    """Every agent of one attempt until each has said hello."""

    def __init__(self, names: Sequence[str], deadline: float, bound: float):
        self.deadline = deadline
        self.bound = bound
        self.agents = [_Agent(name) for name in names]
        self._said_at: float | None = None

    def opened(self, node: int, at: float) -> None:
        self.agents[node].opened = at

    def answered(self, node: int) -> None:
        self.agents[node].answered = True

    @property
    def done(self) -> bool:
        return all(agent.answered for agent in self.agents)

    def starting(self) -> list[int]:
        return [i for i, agent in enumerate(self.agents) if not agent.answered]

    def look(self, now: float, running: Callable[[int], bool]) -> Judgement:
        """Judge every silent agent at ``now``; ``running(node)`` probes one past its
        deadline (at every look: a process that ends while it is waited for is found)."""
        slow, gone, overdue = [], [], []
        for node in self.starting():
            agent = self.agents[node]
            if agent.opened is None:
                continue  # not connected yet: the transport's own timeout holds
            silent = now - agent.opened
            verdict = judge(silent, None, self.deadline, self.bound)
            if verdict is Verdict.PROBE:
                verdict = judge(silent, running(node), self.deadline, self.bound)
            if verdict is Verdict.GONE:
                gone.append(node)
            elif verdict is Verdict.OVERDUE:
                overdue.append(node)
            elif verdict is Verdict.SLOW and not agent.said_slow:
                agent.said_slow = True
                slow.append(node)
        return Judgement(tuple(slow), tuple(gone), tuple(overdue))

    def progress(self, now: float, started: float, interval: float) -> str | None:
        """The progress line when it is due (None otherwise): from PROGRESS_AFTER seconds
        after ``started`` on, at most every ``interval`` seconds."""
        if self.done or now - started < PROGRESS_AFTER:
            return None
        if self._said_at is not None and now - self._said_at < interval:
            return None
        waiting = self.starting()
        text = progress_text(
            len(self.agents) - len(waiting),
            len(self.agents),
            [self.agents[i].name for i in waiting],
        )
        self._said_at = now
        return text

    def names(self, nodes: Sequence[int]) -> str:
        return ", ".join(self.agents[i].name for i in nodes)
