"""How the engine drives a ZeRO sharding strategy, whatever the stage.

Stages 0-2 (`flat_strategy`: one flat buffer cut into buckets, gradients reduced bucket by
bucket while backward runs) and stage 3 (`stage3.build`: parameters partitioned per module
unit, gathered when modules run) are siblings behind `ShardingStrategy`; `runtime.zero.builder`
picks one from the config. The engine holds that one object and calls nothing else of ZeRO.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from runtime.distributed import Communicator
from runtime.optim import Precision, StepRiders
from zlaunch.wire import protocol

from ..errors import InvalidTypeError, InvalidValueError
from .nvme import SwapDir, Swapper, hold_mmap_threshold
from .optimizer import OwnedRange, StepOutcome, ZeroOptimizer
from .partition import FlatLayout

__all__ = ["ShardingStrategy", "StrategyInputs", "TrainedParam"]


@dataclass(frozen=True)
class StrategyInputs:
    """What every strategy is built from."""

    module: torch.nn.Module
    groups: list[tuple[dict, list[torch.nn.Parameter]]]
    """(options, trainable parameters) per optimizer param group."""
    config: Any
    comm: Communicator
    """The data-parallel group."""
    precision: Precision
    device: torch.device
    make_optimizer: Callable[[list[dict]], torch.optim.Optimizer]
    """Builds the torch optimizer over this rank's master weights."""
    model_parallel: Any
    """runtime.engine.model_parallel.ModelParallel: the gradient norm's scope with an mpu."""
    global_rank: int
    step_riders: StepRiders | None = None
    """The step metrics' numbers that ride with the gradient-norm all-reduce."""

    def optimizer_options(self) -> dict[str, Any]:
        """The `ZeroOptimizer` arguments every stage takes from the config and the script."""
        zero = self.config.zero_optimization
        off = zero.offload_optimizer
        return {
            "precision": self.precision,
            "offload": zero.offload_optimizer.enabled,
            "pin_memory": zero.offload_optimizer.pin_memory,
            "clip": float(self.config.gradient_clipping or 0.0),
            "make_optimizer": self.make_optimizer,
            "group_options": [opts for opts, _ in self.groups],
            "riders": self.step_riders,
            "open_swapper": self._optimizer_swapper() if off.device == "nvme" else None,
        }

    def _optimizer_swapper(self) -> Callable[[], Swapper]:
        return self._swapper(self.config.zero_optimization.offload_optimizer.nvme_path, "")

    def param_swapper(self) -> Swapper:
        """The swapper of ``offload_param.device: nvme`` (stage 3's parameter shards): a
        private directory of its own, next to the optimizer's when both paths are the same."""
        return self._swapper(self.config.zero_optimization.offload_param.nvme_path, "-params")()

    def _swapper(self, nvme_path: str, suffix: str) -> Callable[[], Swapper]:
        run_id = (os.environ.get(protocol.RUN_ID_ENV) or "job") + suffix
        rank = self.global_rank
        # DeepSpeed's aio block, read for the meaning it has for a thread pool: a request is
        # block_size bytes, and thread_count x queue_depth requests are in flight at once.
        aio = (getattr(self.config, "raw", None) or {}).get("aio") or {}
        knobs = {"block_size": 1 << 20, "queue_depth": 8, "thread_count": 1}
        for key in knobs:
            value = aio.get(key, knobs[key])
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidValueError(
                    f"aio.{key} must be a positive integer, got {value!r}; fix it in the config"
                )
            knobs[key] = value
        workers = knobs["thread_count"] * knobs["queue_depth"]
        hold_mmap_threshold()  # what the step frees must leave the resident set (host_memory)
        return lambda: Swapper(
            SwapDir(nvme_path, rank=rank, run_id=run_id),
            workers=workers,
            block_size=knobs["block_size"],
        )


@dataclass(frozen=True)
class TrainedParam:
    shape: tuple[int, ...]
    param_group: int


class ShardingStrategy(Protocol):
    """The engine's view of a strategy: backward brackets, the step, and checkpoint state."""

    optimizer: ZeroOptimizer
    """What scripts see as ``engine.optimizer`` (its ``optimizer`` is the torch one)."""
    layout: FlatLayout
    replicated: bool
    """Every rank holds every group whole (stage 0); otherwise each owns a shard."""

    def begin_backward(self, boundary: bool) -> None:
        """Before a backward; ``boundary``: this one ends an accumulation and reduces."""

    def end_backward(self) -> None:
        """After the backward: wait for (or launch) what is left to reduce."""

    def step(self) -> StepOutcome:
        """Check, clip and apply the reduced gradients."""

    def zero_grad(self) -> None: ...

    master_dtype: torch.dtype
    """The dtype checkpoints store master weights in."""

    def trained_params(self) -> dict[str, TrainedParam]:
        """Every trained parameter by name, in layout order."""

    def owned_ranges(self) -> list[OwnedRange]:
        """This rank's master tensors and the group ranges they hold."""

    def refresh_params_from_master(self) -> None:
        """Write replaced master weights (a checkpoint load) into the parameters."""


class StrategyBase:
    """What both strategies share: the backward brackets and the checkpoint accessors, which
    read the layout and the optimizer."""

    def __init__(
        self,
        layout: FlatLayout,
        optimizer: ZeroOptimizer,
        backward: Any,
        precision: Precision,
        param_dtype: torch.dtype,
    ):
        self.layout, self.optimizer = layout, optimizer
        # What runs around backward: prepare(boundary) before, finish() after.
        self._backward = backward
        self.master_dtype = torch.float32 if precision.mixed else param_dtype

    def begin_backward(self, boundary: bool) -> None:
        self._backward.prepare(boundary)

    def end_backward(self) -> None:
        self._backward.finish()

    @property
    def replicated(self) -> bool:
        return not self.optimizer.partitioned

    def trained_params(self) -> dict[str, TrainedParam]:
        return {
            s.name: TrainedParam(tuple(s.shape), g.param_group)
            for g in self.layout.groups
            for s in g.slots
        }

    def owned_ranges(self) -> list[OwnedRange]:
        return self.optimizer.owned_ranges()

    def refresh_params_from_master(self) -> None:
        self.optimizer.refresh_params_from_master()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def step(self) -> StepOutcome:
        return self.optimizer.step()


def single_dtype(params: list[torch.nn.Parameter]) -> torch.dtype:
    """The one dtype of the trained parameters (several: the user must cast the model)."""
    dtypes = {p.dtype for p in params}
    if len(dtypes) > 1:
        raise InvalidTypeError(
            f"trainable parameters have several dtypes ({sorted(map(str, dtypes))}); "
            "cast the model to one dtype, or enable fp16/bf16 in the config"
        )
    return dtypes.pop()
