"""Consolidated weights: gather partitioned parameters unit by unit, write from rank 0.

`consolidated_state_dict` walks the module's state dict in order and gathers the parameters'
units one at a time (every rank takes part in each all-gather; ranks other than 0 hold at most
one unit at a time and keep nothing), so the whole model only ever exists on rank 0, in CPU
memory. `save_16bit_model` writes it as safetensors.

The tensors keep the module's dtype: 16-bit under fp16/bf16 training, fp32 when training in
fp32 (as DeepSpeed, whose "16bit" file holds whatever dtype the module has). Tied weights are
written under every name, as separate tensors (safetensors does not store aliases).
Parameters that are not partitioned (stages 0-2, persistent ones) are copied as they are.
"""

from __future__ import annotations

import logging
import os

import torch

__all__ = ["consolidated_state_dict", "save_16bit_model"]

log = logging.getLogger("runtime.zero.stage3.save")


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


def save_16bit_model(
    engine, save_dir, save_filename: str = "model.safetensors", exclude_frozen: bool = False
) -> bool:
    """Write the consolidated weights to ``save_dir/save_filename`` from rank 0 (collective)."""
    zero = engine.config.zero_optimization
    rank = engine.global_rank
    if zero.stage == 3 and not zero.stage3_gather_16bit_weights_on_model_save:
        if rank == 0:
            log.warning(
                "save_16bit_model: nothing written; the weights are partitioned (stage 3) and "
                "zero_optimization.stage3_gather_16bit_weights_on_model_save is false - set it "
                "to true to gather and save them"
            )
        return False
    state = consolidated_state_dict(engine.module, rank, exclude_frozen)
    if rank == 0:
        from runtime.checkpoint import write_state_dict

        os.makedirs(save_dir, exist_ok=True)
        # A random temporary name, never through a link, renamed once complete.
        write_state_dict(state, os.path.join(os.fspath(save_dir), save_filename), {"format": "pt"})
    engine.comm.barrier()
    return True
