"""A rank's own time per optimizer step: its wall time less the time it really waited for its
peers in collectives, the number zlaunch compares across ranks to name a slow host
(zlaunch/launcher/stragglers.py).

In a synchronous job every rank's wall-clock step is the same: a slow rank's peers spend its
extra time blocked in the collectives that wait for it, so what tells them apart is the time
each spends outside them. runtime.distributed.comm tells its observer how long this rank was
blocked in each collective; `BusyClock` sums those and takes them off the wall time between
two step ends.

Blocked is not always waiting. A host whose CPU is throttled (a cgroup quota, cores shared
with other work) stalls wherever the kernel holds it back, also while gloo's threads do this
rank's part of a collective: measured on three hosts sharing two cores with one held to a
quarter core, most of that host's stall fell inside collectives, so it looked like the rank
that waits the most and a healthy host was named. The time this process's threads were
runnable but not running (runtime/observe/profiling/run_delay.py) is taken back out of the
blocked time: the collective threads' (gloo's workers, which do the collective while the
training thread sleeps in it) and the training thread's share of the step spent blocked,
capped at the blocked time. What is left, `waited`, is the time the rank really waited for
its peers; the slow rank is the one that (almost) never waits.

No collective of its own, no device synchronization: a few clock reads per collective and one
read of the threads' run delays per step (benchmarks/stragglers_cost.py measures it). On CUDA
the host is not blocked while NCCL runs on the device, so the engine only keeps this clock on
CPU devices.
"""

from __future__ import annotations

import time

from runtime.distributed import CommObserver

from .run_delay import RunDelay

__all__ = ["BusyClock"]


class BusyClock(CommObserver):
    """Seconds blocked in collectives since the last lap, and the laps' wall clock."""

    def __init__(self, run_delay: RunDelay | None = None) -> None:
        self.blocked = 0.0
        self.waited = 0.0
        """The last lap's seconds really spent waiting for peers (blocked less stalled)."""
        self._last: float | None = None
        self._delay = run_delay if run_delay is not None else RunDelay()

    def start(self) -> None:
        """The first step's start (its first forward); later steps start at the previous lap."""
        if self._last is None:
            self._last = time.perf_counter()
            self.blocked = 0.0
            self._delay.read()

    def on_done(
        self, kind: str, size: int, traffic: int, latency: float, blocked: float, world: int
    ) -> None:
        self.blocked += blocked

    def lap(self) -> float | None:
        """This rank's own seconds since the last lap (None before the first `start`): the
        wall time less `waited`."""
        now = time.perf_counter()
        if self._last is None:
            return None
        wall = now - self._last
        main, others = self._delay.read()
        blocked = min(self.blocked, wall)
        # the training thread's stall is spread over its step: its blocked share is in there
        share = blocked / wall if wall > 0 else 0.0
        stalled = min(blocked, others + main * share)
        self.waited = blocked - stalled
        self._last = now
        self.blocked = 0.0
        return max(wall - self.waited, 0.0)
