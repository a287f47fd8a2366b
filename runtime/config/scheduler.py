"""`scheduler`: DeepSpeed's learning-rate schedules, their parameters and defaults.

runtime.optim.lr_schedules implements the schedules; this module only says which names and
parameters a config may use, so that a config is checked before any rank starts. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .values import (
    ConfigError,
    as_bool,
    as_choice,
    as_float,
    as_int,
    describe,
    did_you_mean,
)

__all__ = ["REQUIRED", "SCHEDULER_PARAMS", "SchedulerConfig"]

REQUIRED = object()
"""Marks a scheduler parameter without a default."""

# DeepSpeed's schedulers, their parameter names and defaults. warmup_max_lr None means "the
# optimizer's lr" (DeepSpeed's WarmupDecayLR defaults it to 0.001 instead; we use the lr for
# both so that a config without it behaves the same under either scheduler).
_WARMUP = {
    "warmup_min_lr": 0.0,
    "warmup_max_lr": None,
    "warmup_num_steps": 1000,
    "warmup_type": "log",
    "last_batch_iteration": -1,
}
SCHEDULER_PARAMS: dict[str, dict[str, Any]] = {
    "WarmupLR": dict(_WARMUP),
    "WarmupDecayLR": {"total_num_steps": REQUIRED, **_WARMUP},
    "WarmupCosineLR": {
        "total_num_steps": REQUIRED,
        "warmup_min_ratio": 0.0,
        "warmup_num_steps": 1000,
        "cos_min_ratio": 0.0001,
        "warmup_type": "log",
        "last_batch_iteration": -1,
    },
    "OneCycle": {
        "cycle_min_lr": REQUIRED,
        "cycle_max_lr": REQUIRED,
        "decay_lr_rate": 0.0,
        "cycle_first_step_size": 2000,
        "cycle_second_step_size": None,
        "cycle_first_stair_count": 0,
        "cycle_second_stair_count": None,
        "decay_step_size": 0,
        "cycle_momentum": True,
        "cycle_min_mom": 0.8,
        "cycle_max_mom": 0.9,
        "decay_mom_rate": 0.0,
        "last_batch_iteration": -1,
    },
    "LRRangeTest": {
        "lr_range_test_min_lr": 0.001,
        "lr_range_test_step_size": 2000,
        "lr_range_test_step_rate": 1.0,
        "lr_range_test_staircase": False,
        "last_batch_iteration": -1,
    },
}
_SCHEDULER_INT_PARAMS = {
    "warmup_num_steps": 1,
    "total_num_steps": 1,
    "cycle_first_step_size": 1,
    "cycle_second_step_size": 0,  # 0: the lr only rises, then decays (DeepSpeed accepts it)
    "cycle_first_stair_count": 0,
    "cycle_second_stair_count": 0,
    "decay_step_size": 0,
    "lr_range_test_step_size": 1,
    "last_batch_iteration": -1,
}
_SCHEDULER_BOOL_PARAMS = ("cycle_momentum", "lr_range_test_staircase")
# Learning rates and momenta may be one number or one per parameter group.
_SCHEDULER_PER_GROUP_PARAMS = (
    "warmup_min_lr",
    "warmup_max_lr",
    "cycle_min_lr",
    "cycle_max_lr",
    "cycle_min_mom",
    "cycle_max_mom",
    "lr_range_test_min_lr",
)


@dataclass(frozen=True)
class SchedulerConfig:
    """`scheduler`: a DeepSpeed learning-rate schedule, stepped once per optimizer step."""

    type: str
    """WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or LRRangeTest."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """The schedule's parameters, with DeepSpeed's names; missing ones take the schedule's
    defaults (SCHEDULER_PARAMS, listed in docs/config.md)."""

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or self.type not in SCHEDULER_PARAMS:
            names = ", ".join(SCHEDULER_PARAMS)
            hint = did_you_mean(self.type, SCHEDULER_PARAMS) if isinstance(self.type, str) else ""
            for name in SCHEDULER_PARAMS:
                if isinstance(self.type, str) and name.lower() == self.type.lower():
                    hint = f"did you mean '{name}'? (names are case-sensitive)"
            raise ConfigError(
                f"must be one of {names}, got {describe(self.type)}"
                + (f"; {hint}" if hint else ""),
                "type",
            )
        if not isinstance(self.params, Mapping):
            raise ConfigError(f"must be a mapping, got {describe(self.params)}", "params")
        known = SCHEDULER_PARAMS[self.type]
        params = dict(self.params)
        for name, value in params.items():
            key = f"params.{name}"
            if name not in known:
                hint = did_you_mean(name, known)
                raise ConfigError(
                    f"is not a parameter of {self.type}"
                    + (f"; {hint}" if hint else f"; valid: {', '.join(known)}"),
                    key,
                )
            if value is None and known[name] is None:
                continue
            if name in _SCHEDULER_INT_PARAMS:
                params[name] = as_int(key, value, _SCHEDULER_INT_PARAMS[name])
            elif name in _SCHEDULER_BOOL_PARAMS:
                params[name] = as_bool(key, value)
            elif name == "warmup_type":
                params[name] = as_choice(key, value, ("log", "linear"))
            elif name in _SCHEDULER_PER_GROUP_PARAMS and isinstance(value, (list, tuple)):
                params[name] = [as_float(f"{key}[{i}]", v, 0.0) for i, v in enumerate(value)]
            else:
                params[name] = as_float(key, value)
        missing = [n for n, d in known.items() if d is REQUIRED and n not in params]
        if missing:
            raise ConfigError(
                f"is required by {self.type}; add it to params", f"params.{missing[0]}"
            )
        object.__setattr__(self, "params", params)

    def full_params(self) -> dict[str, Any]:
        """Every parameter of the schedule: the given ones over the defaults."""
        return {**SCHEDULER_PARAMS[self.type], **self.params}
