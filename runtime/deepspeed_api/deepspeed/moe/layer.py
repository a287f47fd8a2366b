"""``deepspeed.moe.layer.MoE``: refused when built (no expert parallelism here)."""

from __future__ import annotations

import torch

from .._missing import missing, module_getattr

__all__ = ["MoE"]


class MoE(torch.nn.Module):
    """DeepSpeed's mixture-of-experts layer; the bundled runtime does not implement it."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ARG002
        raise missing("deepspeed.moe.layer.MoE", "no mixture-of-experts / expert parallelism")


__getattr__ = module_getattr(__name__)
