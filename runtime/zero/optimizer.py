"""The partitioned optimizer step (stages 0-2): master weights, clipping, update, all-gather.

Each rank steps only what it owns: for stage 0 every group whole, for stages 1 and 2 its shard
of every group. Master weights are one tensor per owned group range:

* fp32 without offload: a *view* of the flat parameter buffer (no copy; the parameters are the
  master weights, which is what the fp32 formulas of docs/memory-model.md count);
* mixed precision: an fp32 copy; the step's fp32 gradient is made from the 16-bit shard and
  freed after the step;
* offload: an fp32 copy in (pinned) CPU memory with a persistent CPU gradient buffer; the
  update runs there and the result is copied back into the device parameters;
* NVMe offload: as CPU offload, but the masters and their optimizer state live in swap files
  between steps (`zero.nvme.OptimizerSwap`), and the step runs chunk by chunk with the next
  chunk read ahead and the previous written behind.

After the update each rank writes its shard into the flat parameter buffer and every group is
all-gathered in place (stages 1-2), so all ranks hold the full updated parameters.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from runtime.distributed import Communicator
from runtime.optim import GradStats, Precision, StepRiders, global_grad_stats

from .buckets import GradReducer
from .flat import FlatBuffer
from .nvme import MasterStash, OptimizerSwap, Swapper
from .partition import FlatGroup

__all__ = ["NormScope", "OwnedRange", "StepOutcome", "ZeroOptimizer"]


@dataclass(frozen=True)
class StepOutcome:
    skipped: bool
    grad_norm: float | None
    """Global gradient norm before clipping (unscaled); None when the step overflowed."""


@dataclass(frozen=True)
class OwnedRange:
    """Elements ``[lo, hi)`` of a flat group, held by this rank's master tensor ``master``."""

    group: FlatGroup
    lo: int
    hi: int
    master: torch.Tensor


@dataclass(frozen=True)
class NormScope:
    """The gradient norm of a model-parallel layout (runtime.engine.model_parallel): per owned
    gradient tensor, the (offset, numel) ranges this rank counts, and the group whose ranks'
    counted squares add up to the whole model's."""

    comm: Communicator
    counted: tuple[tuple[tuple[int, int], ...], ...]

    def stats(self, grads: list[torch.Tensor]) -> GradStats:
        """Squared norm and overflow over the whole model, with one all-reduce."""
        parts = [
            g.narrow(0, off, n)
            for g, ranges in zip(grads, self.counted, strict=True)
            for off, n in ranges
        ]
        sq = torch.zeros((), dtype=torch.float64, device=grads[0].device if grads else "cpu")
        if parts:
            norms = torch.stack([torch.linalg.vector_norm(p, dtype=torch.float32) for p in parts])
            sq = norms.double().square().sum()
        # Overflow anywhere in what this rank owns, counted or not.
        flag = torch.zeros((), dtype=torch.float64, device=sq.device)
        for g in grads:
            flag = flag + (~torch.isfinite(torch.linalg.vector_norm(g, dtype=torch.float32)))
        packed = torch.stack([sq, flag.double()])
        self.comm.all_reduce(packed)
        sq_norm, flagged = packed.tolist()
        return GradStats(sq_norm, flagged > 0 or not math.isfinite(sq_norm))


@dataclass(frozen=True)
class _Clipping:
    norm: float
    """Global gradient norm before clipping (unscaled)."""
    coef: float
    """What the (loss-scaled) gradients are multiplied by: unscale and clip in one."""


class ZeroOptimizer:
    """Owns the master weights of this rank and the wrapped torch optimizer.

    ``optimizer`` is the torch optimizer over the master tensors (schedulers attach to it);
    ``param_groups`` and ``state`` are its own.
    """

    def __init__(
        self,
        *,
        params: FlatBuffer,
        reducer: GradReducer,
        comm: Communicator,
        precision: Precision,
        partitioned: bool,
        offload: bool,
        pin_memory: bool,
        clip: float,
        make_optimizer: Callable[[list[dict]], torch.optim.Optimizer],
        group_options: list[dict],
        norm_scope: NormScope | None = None,
        riders: StepRiders | None = None,
        open_swapper: Callable[[], Swapper] | None = None,
    ):
        self.layout = params.layout
        self.params = params
        self.reducer = reducer
        self.comm = comm
        self.precision = precision
        self.partitioned = partitioned
        self.offload = offload
        self.clip = clip
        self.norm_scope = norm_scope
        self.riders = riders
        """The step metrics' numbers, sent with the norm's all-reduce (not under a
        model-parallel norm scope, whose group is not the data-parallel one)."""
        rank = comm.rank
        # Parameter shards in swap files (stage 3, offload_param nvme) are no tensors to
        # view: the masters are copies, read from and written to the store per group.
        self._swapped_params = bool(getattr(params, "swapped", False))
        self._sources = (
            None
            if self._swapped_params
            else params.shards(rank)
            if partitioned
            else params.groups()
        )
        self.masters_are_views = not (precision.mixed or offload or self._swapped_params)
        pin = offload and pin_memory and torch.cuda.is_available()
        master_device = torch.device("cpu") if offload else params.data.device
        swapper = open_swapper() if open_swapper is not None else None
        stash = MasterStash(swapper) if swapper is not None else None
        if self.masters_are_views:
            self.master = list(self._sources)
        else:
            self.master = []
            for i in range(len(self.layout.groups)):
                s = self._source(i)
                m = torch.empty(
                    s.numel(), dtype=torch.float32, device=master_device, pin_memory=pin
                )
                m.copy_(s)
                self.master.append(stash.add(m) if stash is not None else m)
        # Under NVMe offload a step's gradients are copied per chunk: a persistent buffer
        # would keep 4 bytes per parameter in memory, the cost the swap files exist to avoid.
        self._grad_buffers = (
            [torch.zeros_like(m, pin_memory=pin) for m in self.master]
            if offload and open_swapper is None
            else None
        )
        groups = []
        for pg, options in enumerate(group_options):
            tensors = [
                m
                for m, g in zip(self.master, self.layout.groups, strict=True)
                if g.param_group == pg
            ]
            groups.append({**options, "params": tensors})
        self.optimizer = make_optimizer(groups)
        self.last_grad_norm: float | None = None
        self.swap: OptimizerSwap | None = None
        if swapper is not None:
            self.swap = OptimizerSwap(swapper, self.master, self.optimizer, stash)

    def _source(self, i: int) -> torch.Tensor:
        """The parameter values master ``i`` holds (a copy when they are swapped)."""
        if self._swapped_params:
            return self.params.read_shard(self.layout.groups[i])
        return self._sources[i]

    def _set_source(self, i: int, value: torch.Tensor) -> None:
        if self._swapped_params:
            self.params.write_from(self.layout.groups[i], value)
        else:
            self._sources[i].copy_(value, non_blocking=True)

    def resident(self, indices: Iterable[int] | None = None):
        """A context in which the masters at ``indices`` (all by default) and their optimizer
        state are in memory (NVMe offload swaps them in, and out after); a no-op otherwise."""
        if self.swap is None:
            return contextlib.nullcontext()
        return self.swap.resident(indices)

    def close(self) -> None:
        """Release the swap files (NVMe offload)."""
        if self.swap is not None:
            self.swap.close()
        if self._swapped_params:
            self.params.close()

    # torch.optim.Optimizer look-alikes ----------------------------------------------------
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def loss_scale(self) -> float:
        return self.precision.loss_scale

    cur_scale = loss_scale

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 - torch signature
        self.reducer.zero()

    def state_dict(self) -> dict:
        if self.swap is None:
            return self.optimizer.state_dict()
        with self.resident():  # a copy: the swapped tensors are released after
            return _cloned(self.optimizer.state_dict())

    @property
    def kind(self) -> str:
        """The torch optimizer's class name (a checkpoint's state is only that class's)."""
        return type(self.optimizer).__name__

    def owned_ranges(self) -> list[OwnedRange]:
        """Each master tensor with the range of its group it holds (its shard when
        partitioned, the whole padded group otherwise)."""
        out = []
        for g, master in zip(self.layout.groups, self.master, strict=True):
            lo, hi = g.shard_range(self.comm.rank) if self.partitioned else (0, g.padded_numel)
            out.append(OwnedRange(g, lo, hi, master))
        return out

    def load_state_dict(self, state: dict) -> None:
        with self.resident():
            self.optimizer.load_state_dict(state)

    # the step -------------------------------------------------------------------------------
    def _check_and_clip(self, grads: list[torch.Tensor], partitioned: bool) -> _Clipping | None:
        """The global gradient norm and the unscale-and-clip coefficient (one all-reduce), or
        None when a gradient is not finite and the precision skips such steps."""
        if self.norm_scope is not None:
            stats = self.norm_scope.stats(grads)
        else:
            stats = global_grad_stats(grads, self.comm, partitioned, self.riders)
        if stats.nonfinite and self.precision.skips_on_overflow:
            self.last_grad_norm = None
            return None
        scale = self.precision.loss_scale
        norm = math.sqrt(stats.sq_norm) / scale
        coef = 1.0 / scale
        if self.clip > 0:
            coef *= min(1.0, self.clip / (norm + 1e-6))
        return _Clipping(norm, coef)

    def _master_grads(self, grads: list[torch.Tensor], indices) -> list[torch.Tensor]:
        """The fp32 gradients of the masters at ``indices``, scaled by the caller."""
        if self.masters_are_views:
            return [grads[i] for i in indices]
        if self.swap is not None:
            return [grads[i].to("cpu", torch.float32, copy=True) for i in indices]
        if self.offload:
            master_grads = [self._grad_buffers[i] for i in indices]
            for i, buf in zip(indices, master_grads, strict=True):
                buf.copy_(grads[i], non_blocking=True)
            if master_grads and master_grads[0].is_pinned():
                # The CPU optimizer reads them next: wait for these copies (an event after
                # them on this stream), not for every stream of the device.
                copied = torch.cuda.Event()
                copied.record()
                copied.synchronize()
            return master_grads
        return [grads[i].float() for i in indices]

    def step(self) -> StepOutcome:
        """Check, clip and apply the reduced gradients; gather the updated parameters."""
        grads = self.reducer.owned_grads()
        clipping = self._check_and_clip(grads, self.partitioned)
        if clipping is None:
            return StepOutcome(True, None)
        norm, coef = clipping.norm, clipping.coef
        if self.swap is not None:
            self.swap.run([[i] for i in range(len(grads))], lambda c: self._update(grads, c, coef))
        else:
            self._update(grads, range(len(grads)), coef)
        self.gather_params()
        self.last_grad_norm = norm
        return StepOutcome(False, norm)

    def _update(self, grads: list[torch.Tensor], indices, coef: float) -> None:
        """Apply the gradients of the masters at ``indices`` and write the results into the
        parameters' shards."""
        indices = list(indices)
        masters = [self.master[i] for i in indices]
        master_grads = self._master_grads(grads, indices)
        if coef != 1.0:
            torch._foreach_mul_(master_grads, coef)
        for m, g in zip(masters, master_grads, strict=True):
            m.grad = g
        self.optimizer.step()
        for m in masters:
            m.grad = None
        if not self.masters_are_views:
            for i in indices:
                self._set_source(i, self.master[i])

    def gather_params(self) -> None:
        """All-gather every group in place so each rank holds the full parameters."""
        if not self.partitioned or self.comm.world_size == 1:
            return
        rank = self.comm.rank
        handles = [
            self.comm.all_gather(self.params.group(g), self.params.shard(g, rank), async_op=True)
            for g in self.layout.groups
        ]
        for h in handles:
            h.wait()

    @torch.no_grad()
    def full_master(self, index: int) -> torch.Tensor:
        """Group ``index``'s whole fp32 master (padded), a new tensor; gathered from every
        rank's shard when partitioned, so a collective then: call it on every rank."""
        g = self.layout.groups[index]
        with self.resident([index]):
            master = self.master[index]
            if not self.partitioned:
                return master.to(torch.float32, copy=True)
            full = torch.empty(g.padded_numel, dtype=torch.float32, device=self.comm_device)
            lo, hi = g.shard_range(self.comm.rank)
            own = full[lo:hi]
            own.copy_(master)
        self.comm.all_gather(full, own)
        return full

    @property
    def comm_device(self) -> torch.device:
        """Where this optimizer's collectives run: where the parameters are computed with
        (stage 3's store says so; a flat buffer is there)."""
        compute = getattr(self.params, "compute_device", None)
        return compute if compute is not None else self.params.data.device

    @torch.no_grad()
    def reload_master_range(self, index: int, lo: int, hi: int) -> None:
        """Elements ``[lo, hi)`` of group ``index``'s parameters were overwritten (a
        GatheredParameters write with a modifier rank): copy what this rank owns of them into
        its master, where the master is a copy and not a view of the parameters."""
        if self.masters_are_views:
            return
        g = self.layout.groups[index]
        own_lo, own_hi = g.shard_range(self.comm.rank) if self.partitioned else (0, g.padded_numel)
        a, b = max(lo, own_lo), min(hi, own_hi)
        if a >= b:
            return
        with self.resident([index]):
            # The source holds exactly the owned range (the shard, or the whole group).
            values = self._source(index)
            self.master[index][a - own_lo : b - own_lo].copy_(values[a - own_lo : b - own_lo])

    @torch.no_grad()
    def refresh_params_from_master(self) -> None:
        """Write the master weights into the parameters and gather them on every rank (after
        the masters were replaced, e.g. by a checkpoint load)."""
        if not self.masters_are_views:
            with self.resident():
                for i, m in enumerate(self.master):
                    self._set_source(i, m)
            if self._swapped_params:
                self.params.flush()
        self.gather_params()


def _cloned(value):
    if torch.is_tensor(value):
        return value.clone()
    if isinstance(value, dict):
        return {k: _cloned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cloned(v) for v in value]
    return value
