"""Which optimizer types and parameters a config may name, checked before launch (no torch).

DeepSpeed builds its own optimizers for a few names (Adam, AdamW, Lamb, OneBitAdam, Lion, ...)
and looks any other name up in torch.optim. This runtime builds torch.optim's classes over flat
fp32 master shards (runtime.optim.optimizers), so a config naming something it cannot build, or
giving a parameter the class would reject, is refused here, once, before any rank starts,
instead of failing with a traceback on every rank.

The tables list torch.optim's classes and their keyword arguments (torch 2.13); the rank still
checks against the installed torch when it builds the optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .values import ConfigError, describe, did_you_mean

__all__ = ["OPTIMIZER_PARAMS", "check_optimizer"]

_COMMON = ("lr", "weight_decay", "maximize", "foreach", "differentiable", "capturable")
OPTIMIZER_PARAMS: dict[str, tuple[str, ...]] = {
    # "Adam" builds AdamW unless adam_w_mode is false (DeepSpeed's rule): AdamW's arguments.
    "Adam": (*_COMMON, "betas", "eps", "amsgrad", "fused"),
    "AdamW": (*_COMMON, "betas", "eps", "amsgrad", "fused"),
    "SGD": (*_COMMON, "momentum", "dampening", "nesterov", "fused"),
    "Adagrad": (*_COMMON, "lr_decay", "initial_accumulator_value", "eps", "fused"),
    "Adadelta": (*_COMMON, "rho", "eps"),
    "Adamax": (*_COMMON, "betas", "eps"),
    "ASGD": (*_COMMON, "lambd", "alpha", "t0"),
    "NAdam": (*_COMMON, "betas", "eps", "momentum_decay", "decoupled_weight_decay"),
    "RAdam": (*_COMMON, "betas", "eps", "decoupled_weight_decay"),
    "RMSprop": (*_COMMON, "alpha", "eps", "momentum", "centered"),
    "Rprop": ("lr", "etas", "step_sizes", "capturable", "foreach", "maximize", "differentiable"),
}
"""torch.optim classes usable here and their keyword arguments."""

# DeepSpeed's extra keys for its Adam family, with what they mean here.
_DS_ADAM_KEYS = ("adam_w_mode", "torch_adam", "bias_correction")

_USE_INSTEAD = (
    'use "Adam", "AdamW" or "SGD" (or another torch.optim class), or build the optimizer in the '
    "script and pass it to runtime.initialize(optimizer=...)"
)
# Names users bring that cannot be built here, and why.
_REFUSED = {
    "lamb": "Lamb is DeepSpeed's own CUDA optimizer",
    "onebitadam": "1-bit Adam is DeepSpeed's compressed-communication optimizer",
    "onebitlamb": "1-bit Lamb is DeepSpeed's compressed-communication optimizer",
    "zerooneadam": "0/1 Adam is DeepSpeed's compressed-communication optimizer",
    "lion": "Lion is DeepSpeed's own optimizer (torch.optim has none)",
    "muadam": "MuAdam needs the mup package",
    "muadamw": "MuAdamW needs the mup package",
    "musgd": "MuSGD needs the mup package",
    "adamw8bit": "8-bit AdamW is bitsandbytes', not torch's",
    "adam8bit": "8-bit Adam is bitsandbytes', not torch's",
    "pagedadamw": "paged AdamW is bitsandbytes', not torch's",
    "muon": "Muon needs the 2-D weight matrices, and this runtime steps flat shards",
    "adafactor": "Adafactor factors 2-D weights, and this runtime steps flat shards",
    "lbfgs": "LBFGS needs a closure that engine.step() cannot give",
    "sparseadam": "SparseAdam needs sparse gradients",
}
_BOOLS = {
    "amsgrad",
    "maximize",
    "foreach",
    "differentiable",
    "capturable",
    "fused",
    "decoupled_weight_decay",
    "nesterov",
    "centered",
    "adam_w_mode",
    "torch_adam",
    "bias_correction",
}
_PAIRS = {"betas", "etas", "step_sizes"}


def canonical_name(type_name: str) -> str | None:
    """The torch.optim class name `type_name` stands for (case-insensitive), or None."""
    lowered = type_name.strip().lower()
    for name in OPTIMIZER_PARAMS:
        if name.lower() == lowered:
            return name
    return None


def check_optimizer(type_name: Any, params: Mapping[str, Any]) -> None:
    """Raise ConfigError unless the runtime can build `type_name` with `params`."""
    if not isinstance(type_name, str) or not type_name.strip() or type_name == "auto":
        raise ConfigError(
            f'must be an optimizer name such as "AdamW", got {describe(type_name)}', "type"
        )
    name = canonical_name(type_name)
    if name is None:
        why = _REFUSED.get(type_name.strip().lower().replace("_", "").replace("-", ""))
        shown = describe(type_name)
        if why:
            problem = f"{shown} is not supported by this runtime ({why}); {_USE_INSTEAD}"
        else:
            hint = did_you_mean(type_name, OPTIMIZER_PARAMS)
            problem = (
                f"{shown} is not an optimizer this runtime can build; "
                + (f"{hint} " if hint else "")
                + f"{_USE_INSTEAD}; torch.optim classes: {', '.join(OPTIMIZER_PARAMS)}"
            )
        raise ConfigError(problem, "type")
    known = OPTIMIZER_PARAMS[name] + (_DS_ADAM_KEYS if name in ("Adam", "AdamW") else ())
    for key, value in params.items():
        path = f"params.{key}"
        if key not in known:
            hint = did_you_mean(str(key), known)
            raise ConfigError(
                f"is not a parameter of {name}; " + (hint or f"its parameters: {', '.join(known)}"),
                path,
            )
        _check_value(path, key, value)
    if params.get("bias_correction") is False:
        raise ConfigError(
            "= false is not supported by this runtime (Adam always corrects bias); remove it",
            "params.bias_correction",
        )


def _check_value(path: str, key: str, value: Any) -> None:
    if key in _BOOLS:
        if not isinstance(value, bool):
            raise ConfigError(f"must be true or false, got {describe(value)}", path)
    elif key in _PAIRS:
        if (
            not isinstance(value, (list, tuple))
            or len(value) != 2
            or not all(_is_number(v) for v in value)
        ):
            raise ConfigError(
                f"must be a list of two numbers such as [0.9, 0.999], got {describe(value)}", path
            )
        if key == "betas" and not all(0.0 <= v < 1.0 for v in value):
            raise ConfigError(f"must both be in [0, 1), got {describe(value)}", path)
    elif not _is_number(value):
        raise ConfigError(f"must be a finite number, got {describe(value)}", path)
    elif key in ("lr", "eps", "weight_decay", "momentum") and value < 0:
        raise ConfigError(f"must be >= 0, got {describe(value)}", path)


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
