"""Model-parallel x data-parallel process groups with Megatron's ``mpu`` interface.

``runtime.initialize(mpu=...)`` takes any object with Megatron's six calls
(``get_model_parallel_group/rank/world_size``, ``get_data_parallel_group/rank/world_size``);
`ModelParallelGroups` is one, for scripts that have no Megatron. Its layout is Megatron's:
model-parallel groups are runs of consecutive ranks (the ranks of one node talk most), and
data-parallel groups take one rank from each of them::

    world 4, model parallel 2:   MP groups [0, 1], [2, 3]    DP groups [0, 2], [1, 3]

Every rank must build it, in the same order (creating a group is a collective).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from runtime.errors import InvalidTypeError, InvalidValueError

__all__ = ["ModelParallelGroups", "layout", "check_mpu"]

_MPU_CALLS = (
    "get_model_parallel_group",
    "get_model_parallel_rank",
    "get_model_parallel_world_size",
    "get_data_parallel_group",
    "get_data_parallel_rank",
    "get_data_parallel_world_size",
)


def layout(world_size: int, model_parallel_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """(model-parallel groups, data-parallel groups) as lists of global ranks (pure)."""
    if model_parallel_size < 1 or world_size % model_parallel_size:
        raise InvalidValueError(
            f"model_parallel_size {model_parallel_size} must divide the world size {world_size}"
        )
    mp = model_parallel_size
    mp_groups = [list(range(s, s + mp)) for s in range(0, world_size, mp)]
    dp_groups = [list(range(r, world_size, mp)) for r in range(mp)]
    return mp_groups, dp_groups


class ModelParallelGroups:
    """Megatron's mpu over the current world, tensor-parallel size ``model_parallel_size``."""

    def __init__(self, model_parallel_size: int):
        world, rank = dist.get_world_size(), dist.get_rank()
        mp_groups, dp_groups = layout(world, model_parallel_size)
        self._mp = self._dp = None
        for ranks in mp_groups:
            group = dist.new_group(ranks)
            if rank in ranks:
                self._mp, self._mp_ranks = group, ranks
        for ranks in dp_groups:
            group = dist.new_group(ranks)
            if rank in ranks:
                self._dp, self._dp_ranks = group, ranks
        self._rank = rank

    def get_model_parallel_group(self):
        return self._mp

    def get_model_parallel_rank(self) -> int:
        return self._mp_ranks.index(self._rank)

    def get_model_parallel_world_size(self) -> int:
        return len(self._mp_ranks)

    def get_data_parallel_group(self):
        return self._dp

    def get_data_parallel_rank(self) -> int:
        return self._dp_ranks.index(self._rank)

    def get_data_parallel_world_size(self) -> int:
        return len(self._dp_ranks)

    # Megatron's newer names
    get_tensor_model_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size


def check_mpu(mpu: Any, world_size: int) -> None:
    """TypeError/ValueError unless ``mpu`` has Megatron's calls and sizes that fit the world."""
    missing = [name for name in _MPU_CALLS if not callable(getattr(mpu, name, None))]
    if missing:
        raise InvalidTypeError(
            f"mpu lacks {', '.join(missing)}: pass an object with Megatron's interface "
            "(runtime.parallel_groups.ModelParallelGroups is one)"
        )
    mp, dp = mpu.get_model_parallel_world_size(), mpu.get_data_parallel_world_size()
    if mp * dp != world_size:
        raise InvalidValueError(
            f"mpu: model-parallel size {mp} x data-parallel size {dp} = {mp * dp} is not the "
            f"world size {world_size}"
        )
