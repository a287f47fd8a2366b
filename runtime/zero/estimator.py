"""Model-state memory per GPU and per node's CPU, for each ZeRO stage and offload choice.

Pure arithmetic, no torch: `zlaunch estimate` runs on a laptop. For Ψ parameters and N
data-parallel ranks, Adam, the bytes per parameter are (docs/memory-model.md):

    mixed precision (fp16/bf16): 2 (16-bit params) + 2 (16-bit grads) + 12 (fp32 master, m, v)
    fp32:                        4 (params)        + 4 (grads)        + 8  (m, v)

stage 1 partitions the optimizer part over N, stage 2 also the gradients, stage 3 also the
parameters: stage 0 16Ψ, stage 1 4Ψ+12Ψ/N (fp32: 8Ψ+8Ψ/N), stage 2 2Ψ+14Ψ/N (fp32: 4Ψ+12Ψ/N),
stage 3 16Ψ/N.

Offload (what this runtime keeps in CPU memory, per rank):
- optimizer: the rank's shard of the optimizer state plus an fp32 gradient shard for the CPU
  step: 16Ψ/N (mixed: master + m + v + grad; fp32: param copy + m + v + grad). The GPU keeps
  the parameters and gradients of the stage.
- optimizer+param (stage 3): also the parameter shard: 18Ψ/N mixed (the 16-bit shard is
  separate from the fp32 master), 16Ψ/N fp32 (the shard is the master). The GPU keeps only
  gathered parameters, bounded by the buffers.

Buffers per GPU (static, allocated once): the gradient reduce bucket (two when overlap_comm
double-buffers it), the stage 1-2 all-gather bucket, the stage 3 prefetch bucket; each at most
the model's size. Sizes are elements, DeepSpeed's defaults unless a config says otherwise.
At stages 0-2 this runtime also caps a bucket at MAX_BUCKET (4M) elements whatever the config
says (runtime/engine/engine.py: larger buckets only delay the overlap with backward), and uses one
size, min(reduce_bucket_size, allgather_bucket_size), for both kinds of bucket.

Units: GB = 10**9 bytes (1.5e9 parameters * 16 bytes = 24 GB).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from typing import Literal

from runtime.errors import InvalidValueError

__all__ = [
    "GB",
    "MAX_BUCKET",
    "OFFLOADS",
    "BufferSizes",
    "Estimate",
    "buffer_bytes",
    "count_safetensors_parameters",
    "estimate_all",
    "model_state_bytes",
]

GB = 10**9
MAX_BUCKET = 1 << 22
"""The runtime's cap on a stage 0-2 bucket, in elements (runtime/engine/engine.py)."""
Precision = Literal["fp16", "bf16", "fp32"]
Offload = Literal["none", "optimizer", "optimizer+param"]
OFFLOADS: tuple[Offload, ...] = ("none", "optimizer", "optimizer+param")


@dataclass(frozen=True)
class _Bytes:
    param: int
    grad: int
    optimizer: int
    cpu_optimizer: int  # CPU bytes per parameter when the optimizer is offloaded
    cpu_param: int  # extra CPU bytes per parameter when the parameters are offloaded too


_MIXED = _Bytes(param=2, grad=2, optimizer=12, cpu_optimizer=16, cpu_param=2)
_FP32 = _Bytes(param=4, grad=4, optimizer=8, cpu_optimizer=16, cpu_param=0)


def _bytes_for(precision: str) -> _Bytes:
    if precision in ("fp16", "bf16"):
        return _MIXED
    if precision == "fp32":
        return _FP32
    raise InvalidValueError(f"precision must be fp16, bf16 or fp32, got {precision!r}")


def _check(params: float, world_size: int, stage: int, offload: str) -> None:
    if not params > 0:
        raise InvalidValueError(f"the parameter count must be > 0, got {params}")
    if world_size < 1:
        raise InvalidValueError(f"the number of ranks must be >= 1, got {world_size}")
    if stage not in (0, 1, 2, 3):
        raise InvalidValueError(f"stage must be 0, 1, 2 or 3, got {stage}")
    if offload not in OFFLOADS:
        raise InvalidValueError(f"offload must be one of {', '.join(OFFLOADS)}, got {offload!r}")
    if offload == "optimizer" and stage == 0:
        raise InvalidValueError("optimizer offload needs stage 1, 2 or 3")
    if offload == "optimizer+param" and stage != 3:
        raise InvalidValueError("parameter offload needs stage 3")


def model_state_bytes(
    params: float,
    world_size: int,
    stage: int,
    precision: Precision = "fp16",
    offload: Offload = "none",
) -> tuple[float, float]:
    """(bytes per GPU, CPU bytes per rank) of parameters, gradients and optimizer state."""
    _check(params, world_size, stage, offload)
    b = _bytes_for(precision)
    n = world_size
    param = b.param * params / (n if stage >= 3 else 1)
    grad = b.grad * params / (n if stage >= 2 else 1)
    optimizer = b.optimizer * params / (n if stage >= 1 else 1)
    if offload == "none":
        return param + grad + optimizer, 0.0
    cpu = b.cpu_optimizer * params / n
    if offload == "optimizer":
        return param + grad, cpu
    return 0.0, cpu + b.cpu_param * params / n


@dataclass(frozen=True)
class BufferSizes:
    """Bucket sizes in elements (DeepSpeed's defaults); overlap None = true only at stage 3."""

    reduce_bucket_size: int = int(5e8)
    allgather_bucket_size: int = int(5e8)
    stage3_prefetch_bucket_size: int = int(5e7)
    overlap_comm: bool | None = None

    @classmethod
    def from_config(cls, config: object, hidden_size: int | None = None) -> BufferSizes:
        """The bucket sizes of a `runtime.config.Config` ("auto" resolved from hidden_size)."""
        zero = config.zero_optimization  # type: ignore[attr-defined]
        defaults = cls()

        def size(value: object, auto: int, default: int) -> int:
            if value == "auto":
                return auto if hidden_size else default
            return int(value)  # type: ignore[arg-type]

        h = hidden_size or 0
        raw_zero = config.raw.get("zero_optimization")  # type: ignore[attr-defined]
        overlap_given = isinstance(raw_zero, dict) and "overlap_comm" in raw_zero
        return cls(
            reduce_bucket_size=size(zero.reduce_bucket_size, h * h, defaults.reduce_bucket_size),
            allgather_bucket_size=int(zero.allgather_bucket_size),
            stage3_prefetch_bucket_size=size(
                zero.stage3_prefetch_bucket_size,
                int(0.9 * h * h),
                defaults.stage3_prefetch_bucket_size,
            ),
            # Not given: the config's stage-dependent default, applied per row.
            overlap_comm=zero.overlap_comm if overlap_given else None,
        )


def buffer_bytes(
    params: float,
    stage: int,
    precision: Precision = "fp16",
    sizes: BufferSizes | None = None,
) -> float:
    """Static communication buffers per GPU, in bytes."""
    sizes = sizes or BufferSizes()
    b = _bytes_for(precision)
    overlap = sizes.overlap_comm if sizes.overlap_comm is not None else stage == 3
    if stage == 3:
        reduce = min(sizes.reduce_bucket_size, params)
        prefetch = min(sizes.stage3_prefetch_bucket_size, params)
        return reduce * b.grad * (2 if overlap else 1) + prefetch * b.param
    bucket = min(sizes.reduce_bucket_size, MAX_BUCKET, params)
    if stage == 0:
        return bucket * b.grad * (2 if overlap else 1)
    bucket = min(bucket, sizes.allgather_bucket_size)
    return bucket * b.grad * (2 if overlap else 1) + bucket * b.param


@dataclass(frozen=True)
class Estimate:
    """One row: a stage and offload choice, in bytes."""

    stage: int
    offload: Offload
    gpu_model_states: float
    """Parameters, gradients and optimizer state on each GPU."""
    gpu_buffers: float
    """Static buckets on each GPU."""
    cpu_per_node: float
    """Offloaded state in one node's CPU memory (all of its ranks)."""

    @property
    def gpu_total(self) -> float:
        return self.gpu_model_states + self.gpu_buffers


def estimate_all(
    params: float,
    nodes: int,
    gpus_per_node: int,
    precision: Precision = "fp16",
    sizes: BufferSizes | None = None,
    *,
    buffers: bool = True,
) -> list[Estimate]:
    """Every valid (stage, offload) combination for `nodes` x `gpus_per_node` ranks."""
    if nodes < 1 or gpus_per_node < 1:
        raise InvalidValueError(
            f"nodes and gpus per node must be >= 1, got {nodes}, {gpus_per_node}"
        )
    world = nodes * gpus_per_node
    rows = []
    for stage in (0, 1, 2, 3):
        for offload in OFFLOADS:
            if (offload == "optimizer" and stage == 0) or (
                offload == "optimizer+param" and stage != 3
            ):
                continue
            gpu, cpu_rank = model_state_bytes(params, world, stage, precision, offload)
            extra = buffer_bytes(params, stage, precision, sizes) if buffers else 0.0
            rows.append(Estimate(stage, offload, gpu, extra, cpu_rank * gpus_per_node))
    return rows


_SAFETENSORS_DTYPES = {
    "BOOL",
    "U8",
    "I8",
    "F8_E5M2",
    "F8_E4M3",
    "I16",
    "U16",
    "F16",
    "BF16",
    "I32",
    "U32",
    "F32",
    "F64",
    "I64",
    "U64",
}


def count_safetensors_parameters(path: str | os.PathLike) -> int:
    """Elements of every tensor in a .safetensors file, read from its header (no torch).

    Tensors sharing storage are stored once in safetensors, so tied weights count once.
    """
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise InvalidValueError(f"{os.fspath(path)}: not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", head)
        if length > 100_000_000:
            raise InvalidValueError(
                f"{os.fspath(path)}: not a safetensors file (header size {length})"
            )
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise InvalidValueError(
                f"{os.fspath(path)}: not a safetensors file (bad header)"
            ) from None
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or info.get("dtype") not in _SAFETENSORS_DTYPES:
            raise InvalidValueError(f"{os.fspath(path)}: not a safetensors file (tensor {name!r})")
        total += math.prod(info["shape"])
    return total
