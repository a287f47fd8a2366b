"""DeepSpeed's learning-rate schedules as torch LRSchedulers.

Same parameter names, defaults and formulas as DeepSpeed (WarmupLR, WarmupDecayLR,
WarmupCosineLR, OneCycle, LRRangeTest), so a config's schedule gives the same learning rate at
every step. DeepSpeed counts `last_batch_iteration` from -1 (before the first step); torch counts
`last_epoch` from 0 after construction. Here `last_batch_iteration == last_epoch - 1`, and
`step(n)` sets the iteration explicitly as DeepSpeed's `step(last_batch_iteration)` does.

Differences from DeepSpeed, on purpose:
- warmup_max_lr defaults to each parameter group's own lr for WarmupLR and WarmupDecayLR
  (DeepSpeed: the first group's lr for WarmupLR, 0.001 for WarmupDecayLR).
- OneCycle's momentum cycling keeps each group's beta2 (DeepSpeed overwrites it with 0.99).
- An unknown warmup_type is a config error instead of a silent fallback to "log".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from runtime.config import ConfigError, SchedulerConfig
from runtime.errors import InvalidTypeError

__all__ = [
    "LRRangeTest",
    "OneCycle",
    "SCHEDULERS",
    "WarmupCosineLR",
    "WarmupDecayLR",
    "WarmupLR",
    "build_scheduler",
]

log = logging.getLogger(__name__)


def _torch_optimizer(optimizer: Any) -> Optimizer:
    """The torch optimizer itself, or the one a wrapper holds in `.optimizer`."""
    if isinstance(optimizer, Optimizer):
        return optimizer
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, Optimizer):
        return inner
    raise InvalidTypeError(f"{type(optimizer).__name__} is not a torch.optim.Optimizer")


def _per_group(optimizer: Optimizer, value: Any, name: str) -> list[float]:
    groups = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != groups:
            raise ConfigError(
                f"has {len(value)} values but the optimizer has {groups} parameter groups; "
                "give one number or one per group",
                f"scheduler.params.{name}",
            )
        return [float(v) for v in value]
    return [float(value)] * groups


def _group_lrs(optimizer: Optimizer) -> list[float]:
    # initial_lr is the lr before any scheduler touched it (set by LRScheduler.__init__).
    return [float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups]


class _IterationScheduler(LRScheduler):
    """Base: the lr is a function of DeepSpeed's `last_batch_iteration` (-1 before any step)."""

    def __init__(self, optimizer: Any, last_batch_iteration: int = -1):
        # LRScheduler.__init__ performs one step: last_epoch 0, i.e. iteration -1.
        super().__init__(_torch_optimizer(optimizer))
        if last_batch_iteration != -1:
            self.step(last_batch_iteration)

    @property
    def last_batch_iteration(self) -> int:
        """DeepSpeed's counter: steps taken - 1."""
        return self.last_epoch - 1

    def step(self, last_batch_iteration: int | None = None) -> None:  # type: ignore[override]
        """Advance one optimizer step, or jump to iteration `last_batch_iteration`."""
        if last_batch_iteration is None:
            self.last_epoch += 1
        else:
            self.last_epoch = int(last_batch_iteration) + 1
        self._apply(self.get_lr())

    def _apply(self, lrs: Sequence[float]) -> None:
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        self._last_lr = [
            g["lr"].clone() if isinstance(g["lr"], torch.Tensor) else g["lr"]
            for g in self.optimizer.param_groups
        ]

    def get_lr(self) -> list[float]:
        return self.lr_at(self.last_batch_iteration)

    def lr_at(self, iteration: int) -> list[float]:
        """The learning rates at DeepSpeed iteration `iteration` (>= -1)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["last_batch_iteration"] = self.last_batch_iteration
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load our own state dict, or DeepSpeed's ({"last_batch_iteration": n})."""
        state = dict(state_dict)
        iteration = state.pop("last_batch_iteration", None)
        if state:
            super().load_state_dict(state)
        if iteration is not None:
            self.last_epoch = int(iteration) + 1
            self._last_lr = self.get_lr()


def _warmup_gamma(iteration: int, warmup_steps: int, warmup_type: str) -> float:
    """Fraction of the warmup done after `iteration` (DeepSpeed's log or linear ramp)."""
    if warmup_type == "log":
        return math.log(iteration + 1) / math.log(warmup_steps)
    return iteration / warmup_steps


def _check_warmup(warmup_num_steps: Any, warmup_type: str) -> int:
    if isinstance(warmup_num_steps, bool) or not isinstance(warmup_num_steps, int):
        raise ConfigError(
            f"must be a positive integer, got {warmup_num_steps!r}",
            "scheduler.params.warmup_num_steps",
        )
    if warmup_num_steps < 1:
        raise ConfigError(
            f"must be >= 1, got {warmup_num_steps}", "scheduler.params.warmup_num_steps"
        )
    if warmup_type not in ("log", "linear"):
        raise ConfigError(
            f"must be 'log' or 'linear', got {warmup_type!r}", "scheduler.params.warmup_type"
        )
    # DeepSpeed: at least 2, so that log(warmup_num_steps) is not 0.
    return max(2, warmup_num_steps)


class WarmupLR(_IterationScheduler):
    """Ramp from warmup_min_lr to warmup_max_lr over warmup_num_steps, then hold."""

    def __init__(
        self,
        optimizer: Any,
        warmup_min_lr: float | Sequence[float] = 0.0,
        warmup_max_lr: float | Sequence[float] | None = None,
        warmup_num_steps: int = 1000,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ):
        opt = _torch_optimizer(optimizer)
        self.warmup_num_steps = _check_warmup(warmup_num_steps, warmup_type)
        self.warmup_type = warmup_type
        self.min_lrs = _per_group(opt, warmup_min_lr, "warmup_min_lr")
        if warmup_max_lr is None:
            self.max_lrs = _group_lrs(opt)
        else:
            self.max_lrs = _per_group(opt, warmup_max_lr, "warmup_max_lr")
        self.delta_lrs = [hi - lo for hi, lo in zip(self.max_lrs, self.min_lrs, strict=True)]
        super().__init__(opt, last_batch_iteration)

    def gamma(self, iteration: int) -> float:
        if iteration < self.warmup_num_steps:
            return _warmup_gamma(iteration, self.warmup_num_steps, self.warmup_type)
        return 1.0

    def lr_at(self, iteration: int) -> list[float]:
        if iteration < 0:
            return list(self.min_lrs)
        gamma = self.gamma(iteration)
        return [lo + delta * gamma for lo, delta in zip(self.min_lrs, self.delta_lrs, strict=True)]


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then a linear decay to 0 at total_num_steps."""

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int,
        warmup_min_lr: float | Sequence[float] = 0.0,
        warmup_max_lr: float | Sequence[float] | None = None,
        warmup_num_steps: int = 1000,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ):
        self.total_num_steps = int(total_num_steps)
        super().__init__(
            optimizer,
            warmup_min_lr,
            warmup_max_lr,
            warmup_num_steps,
            warmup_type,
            last_batch_iteration,
        )
        if self.total_num_steps < self.warmup_num_steps:
            log.warning(
                "WarmupDecayLR: total_num_steps %d is less than warmup_num_steps %d",
                self.total_num_steps,
                self.warmup_num_steps,
            )

    def gamma(self, iteration: int) -> float:
        if iteration < self.warmup_num_steps:
            return _warmup_gamma(iteration, self.warmup_num_steps, self.warmup_type)
        remaining = self.total_num_steps - iteration
        return max(0.0, remaining / max(1.0, self.total_num_steps - self.warmup_num_steps))


class WarmupCosineLR(_IterationScheduler):
    """Ramp the lr ratio from warmup_min_ratio to 1, then cosine-decay it to cos_min_ratio at
    total_num_steps; the lr is the group's lr times the ratio."""

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int,
        warmup_min_ratio: float = 0.0,
        warmup_num_steps: int = 1000,
        cos_min_ratio: float = 0.0001,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ):
        opt = _torch_optimizer(optimizer)
        self.total_num_steps = int(total_num_steps)
        self.warmup_num_steps = _check_warmup(warmup_num_steps, warmup_type)
        self.warmup_type = warmup_type
        self.warmup_min_ratio = float(warmup_min_ratio)
        self.cos_min_ratio = float(cos_min_ratio)
        self.org_lrs = _group_lrs(opt)
        if self.total_num_steps < self.warmup_num_steps:
            log.warning(
                "WarmupCosineLR: total_num_steps %d is less than warmup_num_steps %d",
                self.total_num_steps,
                self.warmup_num_steps,
            )
        super().__init__(opt, last_batch_iteration)

    def ratio(self, iteration: int) -> float:
        if iteration < 0:
            return 0.0
        if iteration < self.warmup_num_steps:
            gamma = _warmup_gamma(iteration, self.warmup_num_steps, self.warmup_type)
            return self.warmup_min_ratio + gamma * (1.0 - self.warmup_min_ratio)
        done = iteration - self.warmup_num_steps + 1
        span = max(1, self.total_num_steps - self.warmup_num_steps)
        progress = min(1.0, done / span)  # hold the floor once the schedule has ended
        cosine = (1 + math.cos(math.pi * progress)) / 2
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * cosine)

    def lr_at(self, iteration: int) -> list[float]:
        ratio = self.ratio(iteration)
        return [lr * ratio for lr in self.org_lrs]


class OneCycle(_IterationScheduler):
    """1Cycle: lr rises from cycle_min_lr to cycle_max_lr over cycle_first_step_size steps, falls
    back over cycle_second_step_size, then decays; momentum (beta1) cycles inversely."""

    def __init__(
        self,
        optimizer: Any,
        cycle_min_lr: float | Sequence[float],
        cycle_max_lr: float | Sequence[float],
        decay_lr_rate: float = 0.0,
        cycle_first_step_size: int = 2000,
        cycle_second_step_size: int | None = None,
        cycle_first_stair_count: int = 0,
        cycle_second_stair_count: int | None = None,
        decay_step_size: int = 0,
        cycle_momentum: bool = True,
        cycle_min_mom: float = 0.8,
        cycle_max_mom: float = 0.9,
        decay_mom_rate: float = 0.0,
        last_batch_iteration: int = -1,
    ):
        opt = _torch_optimizer(optimizer)
        self.first_step_size = float(cycle_first_step_size)
        self.second_step_size = (
            float(cycle_second_step_size)
            if cycle_second_step_size is not None
            else self.first_step_size
        )
        # DeepSpeed's bounds: a negative size would run the lr below cycle_min_lr (negative).
        # A second size of 0 is a cycle that only rises.
        if not self.first_step_size > 0:
            raise ConfigError(
                f"must be positive, got {cycle_first_step_size}",
                "scheduler.params.cycle_first_step_size",
            )
        if not self.second_step_size >= 0:
            raise ConfigError(
                f"must be >= 0, got {cycle_second_step_size}",
                "scheduler.params.cycle_second_step_size",
            )
        self.total_size = self.first_step_size + self.second_step_size
        self.step_ratio = self.first_step_size / self.total_size
        self.first_stair_count = int(cycle_first_stair_count)
        self.second_stair_count = (
            self.first_stair_count
            if cycle_second_stair_count is None
            else int(cycle_second_stair_count)
        )
        self.decay_step_size = decay_step_size
        self.min_lrs = _per_group(opt, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(opt, cycle_max_lr, "cycle_max_lr")
        self.decay_lr_rate = float(decay_lr_rate)
        self.skip_lr_decay = math.isclose(decay_step_size, 0) or math.isclose(decay_lr_rate, 0)
        self.cycle_momentum = bool(cycle_momentum)
        if self.cycle_momentum and "betas" not in opt.defaults:
            log.warning(
                "OneCycle: cycle_momentum is off because %s has no betas", type(opt).__name__
            )
            self.cycle_momentum = False
        self.min_moms = _per_group(opt, cycle_min_mom, "cycle_min_mom")
        self.max_moms = _per_group(opt, cycle_max_mom, "cycle_max_mom")
        self.decay_mom_rate = float(decay_mom_rate)
        self.skip_mom_decay = math.isclose(decay_step_size, 0) or math.isclose(decay_mom_rate, 0)
        super().__init__(opt, last_batch_iteration)

    def _scale_factor(self, iteration: int) -> float:
        batch = iteration + 1
        cycle = math.floor(1 + batch / self.total_size)
        x = 1.0 + batch / self.total_size - cycle
        if x <= self.step_ratio:
            scale, stairs = x / self.step_ratio, self.first_stair_count
        else:
            scale, stairs = (x - 1) / (self.step_ratio - 1), self.second_stair_count
        if stairs > 0:
            # Quantise from the integer offset, not the float scale (which can land just under
            # a stair boundary and drop a whole stair).
            in_cycle = batch % self.total_size
            if in_cycle <= self.first_step_size:
                position = in_cycle * stairs / self.first_step_size
            else:
                position = (self.total_size - in_cycle) * stairs / self.second_step_size
            scale = math.floor(position) / stairs
        return scale

    def lr_at(self, iteration: int) -> list[float]:
        if iteration < 0:
            return list(self.min_lrs)
        if iteration < self.total_size:
            scale = self._scale_factor(iteration)
            return [
                lo + (hi - lo) * scale for lo, hi in zip(self.min_lrs, self.max_lrs, strict=True)
            ]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        interval = (iteration - self.total_size + 1) / self.decay_step_size
        return [lo / (1 + self.decay_lr_rate * interval) for lo in self.min_lrs]

    def momentum_at(self, iteration: int) -> list[float]:
        """beta1 of each group at `iteration` (min momentum before the first step, as
        DeepSpeed sets it)."""
        if iteration < 0:
            return list(self.min_moms)
        if iteration < self.total_size:
            scale = self._scale_factor(iteration)
            return [
                hi - (hi - lo) * scale for lo, hi in zip(self.min_moms, self.max_moms, strict=True)
            ]
        if self.skip_mom_decay:
            return list(self.max_moms)
        interval = (iteration - self.total_size + 1) / self.decay_step_size
        return [hi * (1 + self.decay_mom_rate * interval) for hi in self.max_moms]

    def _apply(self, lrs: Sequence[float]) -> None:
        super()._apply(lrs)
        if self.cycle_momentum:
            moms = self.momentum_at(self.last_batch_iteration)
            for group, beta1 in zip(self.optimizer.param_groups, moms, strict=True):
                group["betas"] = (beta1, *tuple(group["betas"])[1:])


class LRRangeTest(_IterationScheduler):
    """Grow the lr from lr_range_test_min_lr by step_rate every step_size steps (to find a
    good maximum lr)."""

    def __init__(
        self,
        optimizer: Any,
        lr_range_test_min_lr: float | Sequence[float] = 1e-3,
        lr_range_test_step_size: int = 2000,
        lr_range_test_step_rate: float = 1.0,
        lr_range_test_staircase: bool = False,
        last_batch_iteration: int = -1,
    ):
        opt = _torch_optimizer(optimizer)
        self.min_lrs = _per_group(opt, lr_range_test_min_lr, "lr_range_test_min_lr")
        if (
            isinstance(lr_range_test_step_size, bool)
            or not isinstance(lr_range_test_step_size, int)
            or lr_range_test_step_size <= 0
        ):
            raise ConfigError(
                f"must be a positive integer, got {lr_range_test_step_size!r}",
                "scheduler.params.lr_range_test_step_size",
            )
        self.step_size = int(lr_range_test_step_size)
        self.step_rate = float(lr_range_test_step_rate)
        self.staircase = bool(lr_range_test_staircase)
        super().__init__(opt, last_batch_iteration)

    def lr_at(self, iteration: int) -> list[float]:
        interval = (iteration + 1) / self.step_size
        if self.staircase:
            interval = math.floor(interval)
        return [lo * (1 + self.step_rate * interval) for lo in self.min_lrs]


SCHEDULERS: dict[str, type[_IterationScheduler]] = {
    "WarmupLR": WarmupLR,
    "WarmupDecayLR": WarmupDecayLR,
    "WarmupCosineLR": WarmupCosineLR,
    "OneCycle": OneCycle,
    "LRRangeTest": LRRangeTest,
}


def build_scheduler(config: SchedulerConfig, optimizer: Any) -> LRScheduler:
    """The schedule `config` names, driving `optimizer` (a torch optimizer or a wrapper that
    holds one in `.optimizer`). Sets the optimizer's lr to the schedule's initial value."""
    params = config.full_params()
    return SCHEDULERS[config.type](optimizer, **params)
