"""`wall_clock_breakdown`: where one rank's step time goes.

Phases are timed on the host around the engine's own calls (forward, backward, optimizer
step); the two waits come from runtime.distributed.comm's observer: the time this rank was blocked on a
gradient reduction (all_reduce / reduce_scatter) during backward — the part that did not
overlap with backward's compute — and on a parameter all-gather during forward or backward
(stage 3's fetches). Both waits are *inside* forward/backward, not added to them. On CUDA the
device is synchronized at every phase edge so that host time is device time, as DeepSpeed's
breakdown does; that costs the overlap across the edges, so leave it off for production runs.
"""

from __future__ import annotations

import enum
import time

import torch

from runtime.distributed import CommObserver

__all__ = ["Phase", "WallClock", "PHASES"]


class Phase(enum.Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    REDUCE_WAIT = "reduce_wait"
    """Inside BACKWARD: blocked on gradient reductions."""
    STEP = "step"
    ALLGATHER_WAIT = "allgather_wait"
    """Inside FORWARD and BACKWARD: blocked on parameter all-gathers (stage 3)."""


PHASES = tuple(Phase)
# all_to_all: the gradient reduction of ZeRO++'s qgZ (its only user).
_REDUCE_KINDS = frozenset({"all_reduce", "reduce_scatter", "all_to_all"})
_GATHER_KINDS = frozenset({"all_gather", "broadcast"})


class WallClock(CommObserver):
    """Per-phase seconds accumulated since the last `take()`, and the steps they cover."""

    def __init__(self, sync_cuda: bool = False):
        self.sync_cuda = sync_cuda
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.steps = 0
        self._phase: Phase | None = None
        self._started = 0.0

    def _sync(self) -> None:
        if self.sync_cuda:
            torch.cuda.synchronize()

    def start(self, phase: Phase) -> None:
        self._sync()
        self._phase = phase
        self._started = time.perf_counter()

    def stop(self) -> None:
        if self._phase is None:
            return
        self._sync()
        self.totals[self._phase] += time.perf_counter() - self._started
        self._phase = None

    def end_step(self) -> None:
        self.steps += 1

    def on_done(
        self, kind: str, size: int, traffic: int, latency: float, blocked: float, world: int
    ) -> None:
        phase = self._phase
        if phase is Phase.BACKWARD and kind in _REDUCE_KINDS:
            self.totals[Phase.REDUCE_WAIT] += blocked
        elif phase in (Phase.FORWARD, Phase.BACKWARD) and kind in _GATHER_KINDS:
            self.totals[Phase.ALLGATHER_WAIT] += blocked

    def take(self) -> list[float]:
        """Seconds per optimizer step for each phase (PHASES order) since the last take."""
        steps = max(self.steps, 1)
        values = [self.totals[p] / steps for p in PHASES]
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.steps = 0
        return values
