"""``deepspeed.runtime.zero.partition_parameters``: what transformers and TRL import from it.

DeepSpeed's ``zero.Init`` replaces torch's tensor constructors so that tensors created inside it
take the model's dtype and device; transformers swaps `zero_wrapper_for_fp_tensor_constructor`
around ``zero.Init`` to keep ``torch.arange`` (RoPE buffers) in its own dtype. The runtime's
`Init` partitions parameters when each module's ``__init__`` returns and never touches tensor
constructors, so there is nothing to wrap: the function returns the constructor unchanged and
``torch.arange`` keeps its dtype either way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from runtime.zero import GatheredParameters, Init
from runtime.zero.param_status import ZeroParamStatus

from ..._missing import module_getattr
from ...accelerator import get_accelerator

__all__ = [
    "GatheredParameters",
    "Init",
    "ZeroParamStatus",
    "get_accelerator",
    "zero_wrapper_for_fp_tensor_constructor",
]

_orig_torch_arange = torch.arange


def zero_wrapper_for_fp_tensor_constructor(fn: Callable, target_fp_dtype=None, target_device=None):  # noqa: ARG001
    """The tensor constructor as it is (see the module docstring)."""
    return fn


__getattr__ = module_getattr(__name__)
