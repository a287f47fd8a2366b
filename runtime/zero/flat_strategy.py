"""ZeRO stages 0-2: every trained parameter lives in one flat buffer cut into buckets.

`zero.partition.plan_layout` lays the parameters out in groups (buckets, in reverse
registration order: the order backward produces gradients); `zero.buckets.GradReducer` reduces
gradients group by group while backward runs; `zero.optimizer.ZeroOptimizer` owns the master
weights of what this rank owns, clips on the global norm, steps, and all-gathers the
parameters back. Stage 0 all-reduces and every rank steps everything; stage 1 reduce-scatters
at the accumulation boundary, stage 2 every micro-batch.
"""

from __future__ import annotations

import logging

import torch

from ..errors import InvalidValueError
from .buckets import GradReducer, ReduceMode
from .flat import FlatBuffer, flatten_params_into
from .flat_writeback import attach_write_backs
from .optimizer import ZeroOptimizer
from .partition import ParamSpec, plan_layout
from .reduction import GradReduction
from .strategy import StrategyBase, StrategyInputs, single_dtype

__all__ = ["FlatStrategy", "build_flat_strategy"]

log = logging.getLogger("runtime.engine")

# Shard starts are aligned to this many elements (vector loads, NCCL alignment).
_ALIGN = 16
# Buckets are capped at 4M elements (16 MiB in fp32) whatever reduce_bucket_size says:
# DeepSpeed's 5e8 default would make the whole model one bucket (no overlap with backward,
# and staging/receive buffers as large as the model). 4M elements already saturate gloo and
# NCCL bandwidth; measured on the 23M-parameter benchmark model (stage 2, 2 CPU ranks) this
# cut model-state bytes per rank from 398 to 253 MiB at the same step time.
_MAX_BUCKET = 1 << 22

_REDUCE_MODES = {
    0: ReduceMode.ALL_REDUCE,
    1: ReduceMode.SCATTER_AT_BOUNDARY,
    2: ReduceMode.SCATTER_EVERY_MICRO_STEP,
}


class FlatStrategy(StrategyBase):
    """Stages 0-2: the flat parameter buffer, its gradient reducer and the optimizer."""

    def __init__(self, params: FlatBuffer, reducer: GradReducer, optimizer: ZeroOptimizer):
        super().__init__(params.layout, optimizer, reducer, optimizer.precision, params.data.dtype)
        self.params = params
        self.reducer = reducer


def _param_specs(module, groups) -> tuple[list[ParamSpec], dict[str, torch.nn.Parameter]]:
    """Layout specs of the trained parameters (each group in reverse registration order)."""
    names = {id(p): n for n, p in module.named_parameters()}
    order = {id(p): i for i, p in enumerate(module.parameters())}
    specs, params_by_name = [], {}
    for pg, (_, params) in enumerate(groups):
        for p in sorted(params, key=lambda q: order[id(q)], reverse=True):
            if id(p) not in names:
                raise InvalidValueError(
                    "an optimizer parameter is not a parameter of the model; build the "
                    "optimizer from model.parameters()"
                )
            specs.append(ParamSpec(names[id(p)], tuple(p.shape), pg))
            params_by_name[names[id(p)]] = p
    return specs, params_by_name


def _bucket_size(inputs: StrategyInputs, partitioned: bool) -> int:
    zero = inputs.config.zero_optimization
    bucket = min(zero.reduce_bucket_size, _MAX_BUCKET)
    if bucket < zero.reduce_bucket_size and inputs.global_rank == 0:
        if "reduce_bucket_size" in (inputs.config.raw.get("zero_optimization") or {}):
            log.warning(
                "zero_optimization.reduce_bucket_size=%d: buckets are capped at %d "
                "elements (larger ones only delay overlap with backward and cost memory)",
                zero.reduce_bucket_size,
                _MAX_BUCKET,
            )
    return min(bucket, zero.allgather_bucket_size) if partitioned else bucket


def build_flat_strategy(inputs: StrategyInputs) -> FlatStrategy:
    """Flatten the trained parameters (rank 0's values on every rank) and build the reducer
    and optimizer of ``zero_optimization.stage`` 0, 1 or 2."""
    zero = inputs.config.zero_optimization
    precision, comm = inputs.precision, inputs.comm
    specs, params_by_name = _param_specs(inputs.module, inputs.groups)
    dtype = single_dtype(list(params_by_name.values()))
    if precision.mixed:
        dtype = precision.param_dtype
    partitioned = zero.stage in (1, 2)
    layout = plan_layout(
        specs, comm.world_size if partitioned else 1, _bucket_size(inputs, partitioned), _ALIGN
    )
    params_by_group = [[params_by_name[s.name] for s in g.slots] for g in layout.groups]
    flat = FlatBuffer(layout, dtype, inputs.device)
    flatten_params_into(flat, params_by_group)
    # Every rank starts from rank 0's weights (as DDP and DeepSpeed do).
    comm.broadcast(flat.data, src=0)
    # zero_optimization.reduce_scatter / allgather_partitions = false pick all-reduce /
    # broadcasts for the stage 1-2 collectives (byte counters stay shared).
    zero_comm = comm.with_strategy(
        use_reduce_scatter=zero.reduce_scatter, use_all_gather=zero.allgather_partitions
    )
    reduction = GradReduction.from_config(inputs.config, dtype, comm.world_size)
    reducer = GradReducer(
        layout,
        params_by_group,
        zero_comm,
        _REDUCE_MODES[zero.stage],
        dtype,
        inputs.device,
        overlap=bool(zero.overlap_comm),
        wire_dtype=reduction.wire_dtype,
        post_factor=reduction.post_factor,
    )
    optimizer = ZeroOptimizer(
        params=flat,
        reducer=reducer,
        norm_scope=inputs.model_parallel.norm_scope(layout, params_by_name, partitioned),
        comm=zero_comm,
        partitioned=partitioned,
        **inputs.optimizer_options(),
    )
    attach_write_backs(flat, optimizer, params_by_group)
    return FlatStrategy(flat, reducer, optimizer)
