"""The stage-3 optimizer step: stage 1-2's `ZeroOptimizer`, stepped in sub-groups.

Each rank steps the shards it owns, exactly as stages 1-2 do (same master weights, clipping on
the global norm decided by one all-reduce, same fused optimizers). Two differences:

* ``sub_group_size``: the step runs over consecutive groups of at most that many elements at a
  time, so the fp32 gradient copies a 16-bit run makes exist for one sub-group only;
* no all-gather after the step: parameters are fetched when modules run. Only the small
  persistent units are re-gathered (`Stage3Coordinator.after_step`).
"""

from __future__ import annotations

from ..optimizer import StepOutcome, ZeroOptimizer
from .sequence import SEAT

__all__ = ["Stage3Optimizer", "plan_sub_groups"]


def plan_sub_groups(sizes: list[int], limit: int) -> list[list[int]]:
    """Consecutive indices whose sizes sum to at most ``limit`` (a larger one stands alone)."""
    out: list[list[int]] = []
    used = 0
    for i, n in enumerate(sizes):
        if out and used + n <= limit:
            out[-1].append(i)
            used += n
        else:
            out.append([i])
            used = n
    return out


class Stage3Optimizer(ZeroOptimizer):
    def __init__(self, *, sub_group_size: int, **kwargs):
        super().__init__(**kwargs)
        # Sized by the layout's shards, not by the masters: under NVMe offload the masters are
        # empty placeholders by now, and sizes of 0 would put every group in one sub-group
        # (the whole optimizer state in memory at once).
        sizes = [g.shard_numel for g in self.layout.groups]
        self.sub_groups = plan_sub_groups(sizes, sub_group_size)

    def step(self) -> StepOutcome:
        grads = self.reducer.owned_grads()
        # The last pass's collective-sequence check rides in the gradient check's all-reduce,
        # and is settled before anything is applied (a mismatch raises here).
        sequence = self.reducer.sequence
        if self.riders is not None and self.norm_scope is None:
            sequence.board(self.riders)
        clipping = self._check_and_clip(grads, partitioned=True)
        sequence.settle(self.riders.take_sums(SEAT) if self.riders is not None else None)
        if clipping is None:
            return StepOutcome(True, None)
        norm, coef = clipping.norm, clipping.coef
        if self.swap is not None:
            self.swap.run(self.sub_groups, lambda c: self._update(grads, c, coef))
        else:
            for chunk in self.sub_groups:
                self._update(grads, chunk, coef)
        self.params.flush()  # a failed write of a parameter shard stops this step
        self.gather_params()
        self.last_grad_norm = norm
        return StepOutcome(False, norm)

    def gather_params(self) -> None:
        self.reducer.after_step()

    def reload_master(self, unit) -> None:
        """``unit``'s shard was overwritten (GatheredParameters with a modifier rank): copy it
        into the fp32 master where the master is a copy, not a view of the shard."""
        if not self.masters_are_views and not unit.frozen:
            with self.resident([unit.index]):
                self.master[unit.index].copy_(unit.store.read_shard(unit.group))
