"""How gradients are reduced over data-parallel ranks: the dtype on the wire and where the
division by the world size happens (DeepSpeed's `communication_data_type`,
`prescale_gradients`, `gradient_predivide_factor`).

Gradients accumulate locally in the gradient buffer's dtype (the training dtype). At the
reduction each bucket is cast to the wire dtype when that differs, and the result comes back
into the buffer's dtype:

* reduce-scatter on gloo (stages 1-3): an all-to-all of the wire-dtype chunks, then each rank
  sums the N received chunks *in the buffer's dtype* (fp32 accumulation of 16-bit values: one
  rounding per element on the way out, none in the sum);
* reduce-scatter on NCCL, and every all-reduce (stage 0; stages 1-2 with
  ``reduce_scatter: false``): the backend sums in the wire dtype, the result is then cast into
  the buffer's dtype (NCCL and gloo both accumulate in the tensor's dtype).

Bytes on the wire scale with the wire dtype's size: fp16/bf16 halve an fp32 run's reduction
traffic (`runtime.distributed.comm` counts them).

Scaling: the engine divides the loss by ``pre_divisor`` before backward (no extra pass over the
gradients) and the reducer multiplies the reduced gradients by ``post_factor`` at the
accumulation boundary when it is not 1. With the defaults, and with ``prescale_gradients``,
``pre_divisor`` is the world size and nothing follows. ``gradient_predivide_factor`` f (without
prescale) gives ``pre_divisor`` f and ``post_factor`` f / world, as DeepSpeed's stage 0 and
stages 1-2 without reduce-scatter; the config refuses it where DeepSpeed does (stage 2 with
reduce-scatter, stage 3) and notes that stage 1 with reduce-scatter ignores it, as DeepSpeed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["GradReduction", "WIRE_DTYPES"]

WIRE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class GradReduction:
    wire_dtype: torch.dtype
    """The dtype gradients are reduced in."""
    pre_divisor: float
    """The loss (so every gradient) is divided by this before backward."""
    post_factor: float
    """The reduced gradients are multiplied by this at the accumulation boundary (1: not)."""

    @classmethod
    def from_config(cls, config: Any, grad_dtype: torch.dtype, world_size: int) -> GradReduction:
        name = config.communication_data_type
        wire = WIRE_DTYPES[name] if name is not None else grad_dtype
        zero = config.zero_optimization
        # Where DeepSpeed reads the predivide factor (the config refuses or notes the rest).
        reads_factor = zero.stage == 0 or (zero.stage in (1, 2) and not zero.reduce_scatter)
        factor = float(config.gradient_predivide_factor)
        if config.prescale_gradients or not reads_factor or factor == 1.0:
            return cls(wire, float(world_size), 1.0)
        return cls(wire, factor, factor / world_size)

    def wire_for(self, grad_dtype: torch.dtype) -> torch.dtype | None:
        """The wire dtype when it differs from the gradient buffer's, else None."""
        return None if self.wire_dtype == grad_dtype else self.wire_dtype
