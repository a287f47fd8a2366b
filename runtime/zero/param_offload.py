"""Where stage 3 keeps each rank's parameter shards between uses.

All shards a rank owns live in ONE flat tensor (`ShardStore.data`), one contiguous range per
group of the stage-3 `FlatLayout` (`shards(rank)` gives the per-group views, the same shape of
object `zero.optimizer.ZeroOptimizer` steps for stages 1-2). With ``offload_param: {device:
cpu}`` the store sits in (optionally pinned) CPU memory and a shard is copied to the compute
device only to be all-gathered; on a CPU-only machine the two places coincide and the copy is
the all-gather's own input.
"""

from __future__ import annotations

import torch

from .partition import FlatGroup, FlatLayout

__all__ = ["ShardStore"]


class ShardStore:
    swapped = False
    """The shards are in memory (`nvme.SwappedShardStore` keeps them in swap files)."""

    def __init__(
        self,
        layout: FlatLayout,
        rank: int,
        dtype: torch.dtype,
        compute_device: torch.device,
        *,
        offload: bool = False,
        pin_memory: bool = False,
    ):
        self.layout = layout
        self.rank = rank
        self.offload = offload
        self.compute_device = torch.device(compute_device)
        device = torch.device("cpu") if offload else self.compute_device
        # Pinning only pays (and only works) with an accelerator to copy to.
        pin = offload and pin_memory and torch.cuda.is_available()
        self.data = torch.zeros(layout.shard_numel, dtype=dtype, device=device, pin_memory=pin)
        self._views: list[torch.Tensor] = []
        off = 0
        for g in layout.groups:
            self._views.append(self.data.narrow(0, off, g.shard_numel))
            off += g.shard_numel

    def shard(self, g: FlatGroup) -> torch.Tensor:
        return self._views[g.index]

    def shards(self, rank: int) -> list[torch.Tensor]:
        if rank != self.rank:
            raise ValueError(f"this store holds rank {self.rank}'s shards, not rank {rank}'s")
        return list(self._views)

    def read_shard(self, g: FlatGroup) -> torch.Tensor:
        """The group's shard (here the stored tensor itself; changes go through `write_from`,
        which the swapped store needs)."""
        return self._views[g.index]

    def flush(self) -> None:
        """Nothing is written behind here."""

    def close(self) -> None:
        """Nothing to release but memory."""

    def load_into(self, g: FlatGroup, dst: torch.Tensor) -> None:
        """Copy the group's shard into ``dst`` (on the compute device) for an all-gather."""
        dst.copy_(self._views[g.index], non_blocking=self.offload)

    def write_from(self, g: FlatGroup, src: torch.Tensor) -> None:
        """Store ``src`` (this rank's chunk of the group, any device) as the group's shard."""
        self._views[g.index].copy_(src)

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()
