"""Gradient reduction in buckets, overlapped with backward.

Each group of the flat layout is one bucket. A post-accumulate-grad hook counts the group's
parameters; when a group is complete its collective is launched asynchronously, so the
reduction of late layers runs while autograd computes early ones. Groups are launched strictly
in layout order, so every rank issues the same collectives in the same order even when
gradients arrive in a different order (unused parameters, data-dependent graphs); groups still
incomplete when backward returns are flushed by `finish()`.

Modes:

* ``ALL_REDUCE`` (stage 0): gradients accumulate in place in a flat buffer (``param.grad`` are
  views of it, as DDP's ``gradient_as_bucket_view``); at the accumulation boundary each group
  is all-reduced in place.
* ``SCATTER_AT_BOUNDARY`` (stage 1): same flat gradient buffer; at the boundary each group is
  reduce-scattered, each rank keeping the sum of its own shard (written into that shard's place
  in the flat buffer).
* ``SCATTER_EVERY_MICRO_STEP`` (stage 2): only this rank's shard of the gradients is kept. As a
  gradient is produced it is copied into a group-sized staging buffer (``param.grad`` is freed at
  once); a full staging buffer is reduce-scattered and added into the owned shard. One staging
  buffer, or two with ``overlap_comm`` so one fills while the other is in flight (with one,
  the reduce-scatter still runs in the background until the buffer is needed again).

On gloo each in-flight reduce-scatter also needs a receive buffer of the bucket's size (see
runtime.distributed.comm), so the bucket memory is ``buffers x max group bytes`` for staging plus the same
again for receiving (stage 2), or just the receive buffers (stage 1).

With a wire dtype other than the gradients' (``communication_data_type``, see
runtime.zero.reduction) the staging and receive buffers are in the wire dtype: stage 2's hooks
cast as they copy, stage 1 casts each group into a staging buffer at the boundary, stage 0
all-reduces a wire-dtype copy of each group and casts the sum back. The reduced shard stays in
the gradients' dtype. ``post_factor`` (DeepSpeed's ``gradient_predivide_factor``) multiplies
the reduced gradients once the boundary's reduction is complete.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

import torch

from runtime.distributed import Communicator, Handle

from .flat import FlatBuffer, group_shard_views
from .partition import FlatLayout

__all__ = ["ReduceMode", "GradReducer"]

log = logging.getLogger(__name__)


class ReduceMode(enum.Enum):
    ALL_REDUCE = "all_reduce"
    SCATTER_AT_BOUNDARY = "scatter_at_boundary"
    SCATTER_EVERY_MICRO_STEP = "scatter_every_micro_step"


@dataclass
class _Bucket:
    """A reusable staging (stage 2) and/or receive (gloo) buffer."""

    staging: torch.Tensor | None
    scratch: torch.Tensor | None
    filling: int | None = None
    handle: Handle | None = None

    def wait(self) -> None:
        if self.handle is not None:
            self.handle.wait()
            self.handle = None


class GradReducer:
    def __init__(
        self,
        layout: FlatLayout,
        params_by_group: list[list[torch.nn.Parameter]],
        comm: Communicator,
        mode: ReduceMode,
        grad_dtype: torch.dtype,
        device: torch.device,
        overlap: bool,
        *,
        wire_dtype: torch.dtype | None = None,
        post_factor: float = 1.0,
    ):
        self.layout = layout
        self.comm = comm
        self.mode = mode
        self.overlap = overlap
        self._params = params_by_group
        self._dtype = grad_dtype
        self._wire = wire_dtype if wire_dtype is not None else grad_dtype
        self._casts = self._wire != grad_dtype
        self._post_factor = float(post_factor)
        self._boundary = False
        self._copy_back: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._device = device
        self._groups = layout.groups
        rank = comm.rank
        self.grads: FlatBuffer | None = None
        self.grad_shard: torch.Tensor | None = None
        if mode is ReduceMode.SCATTER_EVERY_MICRO_STEP:
            self.grad_shard = torch.zeros(layout.shard_numel, dtype=grad_dtype, device=device)
            self._owned = group_shard_views(self.grad_shard, layout)
        else:
            self.grads = FlatBuffer(layout, grad_dtype, device)
            self._views = [[self.grads.param_view(g, s) for s in g.slots] for g in self._groups]
            for views, params in zip(self._views, params_by_group, strict=True):
                for v, p in zip(views, params, strict=True):
                    p.grad = v
            if mode is ReduceMode.ALL_REDUCE:
                self._owned = self.grads.groups()
            else:
                self._owned = self.grads.shards(rank)

        n_buffers = 2 if overlap else 1
        self._buckets: list[_Bucket] = []
        if mode is not ReduceMode.ALL_REDUCE:
            need_scratch = comm.needs_reduce_scatter_scratch
            # Stage 1 stages a wire-dtype copy of each group when the dtypes differ.
            staging = mode is ReduceMode.SCATTER_EVERY_MICRO_STEP or self._casts
            if staging or need_scratch:
                self._buckets = [self._new_bucket(staging, need_scratch) for _ in range(n_buffers)]
        self._assigned: dict[int, _Bucket] = {}
        self._round_robin = 0
        self._warned_extra = False
        self._handles: list[Handle] = []
        self._active = False
        self._reset_counters()
        self._hook_handles = []
        for gi, params in enumerate(params_by_group):
            for si, p in enumerate(params):
                self._hook_handles.append(
                    p.register_post_accumulate_grad_hook(self._make_hook(gi, si))
                )

    # ---------------------------------------------------------------- public
    def prepare(self, boundary: bool) -> None:
        """Called before each backward: reduce in this backward or only accumulate locally."""
        self._active = boundary or self.mode is ReduceMode.SCATTER_EVERY_MICRO_STEP
        self._boundary = boundary

    def finish(self) -> None:
        """After backward: launch every group not launched yet (in order), then wait for all."""
        if not self._active:
            return
        stage2 = self.mode is ReduceMode.SCATTER_EVERY_MICRO_STEP
        for gi in range(self._next, len(self._groups)):
            if stage2 and self._pending[gi] > 0:
                bucket = self._bucket_for(gi)
                g = self._groups[gi]
                for si, arrived in enumerate(self._arrived[gi]):
                    if not arrived:
                        s = g.slots[si]
                        bucket.staging[s.offset : s.end].zero_()
            self._launch(gi)
        self._next = len(self._groups)
        for h in self._handles:
            h.wait()
        self._handles.clear()
        for wire, dst in self._copy_back:
            dst.copy_(wire)
        self._copy_back.clear()
        for b in self._buckets:
            b.handle = None
        if self._boundary and self._post_factor != 1.0:
            torch._foreach_mul_(self._owned, self._post_factor)
        self._reset_counters()
        self._active = False

    def owned_grads(self) -> list[torch.Tensor]:
        """Per group, the reduced gradient this rank steps with (whole group for stage 0)."""
        return self._owned

    def zero(self) -> None:
        if self.grads is not None:
            self.grads.data.zero_()
            for views, params in zip(self._views, self._params, strict=True):
                for v, p in zip(views, params, strict=True):
                    if p.grad is not v:
                        p.grad = v
        else:
            self.grad_shard.zero_()

    def bucket_bytes(self) -> int:
        """Bytes held by staging and receive buffers."""
        total = 0
        for b in self._buckets:
            for t in (b.staging, b.scratch):
                if t is not None:
                    total += t.numel() * t.element_size()
        return total

    def remove_hooks(self) -> None:
        for h in self._hook_handles:
            h.remove()
        self._hook_handles.clear()

    # ---------------------------------------------------------------- internals
    def _new_bucket(self, staging: bool, scratch: bool) -> _Bucket:
        n = self.layout.max_group_numel
        mk = lambda: torch.empty(n, dtype=self._wire, device=self._device)  # noqa: E731
        return _Bucket(mk() if staging else None, mk() if scratch else None)

    def _reset_counters(self) -> None:
        self._pending = [len(g.slots) for g in self._groups]
        self._ready = [False] * len(self._groups)
        self._next = 0
        if self.mode is ReduceMode.SCATTER_EVERY_MICRO_STEP:
            self._arrived = [[False] * len(g.slots) for g in self._groups]

    def _make_hook(self, gi: int, si: int):
        if self.mode is ReduceMode.SCATTER_EVERY_MICRO_STEP:
            slot = self._groups[gi].slots[si]

            def stage2_hook(p: torch.Tensor) -> None:
                if not self._active or p.grad is None:
                    return
                bucket = self._bucket_for(gi)
                bucket.staging[slot.offset : slot.end].copy_(p.grad.reshape(-1))
                p.grad = None
                self._arrived[gi][si] = True
                self._count(gi)

            return stage2_hook

        view = self._views[gi][si]

        def flat_hook(p: torch.Tensor) -> None:
            grad = p.grad
            if grad is not view and grad is not None:
                # Someone replaced .grad (e.g. model.zero_grad(set_to_none=True)): take the
                # fresh gradient back into the flat buffer.
                view.copy_(grad)
                p.grad = view
            if self._active:
                self._count(gi)

        return flat_hook

    def _count(self, gi: int) -> None:
        self._pending[gi] -= 1
        if self._pending[gi] == 0:
            self._ready[gi] = True
            while self._next < len(self._groups) and self._ready[self._next]:
                self._launch(self._next)
                self._next += 1

    def _bucket_for(self, gi: int) -> _Bucket:
        bucket = self._assigned.get(gi)
        if bucket is not None:
            return bucket
        free = [b for b in self._buckets if b.filling is None]
        if free:
            # Prefer a bucket whose collective is finished; else the oldest in flight.
            bucket = next((b for b in free if b.handle is None or b.handle.done), free[0])
            bucket.wait()
        else:
            if not self._warned_extra:
                log.warning(
                    "gradients arrived out of bucket order; allocating an extra bucket buffer "
                    "(order the model's parameters as used, or raise reduce_bucket_size)"
                )
                self._warned_extra = True
            bucket = self._new_bucket(True, self.comm.needs_reduce_scatter_scratch)
            self._buckets.append(bucket)
        g = self._groups[gi]
        bucket.filling = gi
        if g.padded_numel > g.numel:
            bucket.staging[g.numel : g.padded_numel].zero_()
        self._assigned[gi] = bucket
        return bucket

    def _launch(self, gi: int) -> None:
        g = self._groups[gi]
        # Always asynchronous: with one buffer (overlap_comm off) the collective still runs
        # while autograd computes, until the buffer is needed again (`_bucket_for` waits).
        async_op = True
        if self.mode is ReduceMode.ALL_REDUCE:
            if self._casts:
                wire = self._owned[gi].to(self._wire)
                self._copy_back.append((wire, self._owned[gi]))
                h = self.comm.all_reduce(wire, async_op=True)
            else:
                h = self.comm.all_reduce(self._owned[gi], async_op=True)
        elif self.mode is ReduceMode.SCATTER_AT_BOUNDARY:
            scratch = None
            bucket = None
            source = self.grads.group(g)
            if self._buckets:
                bucket = self._buckets[self._round_robin % len(self._buckets)]
                self._round_robin += 1
                bucket.wait()
                scratch = bucket.scratch
                if self._casts:
                    staged = bucket.staging[: source.numel()]
                    staged.copy_(source)
                    source = staged
            h = self.comm.reduce_scatter(
                self._owned[gi], source, scratch=scratch, async_op=async_op
            )
            if bucket is not None:
                bucket.handle = h
        else:
            bucket = self._assigned.pop(gi)
            h = self.comm.reduce_scatter(
                self._owned[gi],
                bucket.staging[: g.padded_numel],
                scratch=bucket.scratch,
                accumulate=True,
                async_op=async_op,
            )
            bucket.filling = None
            bucket.handle = h
        self._handles.append(h)
