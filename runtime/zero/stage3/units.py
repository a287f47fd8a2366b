"""Stage 3 partitioning: parameters grouped into fetch units, each split across the ranks.

A *unit* is the parameters one module owns directly (per optimizer param group): the unit of
every stage-3 collective, all-gathered before the module runs and reduce-scattered after its
backward. Units are the groups of a `zero.partition.FlatLayout`, so the partition arithmetic,
padding and checkpoint description are those of stages 1-2: rank ``r`` owns shard ``r`` of
every unit (a contiguous range of the unit's padded flat buffer).

Gathered, a unit's parameters are views into one flat buffer (``Unit.full``); released, the
buffer's storage is resized to zero and every parameter's ``.data`` is an empty tensor, so the
memory is really returned while tensors autograd saved during forward (views of the buffer)
become valid again as soon as the storage is re-grown and re-gathered for backward. Touching a
released parameter fails cleanly (it has no elements) instead of reading freed memory.

Frozen parameters (``requires_grad`` false, not given to the optimizer) form units of their own
(`plan_frozen_units`): fetched and released like the others, with no gradients to reduce and
no optimizer state, each unit's shard in a store of its own (in the parameters' dtype).

Parameters at or below ``stage3_param_persistence_threshold`` elements go to *persistent* units
that are gathered once and stay whole; their gradients are still reduce-scattered and their
shards stepped like every other unit's, then re-gathered after the step (the same bytes as the
all-reduce DeepSpeed uses for them).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

import torch

from runtime.distributed import Communicator, Handle

from ...errors import InvalidValueError
from ..param_offload import ShardStore
from ..param_status import ZeroParamStatus, mark
from ..partition import FlatGroup, FlatLayout, ParamSpec, plan_layout

__all__ = [
    "UnitState",
    "Unit",
    "UnitPlan",
    "plan_units",
    "plan_frozen_units",
    "param_numel",
    "param_shape",
]

_ALIGN = 16


class UnitFetchLike(Protocol):
    """What gathers a unit (`stage3.fetch.UnitFetch`), seen from here."""

    def gather(self, u: Unit, **how) -> Handle: ...


class UnitState(enum.Enum):
    RELEASED = "released"
    INFLIGHT = "inflight"
    GATHERED = "gathered"


def param_shape(p: torch.Tensor) -> tuple[int, ...]:
    """The parameter's full shape, also while it is partitioned."""
    shape = getattr(p, "ds_shape", None)
    return tuple(shape) if shape is not None else tuple(p.shape)


def param_numel(p: torch.Tensor) -> int:
    n = 1
    for d in param_shape(p):
        n *= d
    return n


class Unit:
    """One group of parameters gathered and released together."""

    def __init__(
        self,
        group: FlatGroup,
        params: Sequence[torch.nn.Parameter],
        persistent: bool,
        store: ShardStore,
        leaf: str | None = None,
    ):
        dtype, device = store.data.dtype, store.compute_device
        self.index = group.index
        self.group = group
        self.store = store
        """Where this rank's shard lives: the shared store, or a frozen unit's own."""
        self.params = list(params)
        self.persistent = persistent
        self.leaf = leaf
        """Name of the leaf module this unit holds whole: reduced at the end of backward."""
        self.numel = group.padded_numel
        self.full = torch.zeros(group.padded_numel, dtype=dtype, device=device)
        self._nbytes = self.full.untyped_storage().nbytes()
        self.views = [self.full.narrow(0, s.offset, s.numel).view(s.shape) for s in group.slots]
        self.placeholders = [torch.empty(0, dtype=dtype, device=device) for _ in self.params]
        self.state = UnitState.GATHERED
        self.handle: Handle | None = None
        self.users = 0
        """Modules (or GatheredParameters contexts) using the gathered parameters right now."""
        self.last_pos = -1
        """Position in the pass's fetch sequence of this unit's latest fetch."""
        self.trainable = [p.requires_grad for p in self.params]
        self.expected_grads = sum(self.trainable)
        self.arrived = [False] * len(self.params)
        self.n_arrived = 0
        self.staging: torch.Tensor | None = None
        self.bwd_hold = False
        """Fetched for backward and still needed by it (never released to make room)."""
        self.coordinator = None
        self.full_master = None
        """The optimizer's `ZeroOptimizer.full_master` (trained units, once it is built)."""
        self.version = 0
        """The optimizer step whose values the gathered buffer holds (stale when behind)."""
        self.exact = True
        """The gathered buffer holds the shards' own values (false: dequantized, qwZ)."""

    # ------------------------------------------------------------------ its counters
    # Only these methods change them (as FSDP2's FSDPParam owns its state): a count that goes
    # wrong releases a buffer still in use, or never reduces a unit's gradients.
    def enter(self) -> None:
        """A module (or a GatheredParameters context) starts using the gathered parameters."""
        self.users += 1

    def leave(self) -> int:
        """One user is done with them; the users left."""
        if self.users <= 0:
            raise RuntimeError(f"stage 3: {self.name} left by more users than entered it")
        self.users -= 1
        return self.users

    def hold_for_backward(self, hold: bool = True) -> None:
        """Fetched for backward and still needed by it (never released to make room), or
        no longer (``hold`` False)."""
        self.bwd_hold = hold

    def grad_arrived(self, i: int) -> bool:
        """Parameter ``i``'s gradient arrived; False when it had arrived already this pass
        (it is then added to the one staged)."""
        if self.arrived[i]:
            return False
        self.arrived[i] = True
        self.n_arrived += 1
        return True

    def reset_arrivals(self) -> None:
        """The unit's gradients were reduced: none has arrived for the next pass."""
        self.arrived = [False] * len(self.params)
        self.n_arrived = 0

    @property
    def name(self) -> str:
        """The module this unit belongs to, for messages."""
        if self.persistent:
            return "persistent parameters"
        if self.leaf is not None:
            return self.leaf or "<the model>"
        first = self.group.slots[0].name
        return first.rsplit(".", 1)[0] if "." in first else "<the model>"

    @property
    def frozen(self) -> bool:
        """No parameter of the unit is trained: no gradients, no optimizer state."""
        return self.expected_grads == 0

    # ------------------------------------------------------------------ gather / release
    def start_gather(self, fetch: UnitFetchLike, **how) -> None:
        """Launch the gather of this unit (asynchronously) if it is released; ``how`` is what
        `stage3.fetch.UnitFetch.gather` takes (pass, step, exact or not)."""
        if self.state is not UnitState.RELEASED:
            return
        storage = self.full.untyped_storage()
        if storage.nbytes() != self._nbytes:
            storage.resize_(self._nbytes)
        self.handle = fetch.gather(self, **how)
        self.state = UnitState.INFLIGHT
        mark(self.params, ZeroParamStatus.INFLIGHT)

    def regather(self, fetch: UnitFetchLike, **how) -> None:
        """Gather a gathered unit again, in place (its values predate the last step, or are
        quantized where exact values are needed)."""
        self.handle = fetch.gather(self, **how)
        self.state = UnitState.INFLIGHT

    def wait(self) -> None:
        if self.state is UnitState.INFLIGHT:
            self.handle.wait()
            self.handle = None
            self.state = UnitState.GATHERED
            self.point_at_full()

    def point_at_full(self) -> None:
        for p, v in zip(self.params, self.views, strict=True):
            p.data = v
        mark(self.params, ZeroParamStatus.AVAILABLE)

    def release(self, force: bool = False) -> None:
        """Free the gathered buffer (persistent units only when ``force``)."""
        if self.persistent and not force:
            return
        if self.state is UnitState.INFLIGHT:
            self.wait()
        if self.state is UnitState.RELEASED:
            return
        for p, empty in zip(self.params, self.placeholders, strict=True):
            p.data = empty
        mark(self.params, ZeroParamStatus.NOT_AVAILABLE)
        self.full.untyped_storage().resize_(0)
        self.state = UnitState.RELEASED

    @property
    def gathered(self) -> bool:
        return self.state is UnitState.GATHERED

    # ------------------------------------------------------------------ GatheredParameters
    def gather_for_user(self) -> None:
        self.coordinator.user_gather(self)

    def release_for_user(self, modifier_rank: int | None) -> None:
        self.coordinator.user_release(self, modifier_rank)

    def full_fp32(self, p: torch.nn.Parameter) -> torch.Tensor:
        """Parameter ``p``'s fp32 master, whole (a collective: call it on every rank). A
        frozen unit has no master: its gathered values, widened."""
        i = next(k for k, q in enumerate(self.params) if q is p)
        slot = self.group.slots[i]
        if self.frozen or self.full_master is None:
            self.gather_for_user()
            try:
                return self.views[i].detach().to(torch.float32, copy=True)
            finally:
                self.release_for_user(None)
        full = self.full_master(self.index)
        return full[slot.offset : slot.end].view(slot.shape).clone()

    def write_back(self, comm: Communicator, src: int) -> None:
        """Make rank ``src``'s gathered values everyone's, in the shards too."""
        comm.broadcast(self.full, src=src)
        lo, hi = self.group.shard_range(comm.rank)
        self.store.write_from(self.group, self.full[lo:hi])

    def load_values(self, p: torch.nn.Parameter, value: torch.Tensor, rank: int) -> None:
        """Set parameter ``p`` of this unit to ``value`` (its full values, on every rank): each
        rank writes the part of its shard that ``p`` covers; no communication."""
        i = next(k for k, q in enumerate(self.params) if q is p)
        slot = self.group.slots[i]
        flat = value.reshape(-1)
        if flat.numel() != slot.numel:
            raise InvalidValueError(f"{slot.name}: {flat.numel()} values for {slot.numel} elements")
        lo, hi = self.group.shard_range(rank)
        a, b = max(lo, slot.offset), min(hi, slot.end)
        if a < b:
            shard = self.store.read_shard(self.group)
            shard[a - lo : b - lo].copy_(flat[a - slot.offset : b - slot.offset])
            self.store.write_from(self.group, shard)
        if self.gathered:
            self.views[i].copy_(value.reshape(slot.shape))

    # ------------------------------------------------------------------ gradients
    def reset_grads(self) -> None:
        self.arrived = [False] * len(self.params)
        self.n_arrived = 0
        self.staging = None


@dataclasses.dataclass(frozen=True)
class UnitPlan:
    """One planned unit: its parameters, and how stage 3 treats it."""

    params: list[torch.nn.Parameter]
    persistent: bool
    """At or below the persistence threshold: gathered once, kept whole."""
    leaf: str | None = None
    """The name of the leaf module whose whole subtree this unit holds (see `leaf_modules`)."""


def _module_params(
    module: torch.nn.Module, leaves: Mapping[str, torch.nn.Module]
) -> Iterator[tuple[str | None, list[torch.nn.Parameter]]]:
    """Per module in registration order, the parameters it brings into units: its own, or for
    a leaf its whole subtree's (modules inside a leaf bring none)."""
    if "" in leaves:  # the whole model is one leaf
        yield "", list(module.parameters())
        return
    inside = tuple(n + "." for n in leaves)
    for name, m in module.named_modules():
        if name in leaves:
            yield name, list(m.parameters())
        elif not name.startswith(inside):
            yield None, [p for p in m._parameters.values() if p is not None]


def plan_units(
    module: torch.nn.Module,
    param_groups: Sequence[Sequence[torch.nn.Parameter]],
    world_size: int,
    persistence_threshold: int,
    leaves: Mapping[str, torch.nn.Module] | None = None,
) -> tuple[FlatLayout, list[UnitPlan]]:
    """Group the optimizer's parameters into units, in module registration order.

    Returns the layout (one group per unit) and, per unit, its plan. A parameter shared by
    several modules (tied weights) belongs to the first. A leaf module's parameters all go to
    its units (one per param group), whatever their size.
    """
    pg_of = {id(p): i for i, params in enumerate(param_groups) for p in params}
    names = _first_names(module)
    assigned: set[int] = set()
    units: list[tuple[int, UnitPlan]] = []
    persistent: dict[int, list[torch.nn.Parameter]] = {}
    for leaf, params in _module_params(module, leaves or {}):
        by_pg: dict[int, list[torch.nn.Parameter]] = {}
        for p in params:
            if id(p) not in pg_of or id(p) in assigned:
                continue
            assigned.add(id(p))
            pg = pg_of[id(p)]
            if leaf is None and param_numel(p) <= persistence_threshold:
                persistent.setdefault(pg, []).append(p)
            else:
                by_pg.setdefault(pg, []).append(p)
        units.extend((pg, UnitPlan(ps, False, leaf)) for pg, ps in by_pg.items())
    units.extend((pg, UnitPlan(ps, True)) for pg, ps in sorted(persistent.items()))
    missing = [p for params in param_groups for p in params if id(p) not in assigned]
    if missing:
        raise InvalidValueError(
            f"{len(missing)} optimizer parameter(s) are not parameters of the model; build the "
            "optimizer from model.parameters()"
        )
    groups, start = [], 0
    for i, (pg, plan) in enumerate(units):
        g = _one_group(plan.params, names, world_size, pg)
        g = dataclasses.replace(g, index=i, start=start)
        groups.append(g)
        start += g.padded_numel
    layout = FlatLayout(tuple(groups), world_size)
    return layout, [plan for _, plan in units]


def plan_frozen_units(
    module: torch.nn.Module,
    trained: set[int],
    world_size: int,
    persistence_threshold: int,
    leaves: Mapping[str, torch.nn.Module] | None = None,
) -> list[tuple[FlatGroup, UnitPlan]]:
    """Units of the frozen parameters (``requires_grad`` false), one per module and dtype.

    They are partitioned and fetched like trained units but have no gradients and no optimizer
    state, so each unit gets a layout of its own (one group; its shard lives in a store of its
    own, in the parameters' dtype). Parameters at or below the persistence threshold, those
    that are not floating point (quantized weights) and those in ``trained`` (ids of the
    optimizer's parameters) are left out: they stay whole.
    """
    names = _first_names(module)
    seen: set[int] = set()
    out = []
    for leaf, params in _module_params(module, leaves or {}):
        by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
        for p in params:
            if p.requires_grad or id(p) in trained or id(p) in seen:
                continue
            seen.add(id(p))
            if p.is_floating_point() and param_numel(p) > persistence_threshold:
                by_dtype.setdefault(p.dtype, []).append(p)
        out.extend(
            (_one_group(ps, names, world_size), UnitPlan(ps, False, leaf))
            for ps in by_dtype.values()
        )
    return out


def _first_names(module: torch.nn.Module) -> dict[int, str]:
    """Parameter id -> its first name in the module (a tied weight has several)."""
    names: dict[int, str] = {}
    for name, p in module.named_parameters():
        names.setdefault(id(p), name)
    return names


def _one_group(
    params: Sequence[torch.nn.Parameter], names: dict[int, str], world_size: int, pg: int = 0
) -> FlatGroup:
    """``params`` laid out as one group (a unit), padded to split evenly across the ranks."""
    specs = [ParamSpec(names[id(p)], param_shape(p), pg) for p in params]
    total = sum(s.numel for s in specs)
    (g,) = plan_layout(specs, world_size, max(total, 1), align=_ALIGN).groups
    return g
