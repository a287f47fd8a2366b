"""``deepspeed.utils.zero_to_fp32``: one fp32 state dict from a checkpoint the runtime saved
(at any world size and stage), with DeepSpeed's function names (`runtime.checkpoint`)."""

from __future__ import annotations

import os

import torch

from runtime.checkpoint import consolidate_state_dict

from .._missing import module_getattr

__all__ = [
    "convert_zero_checkpoint_to_fp32_state_dict",
    "get_fp32_state_dict_from_zero_checkpoint",
    "load_state_dict_from_zero_checkpoint",
]


def get_fp32_state_dict_from_zero_checkpoint(
    checkpoint_dir: str, tag: str | None = None, exclude_frozen_parameters: bool = False
) -> dict[str, torch.Tensor]:
    """The full fp32 weights of the checkpoint in ``checkpoint_dir`` (tag: ``latest``)."""
    if exclude_frozen_parameters:
        from runtime.errors import UnsupportedError

        raise UnsupportedError(
            "get_fp32_state_dict_from_zero_checkpoint(exclude_frozen_parameters=True): the "
            "consolidated state dict keeps every saved tensor; drop the frozen names yourself"
        )
    state, _ = consolidate_state_dict(checkpoint_dir, tag, torch.float32)
    return state


def convert_zero_checkpoint_to_fp32_state_dict(
    checkpoint_dir: str,
    output_dir: str,
    tag: str | None = None,
    exclude_frozen_parameters: bool = False,
    safe_serialization: bool = True,
    **unused: object,
) -> None:
    """Write the fp32 weights to ``output_dir/model.safetensors`` (safetensors only: the runtime
    never pickles)."""
    from runtime.checkpoint.consolidate import write_state_dict
    from runtime.errors import UnsupportedError

    if not safe_serialization:
        raise UnsupportedError(
            "convert_zero_checkpoint_to_fp32_state_dict(safe_serialization=False): only "
            "safetensors are written here"
        )
    if unused:
        raise UnsupportedError(
            f"convert_zero_checkpoint_to_fp32_state_dict: {', '.join(sorted(unused))} "
            "(sharded output) is not supported; one model.safetensors is written"
        )
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    os.makedirs(output_dir, exist_ok=True)
    write_state_dict(state, os.path.join(output_dir, "model.safetensors"), {"format": "pt"})


def load_state_dict_from_zero_checkpoint(model: torch.nn.Module, checkpoint_dir: str, tag=None):
    """Load the checkpoint's fp32 weights into ``model`` (on CPU) and return it."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model


__getattr__ = module_getattr(__name__)
