"""Flat tensors laid out by a `FlatLayout`, and parameters re-pointed into them.

A `FlatBuffer` is one contiguous allocation holding every group of a layout; group, shard and
per-parameter views are cheap slices of it. Parameters (and, for stages 0/1, gradients) live
*inside* such a buffer, so collectives run on contiguous memory with no copies in or out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .partition import FlatGroup, FlatLayout, ParamSlot

__all__ = ["FlatBuffer", "flatten_params_into", "group_shard_views"]


class FlatBuffer:
    def __init__(self, layout: FlatLayout, dtype: torch.dtype, device, *, pin: bool = False):
        self.layout = layout
        self.data = torch.zeros(layout.total_numel, dtype=dtype, device=device, pin_memory=pin)

    def group(self, g: FlatGroup) -> torch.Tensor:
        return self.data.narrow(0, g.start, g.padded_numel)

    def shard(self, g: FlatGroup, rank: int) -> torch.Tensor:
        lo, _ = g.shard_range(rank)
        return self.data.narrow(0, g.start + lo, g.shard_numel)

    def param_view(self, g: FlatGroup, slot: ParamSlot) -> torch.Tensor:
        return self.data.narrow(0, g.start + slot.offset, slot.numel).view(slot.shape)

    def shards(self, rank: int) -> list[torch.Tensor]:
        return [self.shard(g, rank) for g in self.layout.groups]

    def groups(self) -> list[torch.Tensor]:
        return [self.group(g) for g in self.layout.groups]


def flatten_params_into(
    buffer: FlatBuffer, params_by_group: Sequence[Sequence[torch.nn.Parameter]]
) -> None:
    """Copy each parameter into its slot and make ``param.data`` a view of that slot."""
    with torch.no_grad():
        for g, params in zip(buffer.layout.groups, params_by_group, strict=True):
            for slot, p in zip(g.slots, params, strict=True):
                view = buffer.param_view(g, slot)
                view.copy_(p.data)
                p.data = view


def group_shard_views(shard: torch.Tensor, layout) -> list[torch.Tensor]:
    """Views of this rank's flat shard, one per group of ``layout`` (groups back to back)."""
    views, off = [], 0
    for g in layout.groups:
        views.append(shard.narrow(0, off, g.shard_numel))
        off += g.shard_numel
    return views
