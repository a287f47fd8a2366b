"""Stage 3's gradient reduction: each unit's gradients into this rank's shard, during backward.

As a parameter's gradient is accumulated, it is copied into its unit's staging buffer and the
parameter's ``.grad`` is dropped. When the unit has all its gradients, the staging buffer is
reduce-scattered asynchronously into this rank's gradient shard, with accumulation (at most two
reductions in flight with ``overlap_comm``, one without). A unit that gets more gradients later
in the same backward (a weight reused in a block that reentrant checkpointing recomputes
separately) starts a new partial sum, reduced the same way.

Leaf units (`leaf_modules`: mixture-of-experts layers) are never reduced on arrival: their
parameters may get no gradient on some ranks, so they are reduced at the end of backward, in
unit order on every rank, zeros standing in for what did not arrive. Partial units (parameters
without a gradient in this pass) are reduced there too.

With ``communication_data_type`` other than the gradients' dtype (runtime.zero.reduction) the
staging and receive buffers are in the wire dtype (the copy into staging casts); the shard
stays in the gradients' dtype.
"""

from __future__ import annotations

import torch

from runtime.distributed import Communicator, Handle

from ..flat import group_shard_views
from ..partition import FlatLayout
from ..quantize import BlockQuantizer
from .sequence import CollectiveSequence
from .units import Unit

__all__ = ["Stage3GradReducer"]


class Stage3GradReducer:
    def __init__(
        self,
        layout: FlatLayout,
        comm: Communicator,
        sequence: CollectiveSequence,
        grad_dtype: torch.dtype,
        device: torch.device,
        overlap_comm: bool,
        quantizer: BlockQuantizer | None = None,
        *,
        wire_dtype: torch.dtype | None = None,
    ):
        self.comm = comm
        self.wire_dtype = wire_dtype if wire_dtype is not None else grad_dtype
        self.quantizer = quantizer if comm.world_size > 1 else None
        """ZeRO++ qgZ: reduce by an all-to-all of quantized chunks (see `_reduce_quantized`)."""
        self.sequence = sequence
        self.max_inflight = 2 if overlap_comm else 0
        self.grad_shard = torch.zeros(layout.shard_numel, dtype=grad_dtype, device=device)
        self.owned = group_shard_views(self.grad_shard, layout)
        self._inflight: list[tuple[Handle, list[torch.Tensor]]] = []
        # Staging and receive buffers by size, reused within one backward (units of a repeated
        # layer have the same size) and dropped after it, so nothing stays between steps.
        self._pool: dict[int, list[torch.Tensor]] = {}

    def arrived(self, u: Unit, i: int, grad: torch.Tensor) -> bool:
        """Parameter ``i`` of ``u`` has its gradient; True when the unit was reduced."""
        if u.staging is None:
            u.staging = self._take(u.numel)
            if u.group.numel < u.numel:
                u.staging[u.group.numel :].zero_()
        slot = u.group.slots[i]
        view = u.staging[slot.offset : slot.end]
        if u.grad_arrived(i):
            view.copy_(grad.reshape(-1))
        else:
            view.add_(grad.reshape(-1))
        if u.n_arrived == u.expected_grads and u.leaf is None:
            self._reduce(u)
            return True
        return False

    def flush(self, units: list[Unit], ran_leaves: set[int]) -> None:
        """End of backward: reduce partial units and the leaves that ran, wait for all."""
        for u in units:
            ran_leaf = u.leaf is not None and u.index in ran_leaves and not u.frozen
            if (u.n_arrived > 0 and u.staging is not None) or ran_leaf:
                if u.staging is not None:
                    for i, arrived in enumerate(u.arrived):
                        if not arrived:
                            s = u.group.slots[i]
                            u.staging[s.offset : s.end].zero_()
                self._reduce(u)
        while self._inflight:
            self._wait_oldest()
        self._pool.clear()
        for u in units:
            u.reset_grads()

    def zero(self) -> None:
        self.grad_shard.zero_()

    def _take(self, numel: int) -> torch.Tensor:
        free = self._pool.get(numel)
        if free:
            return free.pop()
        return torch.empty(numel, dtype=self.wire_dtype, device=self.grad_shard.device)

    def _wait_oldest(self) -> None:
        handle, buffers = self._inflight.pop(0)
        handle.wait()
        for b in buffers:
            self._pool.setdefault(b.numel(), []).append(b)

    def _reduce(self, u: Unit) -> None:
        if u.staging is None:  # a leaf that got no gradient on this rank: it adds zeros
            u.staging = self._take(u.numel).zero_()
        staging, u.staging = u.staging, None
        u.reset_arrivals()
        self.sequence.record("reduce", u)
        if self.quantizer is not None:
            handle = self._reduce_quantized(self.owned[u.index], staging)
            self._inflight.append((handle, [staging]))
            while len(self._inflight) > self.max_inflight:
                self._wait_oldest()
            return
        scratch = self._take(u.numel) if self.comm.needs_reduce_scatter_scratch else None
        handle = self.comm.reduce_scatter(
            self.owned[u.index], staging, scratch=scratch, accumulate=True, async_op=True
        )
        self._inflight.append((handle, [b for b in (staging, scratch) if b is not None]))
        while len(self._inflight) > self.max_inflight:
            self._wait_oldest()

    def _reduce_quantized(self, owned: torch.Tensor, staging: torch.Tensor) -> Handle:
        """qgZ: ``owned += this rank's chunk of the sum of every rank's staging``, sending int8.

        Each rank cuts its staging buffer into N chunks (chunk r is rank r's part), quantizes
        every chunk blockwise, and one all-to-all delivers to each rank the N quantized copies
        of its chunk; they are dequantized and summed in fp32, this rank's own chunk taken
        exact (it never left the rank), and the sum is added to the gradient shard once.
        DeepSpeed's qgZ is the same exchange within a node (it adds a second, inter-node
        all-to-all of re-quantized partial sums; here every rank exchanges with every rank
        directly, so values are quantized once)."""
        q, n, rank = self.quantizer, self.comm.world_size, self.comm.rank
        chunk = owned.numel()
        packed = q.packed_nbytes(chunk)
        rows = staging.view(n, chunk)
        send = q.quantize(rows)
        received = torch.empty(n, packed, dtype=torch.uint8, device=staging.device)
        handle = self.comm.all_to_all(received, send, async_op=True)

        def accumulate() -> None:
            parts = q.dequantize(received, chunk)
            parts[rank].copy_(rows[rank])
            owned.add_(parts.sum(dim=0))

        return handle.followed_by(accumulate)
