"""How long this process's threads were runnable but not running: the time the kernel held
them back (a cgroup CPU quota throttling the host, cores shared with other work).

A host held to a fraction of a core by a CPU quota stalls wherever its quota runs out, also
while gloo's threads are doing this rank's part of a collective. That stall is the host's own
slowness, but a clock that only sees "blocked in a collective" counts it as waiting for peers
(runtime/observe/profiling/busy.py takes it back out). Linux keeps, per thread, the
nanoseconds spent waiting on a run queue (the second field of /proc/<pid>/task/<tid>/schedstat,
which includes the time a throttled group was held off the CPU); elsewhere there is nothing
to read and every figure is 0.

Cheap enough for once a step: one pread per thread on descriptors kept open (about 2 us
each), and the thread list read again only every ``RESCAN`` reads.
"""

from __future__ import annotations

import os
import threading

__all__ = ["RunDelay"]

RESCAN = 10
"""Reads between two looks at which threads the process has (threads come and go rarely)."""
_TASKS = "/proc/self/task"


class RunDelay:
    """Seconds this process's threads waited for a CPU, since the previous `read`, split into
    the thread that created it (the one running the training loop) and all the others."""

    def __init__(self) -> None:
        self.main = threading.get_native_id()
        self._fds: dict[int, int] = {}  # tid -> open schedstat descriptor
        self._last: dict[int, int] = {}  # tid -> its nanoseconds at the previous read
        self._reads = 0
        self.available = os.path.isdir(_TASKS)
        if self.available:
            self._rescan()
            self.read()  # the baseline: the first real read counts from here

    def read(self) -> tuple[float, float]:
        """(the main thread's seconds, the other threads' seconds) since the previous read."""
        if not self.available:
            return 0.0, 0.0
        self._reads += 1
        if self._reads % RESCAN == 0:
            self._rescan()
        main = others = 0
        for tid, fd in list(self._fds.items()):
            try:
                now = int(os.pread(fd, 128, 0).split()[1])
            except (OSError, IndexError, ValueError):  # the thread ended
                self._forget(tid)
                continue
            delta = max(now - self._last.get(tid, now), 0)
            self._last[tid] = now
            if tid == self.main:
                main += delta
            else:
                others += delta
        return main / 1e9, others / 1e9

    def _rescan(self) -> None:
        try:
            tids = {int(t) for t in os.listdir(_TASKS)}
        except (OSError, ValueError):
            self.available = False
            return
        for tid in set(self._fds) - tids:
            self._forget(tid)
        for tid in tids - set(self._fds):
            try:
                self._fds[tid] = os.open(f"{_TASKS}/{tid}/schedstat", os.O_RDONLY)
            except OSError:
                continue

    def _forget(self, tid: int) -> None:
        fd = self._fds.pop(tid, None)
        self._last.pop(tid, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for tid in list(self._fds):
            self._forget(tid)
