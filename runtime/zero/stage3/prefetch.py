"""Stage 3's fetch planning, as pure arithmetic: unit indices and sizes in, decisions out.

The *trace* is the sequence of unit fetches of the last complete forward+backward pass. Along
it, the planner answers the coordinator's two questions:

* what to prefetch after the fetch at position ``pos``: the next units of the trace, in order,
  while their sizes fit the ``stage3_prefetch_bucket_size`` budget and the live bound
  (``stage3_max_live_parameters``);
* whether to keep a unit gathered after its module returns: when its next use is at most
  ``stage3_max_reuse_distance`` elements of fetches away.

A pass that departs from the trace (data-dependent control flow) is *off trace* for the rest
of that pass: nothing is prefetched or kept, and that pass becomes the new trace.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

__all__ = ["reuse_distances", "FetchPlanner"]


def reuse_distances(events: Sequence[int], numels: Sequence[int]) -> list[float]:
    """For each position of ``events`` (unit indices), the elements fetched before that unit
    is fetched again (``inf`` when it is not)."""
    cum = [0]
    for unit in events:
        cum.append(cum[-1] + numels[unit])
    nxt: dict[int, int] = {}
    dist = [math.inf] * len(events)
    for pos in range(len(events) - 1, -1, -1):
        j = nxt.get(events[pos])
        if j is not None:
            dist[pos] = cum[j] - cum[pos + 1]
        nxt[events[pos]] = pos
    return dist


class FetchPlanner:
    """The recorded trace, the current pass's fetches, and the decisions along them."""

    def __init__(self, numels: Sequence[int], prefetch_numel: int, max_reuse: float):
        self.numels = list(numels)
        self.prefetch_numel = prefetch_numel
        self.max_reuse = max_reuse
        self.trace: list[int] | None = None
        self.distances: list[float] = []
        self.events: list[int] = []
        self.on_trace = False
        self.last_pos: dict[int, int] = {}

    def begin_pass(self) -> None:
        self.events = []
        self.last_pos = {}
        self.on_trace = self.trace is not None

    def record(self, unit: int) -> bool:
        """Note a fetch of ``unit``; False when this fetch leaves the trace (first time)."""
        pos = len(self.events)
        self.events.append(unit)
        self.last_pos[unit] = pos
        if self.on_trace and (pos >= len(self.trace) or self.trace[pos] != unit):
            self.on_trace = False
            return False
        return True

    def end_pass(self) -> None:
        """The pass is complete: it becomes the trace unless it followed the trace exactly."""
        if self.on_trace and self.trace is not None and len(self.events) == len(self.trace):
            return
        if self.trace != self.events:
            self.trace = list(self.events)
            self.distances = reuse_distances(self.trace, self.numels)

    def prefetch(
        self, fits: Callable[[int], bool], released: Callable[[int], bool]
    ) -> Iterator[int]:
        """Units to start gathering now, in trace order after the latest fetch.

        ``released(u)``: the unit is neither gathered nor in flight; ``fits(u)``: gathering it
        keeps the live bound. Lazy, so the caller gathers each unit before the next is
        judged. The walk stops at the first unit over the budget or over the bound.
        """
        if not self.on_trace or self.prefetch_numel <= 0:
            return
        budget = self.prefetch_numel
        for unit in self.trace[len(self.events) :]:
            budget -= self.numels[unit]
            if budget < 0:
                return
            if released(unit):
                if not fits(unit):
                    return
                yield unit

    def keep_after_use(self, unit: int) -> bool:
        """Keep ``unit`` gathered after its module returned: it is used again soon."""
        if not self.on_trace:
            return False
        pos = self.last_pos.get(unit, -1)
        return 0 <= pos < len(self.distances) and self.distances[pos] <= self.max_reuse
