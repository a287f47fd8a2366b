"""The training config: DeepSpeed's JSON/YAML schema as frozen dataclasses.

Users bring DeepSpeed configs, so the keys, defaults and the batch-size rules are DeepSpeed's
(see REFERENCE.md). Where DeepSpeed is lax we are strict and say how to fix it: unknown keys
anywhere (top level included) are errors that suggest the nearest valid key, duplicate keys
are errors, and both fp16 and bf16 enabled is an error. DeepSpeed blocks for features this
runtime does not implement are accepted while disabled and refused when enabled
(runtime.config_features).

This module must stay importable without torch: the launcher validates a config before it
contacts any host, and `zlaunch estimate` runs on machines without torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union

__all__ = [
    "AUTO",
    "SCHEDULER_PARAMS",
    "ActivationCheckpointingConfig",
    "REQUIRED",
    "BF16Config",
    "Config",
    "ConfigError",
    "ConfigWarning",
    "FP16Config",
    "OffloadConfig",
    "OptimizerConfig",
    "SchedulerConfig",
    "TensorboardConfig",
    "CommsLoggerConfig",
    "FlopsProfilerConfig",
    "CsvMonitorConfig",
    "WandbConfig",
    "ZeroConfig",
    "load_config",
]

AUTO = "auto"
"""The value that asks for a setting to be derived (batch sizes, bucket sizes)."""

Auto = Literal["auto"]
IntOrAuto = Union[int, Auto]


_MAX_KEY_CHARS = 120


class ConfigError(ValueError):
    """An invalid config; the message names the file (if any), the key path and the fix.

    `key` is the dotted key path ("zero_optimization.stage"), `problem` what is wrong with it,
    `origin` the file it came from.
    """

    def __init__(self, problem: str, key: str | None = None, origin: str | None = None):
        self.problem = problem
        if key is not None and len(key) > _MAX_KEY_CHARS:  # a hostile key is not echoed whole
            key = key[:_MAX_KEY_CHARS] + "..."
        self.key = key
        self.origin = origin
        text = f"{key} {problem}" if key else problem
        super().__init__(f"{origin}: {text}" if origin else text)

    def __reduce__(self):
        return (type(self), (self.problem, self.key, self.origin))

    def within(self, block: str) -> ConfigError:
        """The same error, with its key path nested under `block`."""
        key = f"{block}.{self.key}" if self.key else block
        return ConfigError(self.problem, key, self.origin)

    def from_file(self, origin: str | None) -> ConfigError:
        """The same error, naming the file it came from (kept if already named)."""
        return ConfigError(self.problem, self.key, self.origin or origin)


class ConfigWarning(UserWarning):
    """A config setting that has no effect here ("auto" with nothing to resolve it, offload at
    a stage that cannot use it)."""


# ---------------------------------------------------------------------------------------------
# Value checks. Each takes the key (for the message) and the value, returns the normalised value.


def _describe(value: Any) -> str:
    """A value as the config spells it, short enough for one line of an error message."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int) and value.bit_length() > 128:
        # str() of a huge int is slow, and refused beyond 4300 digits.
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value, default=_describe)[:60]
        except (ValueError, TypeError, RecursionError):  # circular, or a huge int inside
            return f"a {type(value).__name__}"
    return str(value)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"must be true or false, got {_describe(value)}", key)
    return value


def _int(key: str, value: Any, minimum: int | None = 0, *, auto: bool = False) -> int | str:
    """An integer; integral floats such as 5e8 (JSON has no integer exponent form) are accepted."""
    if auto and value == AUTO:
        return AUTO
    extra = ' or "auto"' if auto else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"must be an integer{extra}, got {_describe(value)}", key)
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ConfigError(f"must be an integer{extra}, got {_describe(value)}", key)
        value = int(value)
    if minimum is not None and value < minimum:
        raise ConfigError(f"must be >= {minimum}, got {_describe(value)}", key)
    return value


def _float(key: str, value: Any, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"must be a number, got {_describe(value)}", key)
    try:
        value = float(value)
    except OverflowError:  # an int beyond float range
        raise ConfigError(f"must be a finite number, got {_describe(value)}", key) from None
    if not math.isfinite(value):
        raise ConfigError(f"must be a finite number, got {value}", key)
    if minimum is not None and value < minimum:
        raise ConfigError(f"must be >= {minimum:g}, got {value:g}", key)
    return value


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ConfigError(f"must be one of {listed}, got {_describe(value)}", key)
    return value


def _suggest(key: str, valid: Any) -> str:
    if len(key) > _MAX_KEY_CHARS:  # nothing valid is that long; difflib would take seconds
        return ""
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else ""


def _check(obj: Any, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Validate and normalise one field of a frozen dataclass in `__post_init__`."""
    object.__setattr__(obj, name, fn(name, getattr(obj, name), *args, **kwargs))


# ---------------------------------------------------------------------------------------------
# The schema.


@dataclass(frozen=True)
class FP16Config:
    """`fp16`: mixed precision with 16-bit floats and loss scaling."""

    enabled: bool = False
    """Train with fp16 parameters/gradients and fp32 master weights."""
    loss_scale: float = 0.0
    """Static loss scale; 0 selects dynamic loss scaling."""
    initial_scale_power: int = 16
    """Dynamic scaling starts at 2**initial_scale_power."""
    loss_scale_window: int = 1000
    """Overflow-free steps before the dynamic scale doubles."""
    hysteresis: int = 2
    """Overflows tolerated before the dynamic scale halves."""
    consecutive_hysteresis: bool = False
    """Refill the hysteresis counter on every overflow-free step (not only when the scale grows)."""
    min_loss_scale: float = 1.0
    """The dynamic scale never goes below this; an overflow there is an error."""

    def __post_init__(self) -> None:
        _check(self, "enabled", _bool)
        _check(self, "loss_scale", _float, 0.0)
        _check(self, "initial_scale_power", _int, 0)
        _check(self, "loss_scale_window", _int, 1)
        _check(self, "hysteresis", _int, 1)
        _check(self, "consecutive_hysteresis", _bool)
        _check(self, "min_loss_scale", _float)
        if self.min_loss_scale <= 0:
            raise ConfigError(f"must be > 0, got {self.min_loss_scale:g}", "min_loss_scale")

    @property
    def dynamic(self) -> bool:
        """True when the loss scale adapts to overflows (loss_scale 0)."""
        return self.loss_scale == 0


@dataclass(frozen=True)
class BF16Config:
    """`bf16` (alias `bfloat16`): mixed precision with bfloat16; no loss scaling needed."""

    enabled: bool = False
    """Train with bf16 parameters/gradients and fp32 master weights."""
    check_grad_overflow: bool = True
    """Skip (and count) an optimizer step whose gradients hold inf or nan, as DeepSpeed's
    default does; false applies such a step (the weights become inf/nan) at stages 1-2, the
    only stages where DeepSpeed reads the key."""

    def __post_init__(self) -> None:
        _check(self, "enabled", _bool)
        _check(self, "check_grad_overflow", _bool)


@dataclass(frozen=True)
class OptimizerConfig:
    """`optimizer`: which optimizer the engine builds when the script does not pass one."""

    type: str
    """Adam (AdamW behaviour unless params.adam_w_mode is false), AdamW, SGD, or any
    torch.optim class name; matched case-insensitively."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the optimizer (lr, betas, eps, weight_decay, ...)."""

    def __post_init__(self) -> None:
        from .optimizer_names import check_optimizer

        if not isinstance(self.params, Mapping):
            raise ConfigError(f"must be a mapping, got {_describe(self.params)}", "params")
        if "max_grad_norm" in self.params:
            raise ConfigError(
                "is not an optimizer parameter here; remove it and set the top-level "
                '"gradient_clipping" key instead',
                "params.max_grad_norm",
            )
        check_optimizer(self.type, self.params)
        object.__setattr__(self, "params", dict(self.params))


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
    """The schedule's parameters, with DeepSpeed's names; missing ones take the defaults in
    SCHEDULER_PARAMS."""

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or self.type not in SCHEDULER_PARAMS:
            names = ", ".join(SCHEDULER_PARAMS)
            hint = _suggest(self.type, SCHEDULER_PARAMS) if isinstance(self.type, str) else ""
            for name in SCHEDULER_PARAMS:
                if isinstance(self.type, str) and name.lower() == self.type.lower():
                    hint = f"did you mean '{name}'? (names are case-sensitive)"
            raise ConfigError(
                f"must be one of {names}, got {_describe(self.type)}"
                + (f"; {hint}" if hint else ""),
                "type",
            )
        if not isinstance(self.params, Mapping):
            raise ConfigError(f"must be a mapping, got {_describe(self.params)}", "params")
        known = SCHEDULER_PARAMS[self.type]
        params = dict(self.params)
        for name, value in params.items():
            key = f"params.{name}"
            if name not in known:
                hint = _suggest(name, known)
                raise ConfigError(
                    f"is not a parameter of {self.type}"
                    + (f"; {hint}" if hint else f"; valid: {', '.join(known)}"),
                    key,
                )
            if value is None and known[name] is None:
                continue
            if name in _SCHEDULER_INT_PARAMS:
                params[name] = _int(key, value, _SCHEDULER_INT_PARAMS[name])
            elif name in _SCHEDULER_BOOL_PARAMS:
                params[name] = _bool(key, value)
            elif name == "warmup_type":
                params[name] = _choice(key, value, ("log", "linear"))
            elif name in _SCHEDULER_PER_GROUP_PARAMS and isinstance(value, (list, tuple)):
                params[name] = [_float(f"{key}[{i}]", v, 0.0) for i, v in enumerate(value)]
            else:
                params[name] = _float(key, value)
        missing = [n for n, d in known.items() if d is REQUIRED and n not in params]
        if missing:
            raise ConfigError(
                f"is required by {self.type}; add it to params", f"params.{missing[0]}"
            )
        object.__setattr__(self, "params", params)

    def full_params(self) -> dict[str, Any]:
        """Every parameter of the schedule: the given ones over the defaults."""
        return {**SCHEDULER_PARAMS[self.type], **self.params}


@dataclass(frozen=True)
class OffloadConfig:
    """`zero_optimization.offload_optimizer` / `offload_param`: keep state in CPU memory."""

    device: Literal["none", "cpu"] = "none"
    """Where the state lives between uses: "none" (the accelerator) or "cpu"."""
    pin_memory: bool = True
    """Page-locked CPU memory: faster host-device copies, costs locked RAM."""
    nvme_path: str | None = None
    """Kept for compatibility; NVMe offload is not supported."""
    buffer_count: int = 4
    """NVMe buffer pool size (compatibility only)."""
    buffer_size: int = int(1e8)
    """NVMe buffer size in elements (compatibility only)."""
    max_in_cpu: int = int(1e9)
    """Elements kept in CPU memory under NVMe offload (compatibility only)."""

    def __post_init__(self) -> None:
        if self.device == "nvme":
            raise ConfigError(
                'is "nvme", which this runtime does not support; use "cpu" (or "none")', "device"
            )
        _check(self, "device", _choice, ("none", "cpu"))
        _check(self, "pin_memory", _bool)
        if self.nvme_path is not None and not isinstance(self.nvme_path, str):
            raise ConfigError(
                f"must be a path string, got {_describe(self.nvme_path)}", "nvme_path"
            )
        _check(self, "buffer_count", _int, 0)
        _check(self, "buffer_size", _int, 0)
        _check(self, "max_in_cpu", _int, 0)

    @property
    def enabled(self) -> bool:
        """True when the state is offloaded (device is not "none")."""
        return self.device != "none"


@dataclass(frozen=True)
class ZeroConfig:
    """`zero_optimization`: what is partitioned across data-parallel ranks, and how."""

    stage: int = 0
    """0: plain data parallel; 1: optimizer state partitioned; 2: + gradients; 3: + parameters."""
    allgather_partitions: bool = True
    """Gather updated parameters with all-gather (true) or one broadcast per rank (false);
    stages 1-2 (stage 3 always all-gathers)."""
    allgather_bucket_size: int = int(5e8)
    """Elements all-gathered at a time after the step (stages 1-2)."""
    reduce_scatter: bool = True
    """Reduce gradients with reduce-scatter (true) or all-reduce keeping this rank's part
    (false); stages 1-2 (stage 3 always reduce-scatters)."""
    reduce_bucket_size: IntOrAuto = int(5e8)
    """Elements reduced at a time; "auto" = hidden_size**2."""
    overlap_comm: bool | None = None
    """Overlap gradient reduction with backward; unset means true for stage 3, false otherwise."""
    contiguous_gradients: bool = True
    """Copy gradients into one contiguous buffer as they are produced."""
    round_robin_gradients: bool = False
    """DeepSpeed's ordering of gradient copies to CPU under offload; accepted and has no
    effect here (a performance knob that changes no result)."""
    sub_group_size: int = int(1e9)
    """Elements per optimizer-step tile (bounds the step's working set)."""
    offload_optimizer: OffloadConfig = field(default_factory=OffloadConfig)
    """Keep fp32 master weights and optimizer state in CPU memory; step there (stages 1-3)."""
    offload_param: OffloadConfig = field(default_factory=lambda: OffloadConfig(buffer_count=5))
    """Keep parameter shards in CPU memory between uses (stage 3 only)."""
    stage3_prefetch_bucket_size: IntOrAuto = int(5e7)
    """Elements fetched ahead of use; "auto" = 0.9 * hidden_size**2."""
    stage3_param_persistence_threshold: IntOrAuto = int(1e5)
    """Parameters smaller than this stay whole on every rank; "auto" = 10 * hidden_size."""
    stage3_max_live_parameters: int = int(1e9)
    """Upper bound of gathered parameter elements resident at once."""
    stage3_max_reuse_distance: int = int(1e9)
    """Keep a gathered parameter if it is reused within this many elements of fetches."""
    stage3_gather_16bit_weights_on_model_save: bool = False
    """save_16bit_model() gathers the full weights and writes them from rank 0."""

    def __post_init__(self) -> None:
        if isinstance(self.stage, bool) or self.stage not in (0, 1, 2, 3):
            raise ConfigError(f"must be 0, 1, 2 or 3, got {_describe(self.stage)}", "stage")
        object.__setattr__(self, "stage", int(self.stage))
        _check(self, "allgather_partitions", _bool)
        _check(self, "allgather_bucket_size", _int, 1)
        _check(self, "reduce_scatter", _bool)
        _check(self, "reduce_bucket_size", _int, 1, auto=True)
        if self.overlap_comm is None:
            object.__setattr__(self, "overlap_comm", self.stage == 3)
        _check(self, "overlap_comm", _bool)
        _check(self, "contiguous_gradients", _bool)
        _check(self, "round_robin_gradients", _bool)
        _check(self, "sub_group_size", _int, 1)
        for name in ("offload_optimizer", "offload_param"):
            if not isinstance(getattr(self, name), OffloadConfig):
                raise ConfigError("must be an OffloadConfig", name)
        _check(self, "stage3_prefetch_bucket_size", _int, 0, auto=True)
        _check(self, "stage3_param_persistence_threshold", _int, 0, auto=True)
        _check(self, "stage3_max_live_parameters", _int, 0)
        _check(self, "stage3_max_reuse_distance", _int, 0)
        _check(self, "stage3_gather_16bit_weights_on_model_save", _bool)


@dataclass(frozen=True)
class TensorboardConfig:
    """`tensorboard`: write step metrics as TensorBoard events."""

    enabled: bool = False
    """Write events (needs the `tensorboard` extra)."""
    output_path: str = ""
    """Directory of the event files; empty = ./runs."""
    job_name: str = ""
    """Subdirectory per job; empty = "DeepSpeedJobName" as DeepSpeed does."""

    def __post_init__(self) -> None:
        _check(self, "enabled", _bool)
        for name in ("output_path", "job_name"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"must be a string, got {_describe(getattr(self, name))}", name)


# DeepSpeed's collective names (deepspeed.comm) -> the kinds runtime.comm counts.
COMM_OP_NAMES = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_fn": "reduce_scatter",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "allgather_fn": "all_gather",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
}


@dataclass(frozen=True)
class CommsLoggerConfig:
    """`comms_logger`: count, bytes, latency and bandwidth per collective kind and size."""

    enabled: bool = False
    """Record every collective (runtime.profiling.comms)."""
    verbose: bool = False
    """Log each collective as it completes (rank 0)."""
    prof_all: bool = True
    """Record every kind of collective; false = only those in prof_ops."""
    prof_ops: tuple[str, ...] = ()
    """Collectives to record when prof_all is false (DeepSpeed's names, e.g. "all_reduce")."""
    debug: bool = False
    """Name the calling function in verbose lines."""

    def __post_init__(self) -> None:
        for name in ("enabled", "verbose", "prof_all", "debug"):
            _check(self, name, _bool)
        ops = self.prof_ops
        if not isinstance(ops, (list, tuple)) or not all(isinstance(o, str) for o in ops):
            raise ConfigError(f"must be a list of collective names, got {_describe(ops)}", "prof_ops")
        for op in ops:
            if op not in COMM_OP_NAMES:
                hint = _suggest(op, COMM_OP_NAMES)
                raise ConfigError(
                    f"names {_describe(op)}, not a collective; "
                    + (hint or "valid: " + ", ".join(sorted(COMM_OP_NAMES))),
                    "prof_ops",
                )
        object.__setattr__(self, "prof_ops", tuple(ops))

    @property
    def kinds(self) -> frozenset[str] | None:
        """The runtime.comm kinds to record; None = all."""
        if self.prof_all:
            return None
        return frozenset(COMM_OP_NAMES[o] for o in self.prof_ops)


@dataclass(frozen=True)
class FlopsProfilerConfig:
    """`flops_profiler`: per-module parameters, FLOPs and latency at one step."""

    enabled: bool = False
    """Profile the step `profile_step`."""
    profile_step: int = 1
    """The optimizer step (counted from 1) to profile."""
    module_depth: int = -1
    """Deepest module level in the table; -1 = all."""
    top_modules: int = 1
    """Modules listed per depth in the summary of the most expensive ones."""
    detailed: bool = True
    """Print the per-module tree, not only the summary."""
    output_file: str | None = None
    """Write the table (plain text) here instead of printing it."""
    recompute_fwd_factor: float = 0.0
    """DeepSpeed's allowance for activation recomputation; recomputation is measured here, so
    only 0 is accepted."""

    def __post_init__(self) -> None:
        _check(self, "enabled", _bool)
        _check(self, "profile_step", _int, 1)
        _check(self, "module_depth", _int, -1)
        _check(self, "top_modules", _int, 1)
        _check(self, "detailed", _bool)
        if self.output_file is not None and not isinstance(self.output_file, str):
            raise ConfigError(
                f"must be a file path or null, got {_describe(self.output_file)}", "output_file"
            )
        _check(self, "recompute_fwd_factor", _float, 0.0)
        if self.recompute_fwd_factor != 0.0:
            raise ConfigError(
                "is not supported: FLOPs are counted as they run, recomputation included; "
                "remove it",
                "recompute_fwd_factor",
            )


@dataclass(frozen=True)
class CsvMonitorConfig:
    """`csv_monitor`: one CSV file per metric under output_path/job_name (DeepSpeed's layout)."""

    enabled: bool = False
    """Write the CSV files (rank 0)."""
    output_path: str = ""
    """Directory of the job directories; empty = the working directory."""
    job_name: str = "DeepSpeedJobName"
    """Subdirectory of this job."""

    def __post_init__(self) -> None:
        _check(self, "enabled", _bool)
        for name in ("output_path", "job_name"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"must be a string, got {_describe(getattr(self, name))}", name)


@dataclass(frozen=True)
class WandbConfig:
    """`wandb`: step metrics to Weights & Biases (rank 0; WANDB_MODE=offline works offline)."""

    enabled: bool = False
    """Log to W&B (needs the wandb package)."""
    group: str | None = None
    """Run group."""
    team: str | None = None
    """Entity (team or user)."""
    project: str = "deepspeed"
    """Project."""

    def __post_init__(self) -> None:
        _check(self, "enabled", _bool)
        for name in ("group", "team", "project"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"must be a string, got {_describe(value)}", name)
        if self.enabled:
            import importlib.util

            if importlib.util.find_spec("wandb") is None:
                raise ConfigError(
                    "= true but the wandb package is not installed; pip install wandb (set "
                    'WANDB_MODE=offline to log without network), or set "enabled": false',
                    "enabled",
                )


@dataclass(frozen=True)
class ActivationCheckpointingConfig:
    """`activation_checkpointing`: how runtime.checkpointing keeps the inputs of checkpointed
    blocks (the model calls ``runtime.checkpointing.checkpoint``; this block sets options)."""

    partition_activations: bool = False
    """Each model-parallel rank keeps 1/N of every checkpoint input; gathered to recompute."""
    contiguous_memory_optimization: bool = False
    """Checkpoint inputs go into one preallocated buffer (needs number_checkpoints)."""
    number_checkpoints: int | None = None
    """Checkpointed blocks per forward: the slots of the contiguous buffer."""
    cpu_checkpointing: bool = False
    """Checkpoint inputs wait in host memory until recomputation."""
    synchronize_checkpoint_boundary: bool = False
    """Synchronize the device at each checkpoint's forward and backward boundaries."""
    profile: bool = False
    """Time checkpointed forwards and recomputations; reported with the step metrics."""

    def __post_init__(self) -> None:
        for name in (
            "partition_activations",
            "contiguous_memory_optimization",
            "cpu_checkpointing",
            "synchronize_checkpoint_boundary",
            "profile",
        ):
            _check(self, name, _bool)
        if self.number_checkpoints is not None:
            _check(self, "number_checkpoints", _int, 1)
        if self.contiguous_memory_optimization and self.number_checkpoints is None:
            raise ConfigError(
                "= true needs number_checkpoints (the number of checkpointed blocks in one "
                "forward: the buffer's slots); set it, or set "
                "contiguous_memory_optimization to false",
                "contiguous_memory_optimization",
            )


_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


@dataclass(frozen=True)
class Config:
    """A whole training config. Build it with `load_config`; `resolve` fills what is derived."""

    train_batch_size: IntOrAuto | None = None
    """Samples per optimizer step over all ranks = micro batch * accumulation * world size."""
    train_micro_batch_size_per_gpu: IntOrAuto | None = None
    """Samples per forward/backward on one rank."""
    gradient_accumulation_steps: IntOrAuto | None = None
    """Micro batches accumulated per optimizer step."""
    gradient_clipping: float = 1.0
    """Clip the global gradient norm to this; 0 disables."""
    steps_per_print: int = 10
    """Rank 0 logs progress every this many optimizer steps."""
    dataloader_drop_last: bool = False
    """The engine's DataLoader drops the last incomplete micro batch."""
    fp16: FP16Config = field(default_factory=FP16Config)
    """fp16 mixed precision and loss scaling."""
    bf16: BF16Config = field(default_factory=BF16Config)
    """bf16 mixed precision."""
    optimizer: OptimizerConfig | None = None
    """The optimizer built when the script passes none."""
    scheduler: SchedulerConfig | None = None
    """The learning-rate schedule built when the script passes none."""
    zero_optimization: ZeroConfig = field(default_factory=ZeroConfig)
    """ZeRO partitioning and buckets."""
    tensorboard: TensorboardConfig = field(default_factory=TensorboardConfig)
    """TensorBoard metrics."""
    activation_checkpointing: ActivationCheckpointingConfig = field(
        default_factory=ActivationCheckpointingConfig
    )
    """Options of runtime.checkpointing (activation checkpointing)."""
    wall_clock_breakdown: bool = False
    """Time forward, backward, reduction wait, all-gather wait and optimizer step on every
    rank; rank 0's and the slowest rank's figures go with the step metrics."""
    comms_logger: CommsLoggerConfig = field(default_factory=CommsLoggerConfig)
    """Per-collective log: count, bytes, latency, bandwidth."""
    flops_profiler: FlopsProfilerConfig = field(default_factory=FlopsProfilerConfig)
    """Per-module FLOPs and latency at one step."""
    csv_monitor: CsvMonitorConfig = field(default_factory=CsvMonitorConfig)
    """Step metrics as CSV files."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Step metrics to Weights & Biases."""
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The mapping the config was read from, for the record."""
    source: str | None = None
    """The file the config was read from, if any."""

    def __post_init__(self) -> None:
        for name in _BATCH_KEYS:
            value = getattr(self, name)
            if value is not None:
                _check(self, name, _int, 1, auto=True)
        _check(self, "gradient_clipping", _float, 0.0)
        _check(self, "steps_per_print", _int, 1)
        _check(self, "dataloader_drop_last", _bool)
        _check(self, "wall_clock_breakdown", _bool)
        for name, cls in (
            ("fp16", FP16Config),
            ("bf16", BF16Config),
            ("zero_optimization", ZeroConfig),
            ("tensorboard", TensorboardConfig),
            ("activation_checkpointing", ActivationCheckpointingConfig),
            ("comms_logger", CommsLoggerConfig),
            ("flops_profiler", FlopsProfilerConfig),
            ("csv_monitor", CsvMonitorConfig),
            ("wandb", WandbConfig),
        ):
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"must be a {cls.__name__}", name)
        if self.fp16.enabled and self.bf16.enabled:
            raise ConfigError(
                "fp16.enabled and bf16.enabled are both true; enable at most one of them"
            )

    @property
    def precision(self) -> Literal["fp32", "fp16", "bf16"]:
        """The training precision: "fp16", "bf16" or "fp32"."""
        if self.fp16.enabled:
            return "fp16"
        if self.bf16.enabled:
            return "bf16"
        return "fp32"

    @property
    def is_resolved(self) -> bool:
        """True when the batch triple is filled and no "auto" is left."""
        zero = self.zero_optimization
        values = [getattr(self, k) for k in _BATCH_KEYS] + [
            zero.reduce_bucket_size,
            zero.stage3_prefetch_bucket_size,
            zero.stage3_param_persistence_threshold,
        ]
        return all(v is not None and v != AUTO for v in values)

    def resolve(self, world_size: int, hidden_size: int | None = None) -> Config:
        """A copy with the batch triple filled and every "auto" resolved.

        Two of the batch keys derive the third (floor division); only train_batch_size gives
        accumulation 1; only the micro batch gives accumulation 1; "auto" counts as not given.
        Bucket sizes marked "auto" follow the Hugging Face integration: reduce_bucket_size =
        h*h, stage3_prefetch_bucket_size = int(0.9*h*h), stage3_param_persistence_threshold =
        10*h for the model's hidden size h; without a hidden size the defaults apply.
        """
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ConfigError(f"world_size must be a positive integer, got {world_size!r}")
        if hidden_size is not None and (
            isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size < 1
        ):
            raise ConfigError(f"hidden_size must be a positive integer, got {hidden_size!r}")
        try:
            tb, mb, gas = _resolve_batch(self, world_size)
        except ConfigError as err:
            raise err.from_file(self.source) from None
        zero = self.zero_optimization
        defaults = {f.name: f.default for f in dataclasses.fields(ZeroConfig)}
        derived = {}
        if hidden_size is not None:
            derived = {
                "reduce_bucket_size": hidden_size * hidden_size,
                "stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
                "stage3_param_persistence_threshold": 10 * hidden_size,
            }
        updates = {}
        for name in (
            "reduce_bucket_size",
            "stage3_prefetch_bucket_size",
            "stage3_param_persistence_threshold",
        ):
            if getattr(zero, name) == AUTO:
                updates[name] = derived.get(name, defaults[name])
        return dataclasses.replace(
            self,
            train_batch_size=tb,
            train_micro_batch_size_per_gpu=mb,
            gradient_accumulation_steps=gas,
            zero_optimization=dataclasses.replace(zero, **updates),
        )


def _resolve_batch(config: Config, world: int) -> tuple[int, int, int]:
    def given(name: str) -> int | None:
        value = getattr(config, name)
        return None if value in (None, AUTO) else value

    tb, mb, gas = (given(k) for k in _BATCH_KEYS)
    if tb is not None and mb is not None and gas is not None:
        pass
    elif tb is not None and mb is not None:
        gas = tb // mb // world
    elif tb is not None and gas is not None:
        mb = tb // world // gas
    elif mb is not None and gas is not None:
        tb = mb * gas * world
    elif tb is not None:
        gas, mb = 1, tb // world
    elif mb is not None:
        gas, tb = 1, mb * world
    else:
        raise ConfigError(
            "set train_micro_batch_size_per_gpu (samples per rank per step) or train_batch_size "
            "(samples per optimizer step over all ranks); neither is given"
            + (" (gradient_accumulation_steps alone cannot derive them)" if gas else "")
        )
    if tb != mb * gas * world or min(tb, mb, gas) < 1:
        raise ConfigError(
            f"train_batch_size {tb} must equal train_micro_batch_size_per_gpu {mb} * "
            f"gradient_accumulation_steps {gas} * world size {world} (= {mb * gas * world}); "
            "change one of them, or leave one of the three keys out so that it is derived"
        )
    return tb, mb, gas


def load_config(
    source: Mapping[str, Any] | str | os.PathLike, *, origin: str | None = None
) -> Config:
    """Read and validate a config from a mapping or a .json/.yaml/.yml file.

    `origin` names the config in messages (default: the path as given). Raises ConfigError
    (unknown keys, bad values, features turned on that this runtime does not implement); warns
    (ConfigWarning, one line each) about settings that have no effect here. "auto" values are
    kept; `Config.resolve` fills them.
    """
    from .config_load import read_config  # DeepSpeed's key tables and the file readers

    config, notes = read_config(source, origin)
    for note in notes:
        warnings.warn(note, ConfigWarning, stacklevel=2)
    return config
