"""``deepspeed.ops.adam``: `DeepSpeedCPUAdam` and `FusedAdam` with DeepSpeed's arguments.

Both are DeepSpeed's compiled kernels of one algorithm: AdamW (decoupled weight decay) by
default, L2-regularised Adam with ``adamw_mode``/``adam_w_mode`` false. Here each is torch's
`AdamW` or `Adam` with the same hyper-parameters (the runtime's engine steps them on the
fp32 master weights, on CPU or GPU), so a script or config that names them trains the same.
accelerate swaps a torch optimizer for `DeepSpeedCPUAdam` under optimizer offload.
"""

from __future__ import annotations

import torch

from runtime.errors import UnsupportedError

from ..._missing import module_getattr

__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]


def _check(name: str, bias_correction: bool, amsgrad: bool) -> None:
    if not bias_correction:
        raise UnsupportedError(
            f"{name}(bias_correction=False): torch's Adam always corrects the moments' bias; "
            "leave bias_correction at its default (True)"
        )
    if amsgrad:
        raise UnsupportedError(f"{name}(amsgrad=True): DeepSpeed's kernel refuses it too")


class _AdamFamily:
    """Builds torch's AdamW (``adamw``) or Adam with the shared hyper-parameters."""

    @staticmethod
    def build(params, lr, betas, eps, weight_decay, adamw: bool) -> torch.optim.Optimizer:
        cls = torch.optim.AdamW if adamw else torch.optim.Adam
        return cls(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


class DeepSpeedCPUAdam(torch.optim.AdamW):
    """DeepSpeed's CPU Adam: AdamW (``adamw_mode=True``) or Adam with L2 decay."""

    def __new__(
        cls,
        model_params,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        adamw_mode: bool = True,
        fp32_optimizer_states: bool = True,  # noqa: ARG004 - states are fp32 here anyway
    ):
        _check("DeepSpeedCPUAdam", bias_correction, amsgrad)
        if adamw_mode:
            return super().__new__(cls)
        return _AdamFamily.build(model_params, lr, betas, eps, weight_decay, adamw=False)

    def __init__(
        self,
        model_params,
        lr: float = 1e-3,
        bias_correction: bool = True,  # noqa: ARG002 - checked in __new__
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,  # noqa: ARG002 - checked in __new__
        adamw_mode: bool = True,  # noqa: ARG002 - chose the class in __new__
        fp32_optimizer_states: bool = True,  # noqa: ARG002
    ):
        super().__init__(model_params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


class FusedAdam(torch.optim.AdamW):
    """DeepSpeed's fused GPU Adam: AdamW (``adam_w_mode=True``) or Adam with L2 decay."""

    def __new__(
        cls,
        params,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        adam_w_mode: bool = True,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        set_grad_none: bool = True,  # noqa: ARG004 - zero_grad sets None in torch
    ):
        _check("FusedAdam", bias_correction, amsgrad)
        if adam_w_mode:
            return super().__new__(cls)
        return _AdamFamily.build(params, lr, betas, eps, weight_decay, adamw=False)

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        bias_correction: bool = True,  # noqa: ARG002
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        adam_w_mode: bool = True,  # noqa: ARG002
        weight_decay: float = 0.0,
        amsgrad: bool = False,  # noqa: ARG002
        set_grad_none: bool = True,  # noqa: ARG002
    ):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


__getattr__ = module_getattr(__name__)
