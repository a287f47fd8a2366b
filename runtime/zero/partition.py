"""Partition arithmetic for flat parameter/gradient buffers (pure Python, no torch).

Trainable parameters are laid out back to back in one flat buffer, cut into *groups*. A group
is the unit of every collective: its gradients are reduced together, its parameters are
all-gathered together. Each group is padded to a multiple of ``world_size * align`` elements
so it splits into ``world_size`` equal, aligned shards; rank ``r`` owns shard ``r`` of every
group. The same layout serves stage 0 (no sharding, groups are all-reduce buckets), stages 1
and 2 (groups are reduce-scatter / all-gather buckets) and a stage-3 coordinator (groups per
module), and it is what a checkpoint stores: every parameter by name, offset, numel and shape,
and every rank's slice of it (`FlatGroup.shard_slices`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "ParamSpec",
    "ParamSlot",
    "ShardSlice",
    "FlatGroup",
    "FlatLayout",
    "plan_layout",
    "shard_owner_ranges",
]


@dataclass(frozen=True)
class ParamSpec:
    """What the planner needs to know about one parameter."""

    name: str
    shape: tuple[int, ...]
    param_group: int = 0
    """Index of the optimizer param group; groups never mix param groups."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class ParamSlot:
    """Where one parameter lives inside its group (element offsets, relative to the group)."""

    name: str
    offset: int
    numel: int
    shape: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.offset + self.numel


@dataclass(frozen=True)
class ShardSlice:
    """The part of one parameter that lies in one rank's shard.

    ``param_offset`` counts elements into the flattened parameter, ``shard_offset`` into the
    rank's shard of the group.
    """

    name: str
    param_offset: int
    shard_offset: int
    numel: int


@dataclass(frozen=True)
class FlatGroup:
    index: int
    param_group: int
    start: int
    """Offset of the group inside the whole flat buffer."""
    slots: tuple[ParamSlot, ...]
    padded_numel: int
    world_size: int

    @property
    def numel(self) -> int:
        """Elements actually used by parameters (the rest is zero padding)."""
        return self.slots[-1].end if self.slots else 0

    @property
    def shard_numel(self) -> int:
        return self.padded_numel // self.world_size

    def shard_range(self, rank: int) -> tuple[int, int]:
        """[lo, hi) of rank's shard, relative to the group start."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range for world size {self.world_size}")
        lo = rank * self.shard_numel
        return lo, lo + self.shard_numel

    def shard_slices(self, rank: int) -> list[ShardSlice]:
        """The pieces of parameters that fall into rank's shard, in order."""
        lo, hi = self.shard_range(rank)
        out = []
        for slot in self.slots:
            a, b = max(lo, slot.offset), min(hi, slot.end)
            if a < b:
                out.append(ShardSlice(slot.name, a - slot.offset, a - lo, b - a))
        return out


@dataclass(frozen=True)
class FlatLayout:
    groups: tuple[FlatGroup, ...]
    world_size: int
    _by_name: dict[str, tuple[int, int]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for g in self.groups:
            for i, slot in enumerate(g.slots):
                self._by_name[slot.name] = (g.index, i)

    @property
    def total_numel(self) -> int:
        """Size of the whole flat buffer, padding included."""
        last = self.groups[-1] if self.groups else None
        return last.start + last.padded_numel if last else 0

    @property
    def param_numel(self) -> int:
        return sum(g.numel for g in self.groups)

    @property
    def shard_numel(self) -> int:
        """Elements one rank owns over all groups."""
        return sum(g.shard_numel for g in self.groups)

    @property
    def max_group_numel(self) -> int:
        return max((g.padded_numel for g in self.groups), default=0)

    def locate(self, name: str) -> tuple[FlatGroup, ParamSlot]:
        gi, si = self._by_name[name]
        group = self.groups[gi]
        return group, group.slots[si]

    def to_dict(self) -> dict:
        """JSON-ready description (for checkpoint manifests)."""
        return {
            "world_size": self.world_size,
            "groups": [
                {
                    "index": g.index,
                    "param_group": g.param_group,
                    "start": g.start,
                    "padded_numel": g.padded_numel,
                    "params": [
                        {
                            "name": s.name,
                            "offset": s.offset,
                            "numel": s.numel,
                            "shape": list(s.shape),
                        }
                        for s in g.slots
                    ],
                }
                for g in self.groups
            ],
        }


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def plan_layout(
    params: Iterable[ParamSpec], world_size: int, bucket_numel: int, align: int = 1
) -> FlatLayout:
    """Cut ``params`` (in the given order) into groups of at most ``bucket_numel`` elements.

    A parameter larger than ``bucket_numel`` gets a group of its own; a new group also starts
    whenever the optimizer param group changes. Padding makes every group divisible by
    ``world_size * align``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if bucket_numel < 1:
        raise ValueError(f"bucket size must be >= 1 element, got {bucket_numel}")
    multiple = world_size * max(1, align)
    groups: list[FlatGroup] = []
    current: list[ParamSpec] = []

    def close() -> None:
        if not current:
            return
        slots, off = [], 0
        for spec in current:
            slots.append(ParamSlot(spec.name, off, spec.numel, tuple(spec.shape)))
            off += spec.numel
        start = groups[-1].start + groups[-1].padded_numel if groups else 0
        padded = _round_up(max(off, 1), multiple)
        groups.append(
            FlatGroup(len(groups), current[0].param_group, start, tuple(slots), padded, world_size)
        )
        current.clear()

    used = 0
    for spec in params:
        if current and (
            spec.param_group != current[0].param_group or used + spec.numel > bucket_numel
        ):
            close()
            used = 0
        current.append(spec)
        used += spec.numel
    close()
    return FlatLayout(tuple(groups), world_size)


def shard_owner_ranges(layout: FlatLayout, rank: int) -> Sequence[tuple[int, int]]:
    """Absolute [lo, hi) ranges of the flat buffer owned by ``rank`` (one per group)."""
    out = []
    for g in layout.groups:
        lo, hi = g.shard_range(rank)
        out.append((g.start + lo, g.start + hi))
    return out
