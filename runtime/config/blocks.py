"""The training blocks of the config: precision, optimizer, ZeRO and its offload, activation
checkpointing, torch.compile. One frozen dataclass per DeepSpeed block, with DeepSpeed's keys and defaults
(docs/deepspeed-compat.md); each field is checked and normalised in `__post_init__`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .optimizer_names import check_optimizer
from .values import (
    ConfigError,
    IntOrAuto,
    as_bool,
    as_choice,
    as_float,
    as_int,
    check_field,
    describe,
    did_you_mean,
)

__all__ = [
    "ActivationCheckpointingConfig",
    "BF16Config",
    "CheckpointConfig",
    "CompileConfig",
    "FP16Config",
    "OffloadConfig",
    "OptimizerConfig",
    "ZeroConfig",
]


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
        check_field(self, "enabled", as_bool)
        check_field(self, "loss_scale", as_float, 0.0)
        check_field(self, "initial_scale_power", as_int, 0)
        check_field(self, "loss_scale_window", as_int, 1)
        check_field(self, "hysteresis", as_int, 1)
        check_field(self, "consecutive_hysteresis", as_bool)
        check_field(self, "min_loss_scale", as_float)
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
        check_field(self, "enabled", as_bool)
        check_field(self, "check_grad_overflow", as_bool)


@dataclass(frozen=True)
class OptimizerConfig:
    """`optimizer`: which optimizer the engine builds when the script does not pass one."""

    type: str
    """Adam (AdamW behaviour unless params.adam_w_mode is false), AdamW, SGD, or any
    torch.optim class name; matched case-insensitively."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the optimizer (lr, betas, eps, weight_decay, ...)."""

    def __post_init__(self) -> None:
        if not isinstance(self.params, Mapping):
            raise ConfigError(f"must be a mapping, got {describe(self.params)}", "params")
        if "max_grad_norm" in self.params:
            raise ConfigError(
                "is not an optimizer parameter here; remove it and set the top-level "
                '"gradient_clipping" key instead',
                "params.max_grad_norm",
            )
        check_optimizer(self.type, self.params)
        object.__setattr__(self, "params", dict(self.params))


@dataclass(frozen=True)
class OffloadConfig:
    """`zero_optimization.offload_*`: keep state in CPU memory (`offload_optimizer`: master
    weights and optimizer state; `offload_param`: parameter shards)."""

    device: Literal["none", "cpu", "nvme"] = "none"
    """Where the state lives between uses: "none" (the accelerator), "cpu", or "nvme" (files
    under `nvme_path`; `offload_optimizer` at stages 1-3, `offload_param` at stage 3)."""
    pin_memory: bool = True
    """Page-locked CPU memory: faster host-device copies, costs locked RAM."""
    nvme_path: str | None = None
    """With device "nvme": the directory (on a local disk) the swap files go under; each rank
    keeps a private directory there, removed at the end of the job."""
    buffer_count: int = 4
    """NVMe buffers in flight. `offload_param`: parameter shards written behind at once (the
    oldest is waited for before another starts). `offload_optimizer`: accepted, no effect:
    its swap holds about three sub-groups (the one updated, the next read, the last written)."""
    buffer_size: int = int(1e8)
    """DeepSpeed's NVMe parameter buffer size in elements; accepted, no effect here: each
    buffer is sized to the unit it holds."""
    max_in_cpu: int = int(1e9)
    """DeepSpeed's bound on the optimizer's CPU copy of 16-bit parameters under parameter
    NVMe offload; accepted, no effect here: no such copy is kept (every parameter shard is in
    the files, the fp32 masters where `offload_optimizer` puts them)."""

    def __post_init__(self) -> None:
        check_field(self, "device", as_choice, ("none", "cpu", "nvme"))
        check_field(self, "pin_memory", as_bool)
        if self.nvme_path is not None and not isinstance(self.nvme_path, str):
            raise ConfigError(f"must be a path string, got {describe(self.nvme_path)}", "nvme_path")
        check_field(self, "buffer_count", as_int, 0)
        check_field(self, "buffer_size", as_int, 0)
        check_field(self, "max_in_cpu", as_int, 0)
        if self.device == "nvme" and not self.nvme_path:
            raise ConfigError(
                'is "nvme" without "nvme_path": set nvme_path to a directory on a local disk',
                "device",
            )

    @property
    def enabled(self) -> bool:
        """True when the state is offloaded (device is not "none")."""
        return self.device != "none"


ZEROPP_SWITCHES = (
    "zero_quantized_weights",
    "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients",
)


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
    zero_hpz_partition_size: int = 1
    """ZeRO++ hpZ (stage 3): a second copy of the parameter shards split over groups of this
    many consecutive ranks, so backward gathers stay inside the group; 1 = off."""
    zero_quantized_weights: bool = False
    """ZeRO++ qwZ (stage 3): parameter all-gathers send int8 blocks with scales."""
    zero_quantized_nontrainable_weights: bool = False
    """ZeRO++ qwZ for frozen parameters only (stage 3)."""
    zero_quantized_gradients: bool = False
    """ZeRO++ qgZ (stage 3): gradient reduce-scatter by an all-to-all of int8 blocks, summed
    in fp32."""

    def __post_init__(self) -> None:
        if isinstance(self.stage, bool) or self.stage not in (0, 1, 2, 3):
            raise ConfigError(f"must be 0, 1, 2 or 3, got {describe(self.stage)}", "stage")
        object.__setattr__(self, "stage", int(self.stage))
        check_field(self, "allgather_partitions", as_bool)
        check_field(self, "allgather_bucket_size", as_int, 1)
        check_field(self, "reduce_scatter", as_bool)
        check_field(self, "reduce_bucket_size", as_int, 1, auto=True)
        if self.overlap_comm is None:
            object.__setattr__(self, "overlap_comm", self.stage == 3)
        check_field(self, "overlap_comm", as_bool)
        check_field(self, "contiguous_gradients", as_bool)
        check_field(self, "round_robin_gradients", as_bool)
        check_field(self, "sub_group_size", as_int, 1)
        for name in ("offload_optimizer", "offload_param"):
            if not isinstance(getattr(self, name), OffloadConfig):
                raise ConfigError("must be an OffloadConfig", name)
        check_field(self, "stage3_prefetch_bucket_size", as_int, 0, auto=True)
        check_field(self, "stage3_param_persistence_threshold", as_int, 0, auto=True)
        check_field(self, "stage3_max_live_parameters", as_int, 0)
        check_field(self, "stage3_max_reuse_distance", as_int, 0)
        check_field(self, "stage3_gather_16bit_weights_on_model_save", as_bool)
        check_field(self, "zero_hpz_partition_size", as_int, 1)
        for name in ZEROPP_SWITCHES:
            check_field(self, name, as_bool)
        if self.stage != 3:
            on = [n for n in ZEROPP_SWITCHES if getattr(self, n)]
            if self.zero_hpz_partition_size > 1:
                on.insert(0, "zero_hpz_partition_size")
            if on:
                raise ConfigError(
                    f"is a ZeRO++ setting, which works at stage 3 only (stage is {self.stage}); "
                    'set "stage": 3 or remove it',
                    on[0],
                )

    @property
    def zeropp(self) -> bool:
        """Any ZeRO++ feature is on."""
        return self.zero_hpz_partition_size > 1 or any(getattr(self, n) for n in ZEROPP_SWITCHES)


@dataclass(frozen=True)
class ActivationCheckpointingConfig:
    """`activation_checkpointing`: how `runtime.activation_checkpointing` keeps the inputs of
    checkpointed blocks (the model calls its `checkpoint`; this block sets options)."""

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
            check_field(self, name, as_bool)
        if self.number_checkpoints is not None:
            check_field(self, "number_checkpoints", as_int, 1)
        if self.contiguous_memory_optimization and self.number_checkpoints is None:
            raise ConfigError(
                "= true needs number_checkpoints (the number of checkpointed blocks in one "
                "forward: the buffer's slots); set it, or set "
                "contiguous_memory_optimization to false",
                "contiguous_memory_optimization",
            )


@dataclass(frozen=True)
class CheckpointConfig:
    """`checkpoint`: how `engine.save_checkpoint` writes. DeepSpeed's block holds only its
    other keys (below the table); `async_save` is this runtime's."""

    async_save: bool = False
    """`engine.save_checkpoint` returns once this rank's state is copied off the training
    tensors and writes the files in a background thread; `latest` still moves only after every
    rank's files are complete. `save_checkpoint(async_save=...)` overrides it per call."""

    def __post_init__(self) -> None:
        check_field(self, "async_save", as_bool)


# torch.compile's backends this runtime names before launch (the config is read without torch):
# torch's registered training backends. Any other backend is given as the import path of its
# function ("my_package.my_backend"), as DeepSpeed allows; the ranks import it.
COMPILE_BACKENDS = (
    "inductor",
    "aot_eager",
    "aot_eager_decomp_partition",
    "aot_eager_default_partitioner",
    "eager",
    "cudagraphs",
    "openxla",
    "tvm",
)
# torch.compile's keyword arguments (besides the model and the backend) and their checks.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_KWARGS = ("fullgraph", "dynamic", "mode", "options", "disable")


@dataclass(frozen=True)
class CompileConfig:
    """`compile`: compile the model with torch.compile (DeepSpeed 0.13-0.14's block: `enabled`,
    `backend`, `kwargs`; `engine.compile()` does the same from the script). DeepSpeed 0.19.8's
    DeepCompile keys are accepted while `deepcompile` is off (below the table)."""

    enabled: bool = False
    """Compile the model when the engine is built (stage 3: each repeated block on its own)."""
    backend: str = "inductor"
    """torch.compile's backend: a registered name, or the import path of a backend function."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """torch.compile's other arguments: fullgraph, dynamic, mode, options, disable."""

    def __post_init__(self) -> None:
        check_field(self, "enabled", as_bool)
        backend = self.backend
        if not isinstance(backend, str) or not (
            backend in COMPILE_BACKENDS or _import_path(backend)
        ):
            hint = did_you_mean(backend, COMPILE_BACKENDS) if isinstance(backend, str) else ""
            raise ConfigError(
                f"= {describe(backend)} is not a torch.compile backend; "
                + (hint + " " if hint else "")
                + "use one of "
                + ", ".join(repr(b) for b in COMPILE_BACKENDS)
                + ', or the import path of a backend function ("my_package.my_backend")',
                "backend",
            )
        if not isinstance(self.kwargs, Mapping):
            raise ConfigError(f"must be a mapping, got {describe(self.kwargs)}", "kwargs")
        kwargs = dict(self.kwargs)
        check_compile_kwargs(kwargs, "kwargs")
        object.__setattr__(self, "kwargs", kwargs)


def _import_path(name: str) -> bool:
    """``package.module.function``: dotted identifiers, at least two."""
    parts = name.split(".")
    return len(parts) >= 2 and all(part.isidentifier() for part in parts)


def check_compile_kwargs(kwargs: Mapping[str, Any], where: str) -> None:
    """torch.compile's keyword arguments, checked before anything compiles (`where` names
    them in messages: the config's ``compile.kwargs`` or ``engine.compile(compile_kwargs=)``)."""
    for key, value in kwargs.items():
        path = f"{where}.{key}"
        if key == "backend":
            raise ConfigError(
                "is not read from here; set the backend itself (compile.backend, or "
                "engine.compile(backend=...))",
                path,
            )
        if key not in COMPILE_KWARGS:
            hint = did_you_mean(str(key), COMPILE_KWARGS)
            raise ConfigError(
                "is not a torch.compile argument; "
                + (hint or "valid keys: " + ", ".join(COMPILE_KWARGS)),
                path,
            )
        if key in ("fullgraph", "disable"):
            as_bool(path, value)
        elif key == "dynamic" and value is not None:
            if not isinstance(value, bool):
                raise ConfigError(f"must be true, false or null, got {describe(value)}", path)
        elif key == "mode" and value is not None:
            as_choice(path, value, COMPILE_MODES)
        elif key == "options" and value is not None and not isinstance(value, Mapping):
            raise ConfigError(f"must be a mapping of inductor options, got {describe(value)}", path)
    if kwargs.get("mode") is not None and kwargs.get("options") is not None:
        raise ConfigError(
            "and options are both set; torch.compile takes one of them (put the mode's "
            "settings into options, or drop options)",
            f"{where}.mode",
        )
