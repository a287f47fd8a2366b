"""The stage-3 sharding strategy and its construction: units, shard store, coordinator, optimizer.

Built by `strategy.build_strategy` for ``zero_optimization.stage: 3``. Unit by unit, the full values
are assembled (from the module's parameters, broadcast from rank 0, or from zero.Init's
per-parameter chunks, gathered one parameter at a time), this rank's shard is stored and the
unit is released, so at most one unit is whole at a time beyond what the module already held.
"""

from __future__ import annotations

import logging
import math

import torch

from runtime.distributed import Communicator

from ..leaf_modules import leaf_modules, z3_leaf_module
from ..nvme import SwappedShardStore
from ..param_offload import ShardStore
from ..partition import FlatLayout
from ..reduction import GradReduction
from ..strategy import StrategyBase, StrategyInputs, single_dtype
from .coordinator import Stage3Coordinator
from .fetch import build_fetch, exact_gathers_note
from .optimizer import Stage3Optimizer
from .units import Unit, param_shape, plan_frozen_units, plan_units

log = logging.getLogger("runtime.zero.stage3")

__all__ = ["Stage3Strategy", "build_stage3"]


def _fill_unit(u: Unit, comm: Communicator) -> None:
    """Write the unit's full values into ``u.full`` (rank 0's for plain parameters)."""
    from ..init_context import ParamPartition

    plain = False
    for slot, p in zip(u.group.slots, u.params, strict=True):
        owner = getattr(p, "_zero_owner", None)
        dst = u.full[slot.offset : slot.end]
        if isinstance(owner, ParamPartition):
            dst.copy_(owner.full_flat()[: slot.numel])
            owner.detach_from_param()
        else:
            dst.copy_(p.data.reshape(-1))
            plain = True
    if plain:
        # Every rank starts from rank 0's weights (as DDP and DeepSpeed do).
        comm.broadcast(u.full, src=0)


def _partition_unit(u: Unit, comm: Communicator) -> None:
    """Fill the unit, keep this rank's shard in its store and release the full values."""
    _fill_unit(u, comm)
    lo, hi = u.group.shard_range(comm.rank)
    u.store.write_from(u.group, u.full[lo:hi])
    for p in u.params:
        shape = param_shape(p)
        p.ds_shape = shape
        p.ds_numel = math.prod(shape)
        p._zero_owner = u
    u.point_at_full()
    u.release()


def _unpartition_leftovers(module: torch.nn.Module) -> None:
    """Parameters partitioned by zero.Init that the optimizer does not step stay whole."""
    from ..init_context import ParamPartition
    from ..param_status import ZeroParamStatus

    for p in module.parameters():
        owner = getattr(p, "_zero_owner", None)
        if isinstance(owner, ParamPartition):
            p.data = owner.full_flat()[: owner.numel].view(owner.shape).clone()
            owner.detach_from_param()
            p.ds_status = ZeroParamStatus.AVAILABLE


def _log_leaves(leaves: dict, comm: Communicator) -> None:
    found = [n for n, m in leaves.items() if not z3_leaf_module(m)]
    if found and comm.rank == 0:
        log.info(
            "stage 3: fetching %s whole (their experts run depending on the data, differently "
            "on each rank); runtime.zero.set_z3_leaf_modules declares such modules yourself",
            ", ".join(repr(n) for n in found),
        )


class Stage3Strategy(StrategyBase):
    """Stage 3: per-module units whose shards live in a store, fetched when modules run."""

    def __init__(self, store: ShardStore, coordinator: Stage3Coordinator, optimizer):
        super().__init__(
            store.layout, optimizer, coordinator, optimizer.precision, store.data.dtype
        )
        self.store = store
        self.coordinator = coordinator


def _param_dtype(inputs: StrategyInputs, params: list) -> torch.dtype:
    if inputs.precision.mixed:
        return inputs.precision.param_dtype
    return single_dtype(params)


class _StoreMaker:
    """Makes the shard stores: in (CPU) memory, or under ``offload_param.device: nvme`` in
    the files of one swapper that the main store owns (frozen units' stores share it)."""

    def __init__(self, inputs: StrategyInputs):
        self.inputs = inputs
        self.off = inputs.config.zero_optimization.offload_param
        self.swapper = None
        self.count = 0

    def __call__(self, layout: FlatLayout, dtype: torch.dtype):
        comm, off = self.inputs.comm, self.off
        if off.device != "nvme":
            return ShardStore(
                layout,
                comm.rank,
                dtype,
                self.inputs.device,
                offload=off.enabled,
                pin_memory=off.pin_memory,
            )
        first = self.swapper is None
        if first:
            self.swapper = self.inputs.param_swapper()
        self.count += 1
        return SwappedShardStore(
            layout,
            comm.rank,
            dtype,
            self.inputs.device,
            self.swapper,
            tag=f"s{self.count}",
            buffer_count=int(off.buffer_count),
            owns_swapper=first,
        )


def _partition_frozen(module, trained, units, leaves, inputs: StrategyInputs, make_store) -> None:
    """Frozen parameters (LoRA's base model, ...) are partitioned too, each unit with a store
    of its own in the parameters' dtype; they take the indices after the trained units."""
    zero, comm = inputs.config.zero_optimization, inputs.comm
    threshold = int(zero.stage3_param_persistence_threshold)
    for group, unit_plan in plan_frozen_units(module, trained, comm.world_size, threshold, leaves):
        unit_params = unit_plan.params
        own_store = make_store(FlatLayout((group,), comm.world_size), unit_params[0].dtype)
        u = Unit(group, unit_params, False, own_store, unit_plan.leaf)
        u.index = len(units)
        _partition_unit(u, comm)
        units.append(u)


def _build_optimizer(inputs, layout, store, coordinator) -> Stage3Optimizer:
    optimizer = Stage3Optimizer(
        params=store,
        reducer=coordinator,
        comm=inputs.comm,
        partitioned=True,
        sub_group_size=int(inputs.config.zero_optimization.sub_group_size),
        **inputs.optimizer_options(),
    )
    coordinator.shard_written.append(optimizer.reload_master)
    for u in coordinator.units:
        if not u.frozen:
            u.full_master = optimizer.full_master
    return optimizer


def build_stage3(inputs: StrategyInputs) -> Stage3Strategy:
    """Partition ``inputs.module`` unit by unit and build the coordinator and optimizer."""
    zero = inputs.config.zero_optimization
    module, comm, device = inputs.module, inputs.comm, inputs.device
    params = [p for _, ps in inputs.groups for p in ps]
    dtype = _param_dtype(inputs, params)
    leaves = leaf_modules(module)
    _log_leaves(leaves, comm)
    layout, plan = plan_units(
        module,
        [ps for _, ps in inputs.groups],
        comm.world_size,
        int(zero.stage3_param_persistence_threshold),
        leaves,
    )
    make_store = _StoreMaker(inputs)
    store = make_store(layout, dtype)
    units = []
    for group, unit_plan in zip(layout.groups, plan, strict=True):
        u = Unit(group, unit_plan.params, unit_plan.persistent, store, unit_plan.leaf)
        _partition_unit(u, comm)
        units.append(u)
    _partition_frozen(module, {id(p) for p in params}, units, leaves, inputs, make_store)
    _unpartition_leftovers(module)
    wire = GradReduction.from_config(inputs.config, dtype, comm.world_size).wire_dtype
    fetch = build_fetch(zero, comm)
    note = exact_gathers_note(units, fetch, int(zero.stage3_param_persistence_threshold))
    if note is not None and comm.rank == 0:
        log.log(note.level, "stage 3: %s", note.message)
    coordinator = Stage3Coordinator(
        module, units, layout, comm, zero, dtype, device, fetch, wire_dtype=wire
    )
    optimizer = _build_optimizer(inputs, layout, store, coordinator)
    return Stage3Strategy(store, coordinator, optimizer)
