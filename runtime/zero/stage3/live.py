"""Stage 3's gathered units: fetch (with prefetch), all-gather and release under the live bound.

`LiveUnits` is the one place a unit is gathered or released during training. A fetch is
recorded in the pass's trace and launches the prefetch the planner suggests (`prefetch`);
a pass leaving the trace makes every rank check its collectives pair up (`sequence`),
and is said once in the log. It keeps count
of the elements gathered (``stage3_max_live_parameters`` bounds them: idle units kept for reuse
are released, least recently fetched first, to make room), knows which gathered buffer a
tensor lives in (saved tensors are tagged with their unit by it), and which optimizer step a
buffer's values come from: a unit gathered before the last step is gathered again before use,
so no forward ever computes with old weights.
"""

from __future__ import annotations

import logging

import torch

from runtime.distributed import Communicator

from .fetch import UnitFetch
from .prefetch import FetchPlanner
from .sequence import CollectiveSequence
from .units import Unit, UnitState

__all__ = ["LiveUnits", "SavedInUnit"]

log = logging.getLogger("runtime.zero.stage3")


class SavedInUnit:
    """A tensor autograd saved that lives in ``unit``'s gathered buffer."""

    __slots__ = ("unit", "tensor")

    def __init__(self, unit: Unit, tensor: torch.Tensor):
        self.unit = unit
        self.tensor = tensor


class LiveUnits:
    def __init__(
        self,
        units: list[Unit],
        comm: Communicator,
        planner: FetchPlanner,
        max_live: int,
        fetch: UnitFetch,
    ):
        self.sequence = CollectiveSequence(comm, units)
        """Every gather is recorded: the ranks' collectives must pair up."""
        self.units = units
        self.comm = comm
        self.planner = planner
        self.max_live = max_live
        self.numel = sum(u.numel for u in units if not u.persistent and u.gathered)
        """Elements of the non-persistent units gathered (or in flight) now."""
        self.peak_numel = self.numel
        self.version = 0
        """Optimizer steps taken: a gathered unit of an older version is stale."""
        self.fetcher = fetch
        self.passes = 0
        """Training passes begun (`begin_pass`): hpZ's secondary shards serve only the
        pass that filled them."""
        self._by_storage: dict[int, Unit] = {}
        self._warned_divergence = False

    def fits(self, numel: int) -> bool:
        return self.numel + numel <= self.max_live

    def is_current(self, u: Unit) -> bool:
        """Gathered, with the values of the last optimizer step."""
        return u.gathered and (u.version == self.version or u.persistent)

    def fetch(self, u: Unit) -> None:
        """Gather ``u`` (a fetch of the pass's trace), launch the prefetch, wait for ``u``."""
        if not self.planner.record(u.index):
            self.sequence.mark_diverged()
            if not self._warned_divergence and self.comm.rank == 0:
                log.info(
                    "stage 3: the modules ran in a different order than in the recorded trace "
                    "(fetch %d); fetching parameters on demand until the order is stable again",
                    len(self.planner.events) - 1,
                )
            self._warned_divergence = True
        self.gather(u)
        for i in self.planner.prefetch(
            fits=lambda i: self.fits(self.units[i].numel),
            released=lambda i: self.units[i].state is UnitState.RELEASED,
        ):
            self.gather(self.units[i])
        u.wait()

    def begin_pass(self) -> None:
        self.passes += 1

    def _how(self, exact: bool) -> dict:
        return {
            "exact": exact,
            "pass_id": self.passes,
            "version": self.version,
        }

    def gather(self, u: Unit, exact: bool = False) -> None:
        """Start the gather of a released or stale unit (the caller waits on the unit);
        ``exact``: also of a unit whose gathered values are quantized (qwZ)."""
        if u.state is UnitState.RELEASED:
            self._make_room(u.numel)
            self.sequence.record("fetch", u)
            u.start_gather(self.fetcher, **self._how(exact))
            u.version = self.version
            self._by_storage[u.full.untyped_storage().data_ptr()] = u
            self.numel += u.numel
            self.peak_numel = max(self.peak_numel, self.numel)
        elif not u.persistent and (u.version != self.version or (exact and not u.exact)):
            u.wait()
            self.sequence.record("fetch", u)
            u.regather(self.fetcher, **self._how(exact))
            u.version = self.version

    def release(self, u: Unit) -> None:
        if u.persistent or u.state is UnitState.RELEASED:
            return
        self._by_storage.pop(u.full.untyped_storage().data_ptr(), None)
        u.release()
        self.numel -= u.numel

    def release_all(self) -> None:
        """Release every unit no module or GatheredParameters context is using."""
        for u in self.units:
            if u.users == 0:
                self.release(u)

    def _make_room(self, numel: int) -> None:
        """Release kept (idle) units, oldest first, until ``numel`` more fits the live bound."""
        if self.fits(numel):
            return
        idle = [
            u
            for u in self.units
            if not u.persistent and u.gathered and u.users == 0 and not u.bwd_hold
        ]
        for u in sorted(idle, key=lambda v: self.planner.last_pos.get(v.index, -1)):
            if self.fits(numel):
                break
            self.release(u)

    def tag_saved(self, t: torch.Tensor):
        """What autograd keeps of ``t``: tagged with its unit when it lives in a gathered
        buffer (weights, or views such as ``weight.t()``), so backward can fetch it again."""
        try:
            unit = self._by_storage.get(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):
            return t
        return t if unit is None else SavedInUnit(unit, t)

    def after_step(self) -> None:
        """The shards changed: drop stale gathered copies, refresh the persistent units."""
        self.version += 1
        for u in self.units:
            if u.persistent:
                lo, hi = u.group.shard_range(self.comm.rank)
                own = u.full[lo:hi]
                u.store.load_into(u.group, own)
                self.comm.all_gather(u.full, own)
                u.version = self.version
            elif u.users == 0:
                self.release(u)
