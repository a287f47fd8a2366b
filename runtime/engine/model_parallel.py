"""ZeRO inside a model-parallel layout: what the engine needs from Megatron's ``mpu``.

With ``runtime.initialize(mpu=...)`` every model-parallel rank holds a different part of the
model (tensor-parallel shards of the large weights, plus replicated small ones), and ranks with
the same model-parallel rank form a data-parallel group. ZeRO then works per data-parallel
group: the flat layout is cut into data-parallel-size shards, gradients are reduced and
parameters gathered over that group only, and the batch-size rule counts data-parallel ranks.

Two things span the whole model:

* the gradient norm for clipping and overflow: squared norms of tensor-parallel parameters
  (``tensor_model_parallel`` or ``model_parallel`` true, Megatron's attributes) add up over
  the model-parallel ranks; replicated parameters are counted on tensor-parallel rank 0 only,
  so each is counted once (`zero.optimizer.NormScope`), as DeepSpeed counts them;
* checkpoints: each model-parallel rank writes and reads its own part, in
  ``<dir>/mp_rank_<NN>/`` (a complete checkpoint of that part over the data-parallel group).

Stage 3 with an mpu is refused: its parameter units are not yet model-parallel aware.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from runtime.config import ConfigError
from runtime.distributed import Communicator, check_mpu
from runtime.zero import FlatLayout, NormScope

__all__ = ["ModelParallel", "is_model_parallel_parameter"]


def is_model_parallel_parameter(p: torch.Tensor) -> bool:
    """Whether ``p`` is a tensor-parallel shard (Megatron marks them), not a replica."""
    return bool(getattr(p, "tensor_model_parallel", False) or getattr(p, "model_parallel", False))


@dataclass
class ModelParallel:
    """The engine's model-parallel side; without an mpu every call is a no-op."""

    mpu: Any = None
    dp_comm: Communicator | None = None
    mp_comm: Communicator | None = None
    world_comm: Communicator | None = None

    @classmethod
    def build(cls, mpu: Any, env: Any, config: Any) -> ModelParallel:
        if mpu is None:
            return cls()
        check_mpu(mpu, env.world_size)
        if config.zero_optimization.stage == 3:
            raise ConfigError(
                "= 3 with runtime.initialize(mpu=...) (model parallelism) is not supported: "
                "stage 3 partitions parameters over the whole world; use stage 0, 1 or 2 with "
                "an mpu, or leave mpu out",
                "zero_optimization.stage",
            )
        return cls(
            mpu,
            Communicator(mpu.get_data_parallel_group()),
            Communicator(mpu.get_model_parallel_group()),
            Communicator(env.group),
        )

    @property
    def rank(self) -> int:
        """This rank's place in its model-parallel group (which checkpoint part it keeps)."""
        return self.mp_comm.rank if self.mp_comm is not None else 0

    @property
    def tensor_parallel_rank(self) -> int:
        """Its place among tensor-parallel ranks: replicas are counted where this is 0 (with
        pipeline stages the model-parallel group spans stages holding different layers)."""
        mpu = self.mpu
        if mpu is None:
            return 0
        if hasattr(mpu, "get_tensor_model_parallel_rank"):
            return mpu.get_tensor_model_parallel_rank()
        return self.rank

    def norm_scope(
        self, layout: FlatLayout, params_by_name: dict[str, torch.Tensor], partitioned: bool
    ) -> NormScope | None:
        """Which ranges of this rank's owned gradients count towards the global norm, and the
        group that sums them: the world when data-parallel ranks own disjoint shards (stages
        1-2), the model-parallel group when they hold the same whole gradients (stage 0)."""
        if self.mpu is None:
            return None
        counted, tp_rank = [], self.tensor_parallel_rank
        for g in layout.groups:
            if partitioned:
                pieces = [
                    (s.shard_offset, s.numel, s.name) for s in g.shard_slices(self.dp_comm.rank)
                ]
            else:
                pieces = [(s.offset, s.numel, s.name) for s in g.slots]
            counted.append(
                tuple(
                    (offset, numel)
                    for offset, numel, name in pieces
                    if tp_rank == 0 or is_model_parallel_parameter(params_by_name[name])
                )
            )
        return NormScope(self.world_comm if partitioned else self.mp_comm, tuple(counted))

    def checkpoint_dir(self, directory: Any) -> Any:
        """This model-parallel rank's part of a checkpoint directory (as given without mpu)."""
        if self.mpu is None:
            return directory
        from zlaunch.wire import CHECKPOINT_DIR_ENV

        base = directory or os.environ.get(CHECKPOINT_DIR_ENV)
        if not base:
            return directory  # the checkpoint code says what is missing
        return os.path.join(os.fspath(base), f"mp_rank_{self.rank:02d}")
