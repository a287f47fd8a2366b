"""The whole training config (`Config`): the top-level keys, the blocks, and the batch rules.

`Config.resolve` fills what is derived once the world size is known: the batch triple and the
bucket sizes left "auto". Reading a file or a mapping into a Config is runtime.config.load's
job; this module knows nothing of it. No torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .blocks import (
    ActivationCheckpointingConfig,
    BF16Config,
    CheckpointConfig,
    CompileConfig,
    FP16Config,
    OptimizerConfig,
    ZeroConfig,
)
from .monitors import (
    CommsLoggerConfig,
    CsvMonitorConfig,
    FlopsProfilerConfig,
    TensorboardConfig,
    WandbConfig,
)
from .scheduler import SchedulerConfig
from .values import (
    AUTO,
    ConfigError,
    IntOrAuto,
    as_bool,
    as_float,
    as_int,
    check_field,
    describe,
)

__all__ = ["BATCH_KEYS", "COMM_DTYPES", "Config", "resolve_batch"]

COMM_DTYPES = ("fp32", "fp16", "bf16")
_COMM_DTYPE_SPELLINGS = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
}


def as_comm_dtype(key: str, value: Any) -> str | None:
    """DeepSpeed's `communication_data_type`: "fp32", "fp16" or "bf16" in any case, or null."""
    if value is None:
        return None
    if isinstance(value, str) and value.lower() in COMM_DTYPES:
        return value.lower()
    hint = ""
    if isinstance(value, str) and value.lower() in _COMM_DTYPE_SPELLINGS:
        hint = f' (write "{_COMM_DTYPE_SPELLINGS[value.lower()]}", as DeepSpeed reads it)'
    raise ConfigError(
        f'must be "fp32", "fp16" or "bf16" (or null: the training dtype), got {describe(value)}'
        + hint,
        key,
    )


BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


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
    steps_per_print: int | None = 10
    """Rank 0 logs progress every this many optimizer steps; null, or DeepSpeed's `inf` (which
    accelerate writes into the configs it hands over): never."""
    dataloader_drop_last: bool = False
    """The engine's DataLoader drops the last incomplete micro batch."""
    communication_data_type: Literal["fp32", "fp16", "bf16"] | None = None
    """The dtype gradients are reduced in ("fp16", "bf16", "fp32", any case); null: the
    training dtype. What is summed in which dtype: docs/gradient-communication.md."""
    prescale_gradients: bool = False
    """Divide gradients by the data-parallel world size before the reduction (DeepSpeed)."""
    gradient_predivide_factor: float = 1.0
    """Without prescale_gradients: divide by this before the reduction and by world / this
    after it (DeepSpeed's stage 0, and stages 1-2 with reduce_scatter false)."""
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
    compile: CompileConfig = field(default_factory=CompileConfig)
    """torch.compile of the model (also engine.compile())."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """How checkpoints are written."""
    tensorboard: TensorboardConfig = field(default_factory=TensorboardConfig)
    """TensorBoard metrics."""
    activation_checkpointing: ActivationCheckpointingConfig = field(
        default_factory=ActivationCheckpointingConfig
    )
    """Options of runtime.activation_checkpointing (activation checkpointing)."""
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
    raw: Mapping[str, Any] = field(
        default_factory=dict, compare=False, repr=False, metadata={"config_key": False}
    )
    """The mapping the config was read from, for the record (not a key of the config)."""
    source: str | None = field(default=None, metadata={"config_key": False})
    """The file the config was read from, if any (not a key of the config)."""

    def __post_init__(self) -> None:
        for name in BATCH_KEYS:
            value = getattr(self, name)
            if value is not None:
                check_field(self, name, as_int, 1, auto=True)
        check_field(self, "gradient_clipping", as_float, 0.0)
        if self.steps_per_print == math.inf:
            object.__setattr__(self, "steps_per_print", None)
        if self.steps_per_print is not None:
            check_field(self, "steps_per_print", as_int, 1)
        check_field(self, "dataloader_drop_last", as_bool)
        check_field(self, "communication_data_type", as_comm_dtype)
        check_field(self, "prescale_gradients", as_bool)
        check_field(self, "gradient_predivide_factor", as_float)
        if not self.gradient_predivide_factor > 0:
            raise ConfigError(
                f"must be > 0, got {self.gradient_predivide_factor:g}", "gradient_predivide_factor"
            )
        check_field(self, "wall_clock_breakdown", as_bool)
        for name, cls in (
            ("fp16", FP16Config),
            ("bf16", BF16Config),
            ("zero_optimization", ZeroConfig),
            ("compile", CompileConfig),
            ("checkpoint", CheckpointConfig),
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

    def get(self, key: str, default: Any = None) -> Any:
        """The value of top-level ``key`` as the config was written (``raw``), else ``default``.

        DeepSpeed's ``engine.config`` is the config mapping, and the Hugging Face Trainer reads
        it so (``engine.config.get("zero_optimization", {})``). A copy: changing it changes
        nothing in training."""
        import copy

        return copy.deepcopy(self.raw.get(key, default))

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
        values = [getattr(self, k) for k in BATCH_KEYS] + [
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
            tb, mb, gas = resolve_batch(self, world_size)
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


def resolve_batch(config: Config, world: int) -> tuple[int, int, int]:
    def given(name: str) -> int | None:
        value = getattr(config, name)
        return None if value in (None, AUTO) else value

    tb, mb, gas = (given(k) for k in BATCH_KEYS)
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
