"""The engine's training DataLoader: micro-batches of this rank's share of the data."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

__all__ = ["build_dataloader"]


def build_dataloader(
    dataset,
    *,
    micro_batch_size: int,
    rank: int,
    world_size: int,
    collate_fn=None,
    drop_last: bool = False,
    shuffle: bool = True,
    seed: int = 0,
    num_workers: int = 0,
    pin_memory: bool | None = None,
) -> DataLoader:
    """A DataLoader of ``micro_batch_size`` over a DistributedSampler of ``dataset``.

    Every rank sees a disjoint 1/world_size of the samples each epoch (the sampler pads by
    repeating samples when the count does not divide). Call ``loader.sampler.set_epoch(e)`` for
    a new shuffle each epoch. An IterableDataset is used as is: it must shard itself.
    """
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    if isinstance(dataset, IterableDataset):
        return DataLoader(
            dataset,
            batch_size=micro_batch_size,
            collate_fn=collate_fn,
            drop_last=drop_last,
            num_workers=num_workers,
            pin_memory=pin_memory,
        )
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
    return DataLoader(
        dataset,
        batch_size=micro_batch_size,
        sampler=sampler,
        collate_fn=collate_fn,
        drop_last=drop_last,
        num_workers=num_workers,
        pin_memory=pin_memory,
    )
