"""A rank's own time per optimizer step: its wall time less the time it was blocked in
collectives, the number zlaunch compares across ranks to name a slow host
(zlaunch/launcher/stragglers.py).

In a synchronous job every rank's wall-clock step is the same: a slow rank's peers spend its
extra time blocked in the collectives that wait for it, so what tells them apart is the time
each spends outside them. runtime.distributed.comm tells its observer how long this rank was
blocked in each collective; `BusyClock` sums those and takes them off the wall time between
two step ends. No collective of its own, no device synchronization: a few clock reads per
collective (benchmarks/stragglers_cost.py measures it). On CUDA the host is not blocked while
NCCL runs on the device, so the engine only keeps this clock on CPU devices.
"""

from __future__ import annotations

import time

from runtime.distributed import CommObserver

__all__ = ["BusyClock"]


class BusyClock(CommObserver):
    """Seconds blocked in collectives since the last lap, and the laps' wall clock."""

    def __init__(self) -> None:
        self.blocked = 0.0
        self._last: float | None = None

    def start(self) -> None:
        """The first step's start (its first forward); later steps start at the previous lap."""
        if self._last is None:
            self._last = time.perf_counter()
            self.blocked = 0.0

    def on_done(
        self, kind: str, size: int, traffic: int, latency: float, blocked: float, world: int
    ) -> None:
        self.blocked += blocked

    def lap(self) -> float | None:
        """This rank's own seconds since the last lap (None before the first `start`)."""
        now = time.perf_counter()
        if self._last is None:
            return None
        busy = now - self._last - self.blocked
        self._last = now
        self.blocked = 0.0
        return max(busy, 0.0)
