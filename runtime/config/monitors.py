"""The observability blocks of the config: TensorBoard, the collective log, the FLOPs profiler,
CSV and Weights & Biases. Each says what to record and where; the recording lives in
runtime.observe.monitors and runtime.observe.profiling. No torch.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from .values import (
    ConfigError,
    as_bool,
    as_float,
    as_int,
    as_str,
    check_field,
    describe,
    did_you_mean,
)

__all__ = [
    "COMM_OP_NAMES",
    "CommsLoggerConfig",
    "CsvMonitorConfig",
    "FlopsProfilerConfig",
    "TensorboardConfig",
    "WandbConfig",
]


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
        check_field(self, "enabled", as_bool)
        check_field(self, "output_path", as_str)
        check_field(self, "job_name", as_str)


# DeepSpeed's collective names (deepspeed.comm) -> the kinds runtime.distributed.comm counts.
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
    """Record every collective (runtime.observe.profiling.comms)."""
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
            check_field(self, name, as_bool)
        ops = self.prof_ops
        if not isinstance(ops, (list, tuple)) or not all(isinstance(o, str) for o in ops):
            raise ConfigError(
                f"must be a list of collective names, got {describe(ops)}", "prof_ops"
            )
        for op in ops:
            if op not in COMM_OP_NAMES:
                hint = did_you_mean(op, COMM_OP_NAMES)
                raise ConfigError(
                    f"names {describe(op)}, not a collective; "
                    + (hint or "valid: " + ", ".join(sorted(COMM_OP_NAMES))),
                    "prof_ops",
                )
        object.__setattr__(self, "prof_ops", tuple(ops))

    @property
    def kinds(self) -> frozenset[str] | None:
        """The runtime.distributed.comm kinds to record; None = all."""
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
        check_field(self, "enabled", as_bool)
        check_field(self, "profile_step", as_int, 1)
        check_field(self, "module_depth", as_int, -1)
        check_field(self, "top_modules", as_int, 1)
        check_field(self, "detailed", as_bool)
        if self.output_file is not None and not isinstance(self.output_file, str):
            raise ConfigError(
                f"must be a file path or null, got {describe(self.output_file)}", "output_file"
            )
        check_field(self, "recompute_fwd_factor", as_float, 0.0)
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
        check_field(self, "enabled", as_bool)
        check_field(self, "output_path", as_str)
        check_field(self, "job_name", as_str)


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
        check_field(self, "enabled", as_bool)
        check_field(self, "group", as_str, optional=True)
        check_field(self, "team", as_str, optional=True)
        check_field(self, "project", as_str, optional=True)
        if self.enabled:
            if importlib.util.find_spec("wandb") is None:
                raise ConfigError(
                    "= true but the wandb package is not installed; pip install wandb (set "
                    'WANDB_MODE=offline to log without network), or set "enabled": false',
                    "enabled",
                )
