"""``param.ds_status``: whether a partitioned parameter's full values are there to read.

DeepSpeed keeps this attribute on every ZeRO-3 parameter, and code written for it reads it
(TRL gathers ``lm_head.weight`` for its fused loss only when ``ds_status`` is not AVAILABLE).
Here the stage-3 units and `zero.Init`'s partitions set it at each gather and release, with
DeepSpeed's enum (``deepspeed.runtime.zero.partition_parameters.ZeroParamStatus``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import torch

__all__ = ["ZeroParamStatus", "mark"]


class ZeroParamStatus(enum.Enum):
    AVAILABLE = 1
    """The full values are in ``param.data``."""
    NOT_AVAILABLE = 2
    """Only this rank's shard exists; ``param.data`` is empty."""
    INFLIGHT = 3
    """An all-gather of the full values has started and not been waited for."""


def mark(params: Iterable[torch.Tensor], status: ZeroParamStatus) -> None:
    for p in params:
        p.ds_status = status
