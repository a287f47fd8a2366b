"""DeepSpeed's ``deepspeed.checkpointing`` functions: `configure`, `checkpoint` and the options and profile they share."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch

from runtime.config import ActivationCheckpointingConfig

from .function import Hooks, run_non_reentrant, run_reentrant
from .rng_tracker import (
    MODEL_PARALLEL_RNG,
    RNGStatesTracker,
    get_rng_tracker,
    model_parallel_manual_seed,
)
from .stash import Arena, ArenaFull, Stash

__all__ = [
    "ArenaFull",
    "CheckpointOptions",
    "RNGStatesTracker",
    "checkpoint",
    "configure",
    "get_cuda_rng_tracker",
    "get_rng_tracker",
    "is_configured",
    "model_parallel_cuda_manual_seed",
    "MODEL_PARALLEL_RNG",
    "model_parallel_manual_seed",
    "non_reentrant_checkpoint",
    "options",
    "partition_activations_in_checkpoint",
    "reset",
    "set_num_layers",
    "take_profile",
]

log = logging.getLogger("runtime.activation_checkpointing")

get_cuda_rng_tracker = get_rng_tracker  # DeepSpeed's / Megatron's name

# The options in force are the config block's dataclass: `configure` and the config check its
# arguments the same way, with the same messages.
CheckpointOptions = ActivationCheckpointingConfig


class _Profile:
    def __init__(self) -> None:
        self.forward_s = 0.0
        self.recompute_s = 0.0
        self.calls = 0
        self.recomputes = 0


class _Configuration(Hooks):
    """What `configure` set: options, the model-parallel group, buffers and timings."""

    def __init__(self) -> None:
        self.configured = False
        self.options = CheckpointOptions()
        self.mpu: Any = None
        self.mp = None
        self.arenas: dict[tuple, Arena] = {}
        self.totals = _Profile()

    @property
    def profiling(self) -> bool:  # type: ignore[override]
        return self.options.profile

    def stash(self) -> Stash:
        o = self.options
        return Stash(
            mp=self.mp,
            partition=o.partition_activations,
            to_cpu=o.cpu_checkpointing,
            contiguous_slots=o.number_checkpoints if o.contiguous_memory_optimization else None,
            arenas=self.arenas,
        )

    def boundary(self, tensors: list[torch.Tensor]) -> None:
        if self.options.synchronize_checkpoint_boundary:
            _synchronize(tensors)

    def timed(self, kind: str, seconds: float) -> None:
        if kind == "forward":
            self.totals.forward_s += seconds
            self.totals.calls += 1
        else:
            self.totals.recompute_s += seconds
            self.totals.recomputes += 1


_CONFIG = _Configuration()


def _synchronize(tensors: list[torch.Tensor]) -> None:
    """Wait for the device of these tensors (nothing to wait for on CPU)."""
    for t in tensors:
        if t is not None and t.device.type == "cuda":
            torch.cuda.synchronize(t.device)
            return


def _model_parallel(mpu: Any):
    """(rank, communicator) of the tensor-parallel group of a Megatron-style ``mpu``."""
    if mpu is None:
        return 0, None
    from runtime.distributed import Communicator

    if hasattr(mpu, "get_tensor_model_parallel_group"):
        group = mpu.get_tensor_model_parallel_group()
    else:
        group = mpu.get_model_parallel_group()
    comm = Communicator(group)
    return comm.rank, comm


def configure(
    mpu_: Any,
    deepspeed_config: Any = None,
    partition_activations: bool | None = None,
    contiguous_checkpointing: bool | None = None,
    num_checkpoints: int | None = None,
    checkpoint_in_cpu: bool | None = None,
    synchronize: bool | None = None,
    profile: bool | None = None,
) -> None:
    """Set the options (DeepSpeed's ``deepspeed.checkpointing.configure``).

    Starts from the defaults, then the ``activation_checkpointing`` block of
    ``deepspeed_config`` (a dict, a JSON/YAML path or a loaded Config), then the arguments
    given. ``mpu_`` (Megatron's interface) gives the model-parallel group that
    ``partition_activations`` splits over; None keeps the one configured before.
    """
    values: dict[str, Any] = {}
    if deepspeed_config is not None:
        from runtime.config import load_config

        loaded = (
            deepspeed_config
            if hasattr(deepspeed_config, "activation_checkpointing")
            else load_config(deepspeed_config)
        )
        block = loaded.activation_checkpointing
        values = {f.name: getattr(block, f.name) for f in dataclasses.fields(CheckpointOptions)}
    for name, given in (
        ("partition_activations", partition_activations),
        ("contiguous_memory_optimization", contiguous_checkpointing),
        ("number_checkpoints", num_checkpoints),
        ("cpu_checkpointing", checkpoint_in_cpu),
        ("synchronize_checkpoint_boundary", synchronize),
        ("profile", profile),
    ):
        if given is not None:
            values[name] = given
    new = CheckpointOptions(**values)
    if mpu_ is not None:
        _CONFIG.mpu = mpu_
        _, _CONFIG.mp = _model_parallel(mpu_)
    _CONFIG.options = new
    _CONFIG.arenas = {}
    _CONFIG.totals = _Profile()
    _CONFIG.configured = True
    if new.partition_activations and (_CONFIG.mp is None or _CONFIG.mp.world_size == 1):
        log.info("partition_activations: no model-parallel group larger than 1; nothing to split")


def is_configured() -> bool:
    """Whether `configure` ran (directly or through runtime.initialize)."""
    return _CONFIG.configured


def options() -> CheckpointOptions:
    return _CONFIG.options


def reset() -> None:
    """Free the contiguous buffers' slots (after forward passes that had no backward, e.g.
    evaluation with grad enabled)."""
    for arena in _CONFIG.arenas.values():
        arena.reset()


def take_profile() -> dict[str, float] | None:
    """Timings since the last call (``profile`` on), else None: seconds spent in checkpointed
    forwards and in recomputations, and how many of each."""
    if not _CONFIG.options.profile:
        return None
    t = _CONFIG.totals
    _CONFIG.totals = _Profile()
    return {
        "checkpoint_forward_s": t.forward_s,
        "checkpoint_recompute_s": t.recompute_s,
        "checkpoint_calls": t.calls,
        "checkpoint_recomputes": t.recomputes,
    }


def _with_kwargs(function: Callable, args: tuple, kwargs: dict) -> tuple[Callable, tuple]:
    if not kwargs:
        return function, args
    keys, n = tuple(kwargs), len(args)

    def call(*all_args):
        return function(*all_args[:n], **dict(zip(keys, all_args[n:], strict=True)))

    return call, args + tuple(kwargs.values())


def checkpoint(function: Callable, *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, keeping only its inputs for backward and recomputing
    the rest then (reentrant, as DeepSpeed's default). Without grad it just runs."""
    run, all_args = _with_kwargs(function, args, kwargs)
    if not torch.is_grad_enabled():
        return run(*all_args)
    return run_reentrant(run, _CONFIG.stash(), _CONFIG, all_args)


def non_reentrant_checkpoint(function: Callable, *args: Any, **kwargs: Any) -> Any:
    """`checkpoint` built on saved-tensor hooks: works when no input requires grad, and
    with ``torch.autograd.grad``."""
    run, all_args = _with_kwargs(function, args, kwargs)
    if not torch.is_grad_enabled():
        return run(*all_args)
    return run_non_reentrant(run, _CONFIG.stash(), _CONFIG, all_args)


def model_parallel_cuda_manual_seed(seed: int) -> None:
    """Seed the default generator with ``seed`` and the tracker's model-parallel state with
    ``seed + 2718 + model-parallel rank`` (of the configured mpu; 0 without one)."""
    rank = _CONFIG.mp.rank if _CONFIG.mp is not None else 0
    model_parallel_manual_seed(seed, rank)


# DeepSpeed's other module-level calls
def partition_activations_in_checkpoint(partition_activation: bool) -> None:
    _CONFIG.options = dataclasses.replace(
        _CONFIG.options, partition_activations=bool(partition_activation)
    )


def set_num_layers(nlayers: int) -> None:
    _CONFIG.options = dataclasses.replace(_CONFIG.options, number_checkpoints=nlayers)
    _CONFIG.arenas = {}


def _unconfigure() -> None:
    """Back to the state before any configure (tests)."""
    global _CONFIG
    _CONFIG = _Configuration()
