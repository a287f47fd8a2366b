"""``deepspeed.utils``: the logger (`logging`), the ZeRO-3 leaf-module calls, full-gradient access and the
``zero_to_fp32`` helpers, as the Hugging Face integration imports them."""

from __future__ import annotations

import torch

from runtime.distributed.script_comm import is_initialized
from runtime.zero import (
    GatheredParameters,
    get_z3_leaf_modules,
    set_z3_leaf_modules,
    unset_z3_leaf_modules,
    z3_leaf_module,
)

from .._missing import module_getattr
from ..runtime.dataloader import RepeatingLoader
from . import logging, zero_to_fp32
from .logging import log_dist, log_dist_once, logger, set_log_level_from_string
from .zero_to_fp32 import (
    convert_zero_checkpoint_to_fp32_state_dict,
    get_fp32_state_dict_from_zero_checkpoint,
    load_state_dict_from_zero_checkpoint,
)

__all__ = [
    "RepeatingLoader",
    "convert_zero_checkpoint_to_fp32_state_dict",
    "get_fp32_state_dict_from_zero_checkpoint",
    "get_z3_leaf_modules",
    "is_initialized",
    "load_state_dict_from_zero_checkpoint",
    "log_dist",
    "log_dist_once",
    "logger",
    "logging",
    "safe_get_full_fp32_param",
    "safe_get_full_grad",
    "set_log_level_from_string",
    "set_z3_leaf_modules",
    "unset_z3_leaf_modules",
    "z3_leaf_module",
    "zero_to_fp32",
]


def safe_get_full_fp32_param(param: torch.Tensor) -> torch.Tensor:
    """The whole fp32 master of ``param``, as DeepSpeed's returns it: under bf16/fp16 the
    optimizer's fp32 value, not the 16-bit parameter widened. A collective at stages 1-3
    (the master is sharded): call it on every rank. A parameter no engine trains (frozen, or
    partitioned by zero.Init only) has no master: its whole value, widened."""
    owner = getattr(param, "_zero_owner", None) or getattr(param, "_zero_writeback", None)
    if owner is not None and hasattr(owner, "full_fp32"):
        return owner.full_fp32(param)
    with GatheredParameters([param]):
        return param.detach().to(torch.float32, copy=True)


def safe_get_full_grad(param: torch.Tensor) -> torch.Tensor | None:
    """The parameter's gradient as the module holds it after backward, or None. The runtime
    reduces gradients into its own shards, so only a gradient still on the parameter (stage 0,
    or before the reduction) is there to read; at stages 1-3 this refuses instead of returning
    a partial or stale value."""
    from runtime.errors import UnsupportedError

    if getattr(param, "_zero_owner", None) is not None or param.grad is None:
        raise UnsupportedError(
            "deepspeed.utils.safe_get_full_grad: the runtime keeps reduced gradients in its "
            "ZeRO shards, not on the parameters; read the gradient norm with "
            "engine.get_global_grad_norm(), or train at ZeRO stage 0 to inspect .grad"
        )
    return param.grad.detach().clone()


__getattr__ = module_getattr(__name__)
