"""``deepspeed.runtime.lr_schedules``: DeepSpeed's schedules (`runtime.optim.lr_schedules`)."""

from __future__ import annotations

from runtime.optim.lr_schedules import (
    SCHEDULERS,
    LRRangeTest,
    OneCycle,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
)

from .._missing import module_getattr

__all__ = [
    "LRRangeTest",
    "OneCycle",
    "VALID_LR_SCHEDULES",
    "WarmupCosineLR",
    "WarmupDecayLR",
    "WarmupLR",
]

# accelerate recognises a DeepSpeed scheduler by its class name in this list.
VALID_LR_SCHEDULES = list(SCHEDULERS)

__getattr__ = module_getattr(__name__)
