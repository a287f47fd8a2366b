"""ZeRO-Infinity's parameter tier: stage 3's parameter shards in swap files between uses.

`SwappedShardStore` stands where `param_offload.ShardStore` does under ``offload_param:
{device: nvme}``: one swap key per unit (group of the stage-3 layout), read when the unit is
gathered and written when its shard changes (after the optimizer step, a GatheredParameters
write-back, a checkpoint load). Reads happen where the coordinator starts a unit's gather, so
they run as far ahead of use as its prefetch plans; writes are written behind: each takes a
private aligned copy of the new shard and at most ``buffer_count`` of them are in flight (the
oldest is waited for before another starts), so memory holds a bounded number of shards
whatever the model's size.

Nothing reads the swapped values by accident: the store's ``data`` is an empty tensor (it
only carries the dtype), and `shards` refuses; code that needs a shard asks `read_shard` for
a copy and gives changes back through `write_from`.
"""

from __future__ import annotations

import collections

import torch

from runtime.errors import UsageError
from runtime.zero.nvme.swapper import Pending, Swapper, aligned_buffer
from runtime.zero.partition import FlatGroup, FlatLayout

__all__ = ["SwappedShardStore"]


class SwappedShardStore:
    """This rank's shard of every group of `layout`, kept in `swapper`'s files."""

    swapped = True
    offload = True

    def __init__(
        self,
        layout: FlatLayout,
        rank: int,
        dtype: torch.dtype,
        compute_device: torch.device,
        swapper: Swapper,
        *,
        tag: str,
        buffer_count: int,
        owns_swapper: bool,
    ) -> None:
        self.layout = layout
        self.rank = rank
        self.compute_device = torch.device(compute_device)
        self.swapper = swapper
        self.data = torch.empty(0, dtype=dtype)  # the dtype; the values are in the files
        self._tag = tag
        self._owns = owns_swapper
        self._limit = max(1, buffer_count)
        self._writes: collections.deque[Pending] = collections.deque()
        for g in layout.groups:
            # A disk too small for the model stops the job here, at setup.
            swapper.allocate(self._key(g), g.shard_numel * self.data.element_size())

    def _key(self, g: FlatGroup) -> str:
        return f"{self._tag}.{g.index}"

    def shard(self, g: FlatGroup) -> torch.Tensor:
        raise UsageError(
            "the parameter shards are in swap files (offload_param.device nvme): read them "
            "with read_shard and store changes with write_from"
        )

    def shards(self, rank: int) -> list[torch.Tensor]:
        return [self.shard(g) for g in self.layout.groups]

    def read_shard(self, g: FlatGroup) -> torch.Tensor:
        """A copy of the group's shard, read from its file (changes count only once given
        to `write_from`)."""
        out = torch.frombuffer(
            aligned_buffer(g.shard_numel * self.data.element_size()),
            dtype=self.data.dtype,
            count=g.shard_numel,
        )
        self.swapper.read(self._key(g), out).wait()
        return out

    def load_into(self, g: FlatGroup, dst: torch.Tensor) -> None:
        """Read the group's shard into ``dst`` (for an all-gather), after any write of it."""
        if dst.device.type == "cpu" and dst.dtype == self.data.dtype and dst.is_contiguous():
            self.swapper.read(self._key(g), dst).wait()
        else:
            dst.copy_(self.read_shard(g))

    def write_from(self, g: FlatGroup, src: torch.Tensor) -> None:
        """Store ``src`` as the group's shard: copied now, written behind."""
        buf = torch.frombuffer(
            aligned_buffer(g.shard_numel * self.data.element_size()),
            dtype=self.data.dtype,
            count=g.shard_numel,
        )
        buf.copy_(src.reshape(-1))
        while self._writes and self._writes[0].done():
            self._writes.popleft().wait()
        while len(self._writes) >= self._limit:
            self._writes.popleft().wait()
        self._writes.append(self.swapper.write(self._key(g), buf))

    def flush(self) -> None:
        """Wait for the writes behind; a failed one raises here (the step that made it)."""
        while self._writes:
            self._writes.popleft().wait()

    @property
    def nbytes(self) -> int:
        """Bytes of shard values held in memory between uses: none."""
        return 0

    def close(self) -> None:
        """Finish the writes and, for the store that opened the swapper, remove its files."""
        try:
            self.flush()
        finally:
            if self._owns:
                self.swapper.close()
