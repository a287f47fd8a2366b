"""Which processes on this node belong to the agent's workers, after their leaders are gone
(stdlib only; Linux ``/proc``).

While a worker (its process group's leader) is not reaped, its pid, and so its group id, is
pinned: signalling the group reaches only what the worker started. Once it is reaped the pid
may be reused (pid_max is 32768 on many hosts), and a stranger's process group may carry the
old number. From then on the agent signals processes one by one, and only those that are
provably the job's:

- a member of the worker's old group while that group still holds a process that started
  before the leader was reaped (a stranger's group can only form after the group emptied), or
- any process whose environment carries the agent's job tag (``ZLAUNCH_JOB_TAG``), set for
  every worker and inherited by everything it starts: this finds what left the group with
  ``setsid`` or ``setpgid`` too.

What cannot be caught this way: a process that clears its environment *and* leaves the group,
a process that changes its user (setuid) and one that is not visible in this ``/proc`` (another
PID namespace). On a system without ``/proc`` nothing is signalled after the leader is reaped.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass

from zlaunch.wire import protocol

__all__ = ["ProcessTable", "Member", "new_job_tag", "boot_ticks", "carries_tag", "PROC"]

PROC = "/proc"


def new_job_tag() -> str:
    """A tag nobody else's process carries: this agent's pid and 64 random bits."""
    return f"{os.getpid()}-{secrets.token_hex(8)}"


def boot_ticks() -> int:
    """Now, in the clock ticks since boot that ``/proc/<pid>/stat`` counts start times in."""
    clock = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
    return int(time.clock_gettime(clock) * os.sysconf("SC_CLK_TCK"))


def carries_tag(pid: int, tag: str, proc: str = PROC) -> bool:
    """Whether live process ``pid`` has ``ZLAUNCH_JOB_TAG=tag`` in its environment."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as handle:
            env = handle.read()
    except OSError:
        return False
    return f"{protocol.JOB_TAG_ENV}={tag}".encode() in env.split(b"\0")


@dataclass(frozen=True)
class Member:
    """One live (not zombie) process of the table."""

    pid: int
    pgrp: int
    start_ticks: int


class ProcessTable:
    """A snapshot of this user's live processes on the node (``available``: /proc was there)."""

    def __init__(self, proc: str = PROC):
        self._proc = proc
        self.available = os.path.isdir(os.path.join(proc, "self"))
        self.members: list[Member] = []
        if not self.available:
            return
        me = os.getpid()
        try:
            names = os.listdir(proc)
        except OSError:
            self.available = False
            return
        for name in names:
            if name.isdigit() and int(name) != me:
                member = self._read(int(name))
                if member is not None:
                    self.members.append(member)

    def _read(self, pid: int) -> Member | None:
        try:
            with open(f"{self._proc}/{pid}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:  # gone meanwhile, or not ours to see
            return None
        # "pid (comm) state ppid pgrp session ... starttime(22)"; comm may hold anything
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 20 or fields[0] in (b"Z", b"X"):
            return None
        try:
            return Member(pid, int(fields[2]), int(fields[19]))
        except ValueError:
            return None

    def tagged(self, tag: str) -> list[int]:
        """Pids whose environment holds ``ZLAUNCH_JOB_TAG=tag`` (readable only for our own)."""
        return [m.pid for m in self.members if carries_tag(m.pid, tag, self._proc)]

    def group_of(self, pid: int) -> int | None:
        return next((m.pgrp for m in self.members if m.pid == pid), None)

    def left_of_group(self, pgid: int, reaped_at: int) -> list[int]:
        """Live members of group ``pgid``, whose leader was reaped at ``reaped_at`` (boot
        ticks), if the group is still the worker's.

        While any process is in group ``pgid`` the kernel does not hand that number out again;
        a stranger's group of that id can only form after the group was empty and the number
        freed, so all of its members start after the reap. A group with a member that started
        no later than the reap is therefore the worker's, with everything in it. (The one case
        this cannot tell: a number freed and reused within the reap's own 10 ms tick.)
        """
        members = [m for m in self.members if m.pgrp == pgid]
        if any(m.start_ticks <= reaped_at for m in members):
            return [m.pid for m in members]
        return []
