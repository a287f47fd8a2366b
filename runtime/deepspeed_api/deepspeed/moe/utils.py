"""``deepspeed.moe.utils``: the parameter helpers, for models without MoE layers.

A parameter is an expert parameter in DeepSpeed when an MoE layer marked it
``allreduce=False``; no layer here does, so a marked parameter can only come from elsewhere
and is refused rather than put in a group this runtime would treat like any other.
"""

from __future__ import annotations

from typing import Any

import torch

from runtime.errors import InvalidValueError

from .._missing import missing, module_getattr
from .layer import MoE

__all__ = [
    "configure_moe_param_groups",
    "has_moe_layers",
    "is_moe_param",
    "is_moe_param_group",
    "split_params_into_different_moe_groups_for_optimizer",
    "split_params_into_shared_and_expert_params",
]


def has_moe_layers(m: torch.nn.Module) -> tuple[bool, int]:
    """``(has an MoE layer, its number of experts)``: ``(False, 0)`` here."""
    for module in m.modules():
        if isinstance(module, MoE):  # pragma: no cover - MoE cannot be built here
            return True, module.num_experts
    return False, 0


def is_moe_param(param: torch.Tensor) -> bool:
    return hasattr(param, "allreduce") and not param.allreduce


def _refuse_expert_params(params) -> None:
    if any(is_moe_param(p) for p in params):
        raise missing(
            "deepspeed.moe.utils (expert parameters, allreduce=False)",
            "no mixture-of-experts / expert parallelism",
        )


def split_params_into_shared_and_expert_params(params) -> tuple[list, list]:
    params = list(params)
    _refuse_expert_params(params)
    return params, []


def _as_group_list(param_groups) -> list[dict[str, Any]]:
    if isinstance(param_groups, tuple):
        return list(param_groups)
    if isinstance(param_groups, dict):
        return [param_groups]
    if isinstance(param_groups, list):
        return param_groups
    raise InvalidValueError(
        f"param_groups must be a dict, a list or a tuple of dicts, not {type(param_groups).__name__}"
    )


def split_params_into_different_moe_groups_for_optimizer(
    param_groups,
    max_group_size: int | float = 178956971,  # noqa: ARG001 - DeepSpeed's signature
) -> list[dict[str, Any]]:
    """The groups as a list, unchanged: with no expert parameters DeepSpeed adds no group."""
    groups = _as_group_list(param_groups)
    for group in groups:
        _refuse_expert_params(group["params"])
    return groups


def is_moe_param_group(param_group) -> bool:
    return bool(param_group.get("moe", False))


def configure_moe_param_groups(model_parameters):
    """DeepSpeed's grouping of ``model_parameters``: a list of parameters becomes one group
    ``{"params": ..., "name": "dense-params"}``; groups pass through (none is MoE here)."""
    model_parameters = list(model_parameters)
    if model_parameters and isinstance(model_parameters[0], dict):
        return split_params_into_different_moe_groups_for_optimizer(model_parameters)
    _refuse_expert_params(model_parameters)
    return [{"params": model_parameters, "name": "dense-params"}]


__getattr__ = module_getattr(__name__)
