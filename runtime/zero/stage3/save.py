"""Consolidated weights: gather partitioned parameters unit by unit, onto rank 0.

`consolidated_state_dict` walks the module's state dict in order and gathers the parameters'
units one at a time (every rank takes part in each all-gather; ranks other than 0 hold at most
one unit at a time and keep nothing), so the whole model only ever exists on rank 0, in CPU
memory. The engine's `save_16bit_model` (runtime/checkpoint/engine_io.py) writes it.

The tensors keep the module's dtype: 16-bit under fp16/bf16 training, fp32 when training in
fp32 (as DeepSpeed, whose "16bit" file holds whatever dtype the module has). Tied weights are
written under every name, as separate tensors (safetensors does not store aliases).
Parameters that are not partitioned (stages 0-2, persistent ones) are copied as they are.
"""

from __future__ import annotations

import torch

__all__ = ["consolidated_state_dict"]


def consolidated_state_dict(
    module: torch.nn.Module, rank: int, exclude_frozen_parameters: bool = False
) -> dict[str, torch.Tensor]:
    """Full CPU tensors by state-dict name on rank 0; an empty dict on the other ranks."""
    out: dict[str, torch.Tensor] = {}
    current = None
    try:
        for name, t in module.state_dict(keep_vars=True).items():
            if exclude_frozen_parameters and isinstance(t, torch.nn.Parameter):
                if not t.requires_grad:
                    continue
            owner = getattr(t, "_zero_owner", None)
            if owner is not None and owner is not current:
                if current is not None:
                    current.release_for_user(None)
                    current = None
                owner.gather_for_user()
                current = owner
            if rank == 0:
                out[name] = t.detach().to("cpu", copy=True).contiguous()
    finally:
        if current is not None:
            current.release_for_user(None)
    return out
