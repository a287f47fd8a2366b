"""Where each parameter of a DeepSpeed ZeRO checkpoint lies in its ranks' flat tensors (pure).

ZeRO 1 and 2 flatten each param group, in ``param_shapes`` order (each parameter followed by
its alignment padding), pad the group's end and split it into equal partitions, one per rank,
saved without the end padding (so the last ranks' are shorter): a parameter can straddle
ranks. ZeRO 3 splits every parameter on its own into
``ceil(numel / world)`` elements per rank (the last rank's part padded) and each rank
concatenates its parts, in ``param_shapes`` order over all groups, into its flat tensors.

The result is, per parameter, the `Span` list that tiles it: which rank holds which element
range, and where in that rank's flat tensor it starts. Any mismatch between the shapes and the
flat sizes is a `CheckpointError`: a checkpoint that does not add up is never read.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from ..errors import CheckpointError

__all__ = ["Span", "ParamPlace", "zero12_places", "zero3_places"]


@dataclass(frozen=True)
class Span:
    """Elements [lo, hi) of a parameter, at ``at`` in rank ``rank``'s flat tensor."""

    lo: int
    hi: int
    rank: int
    at: int


@dataclass(frozen=True)
class ParamPlace:
    group: int
    shape: tuple[int, ...]
    spans: tuple[Span, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def zero12_places(
    param_shapes: list[dict[str, tuple[int, ...]]],
    rank_numel: list[list[int]],
    alignment_paddings: list[list[int]] | None,
    where: str,
) -> dict[str, ParamPlace]:
    """Stage 1/2: ``rank_numel[g][r]`` is the size of rank r's saved partition of group g.

    DeepSpeed splits a group's flat tensor, padded at its end to its alignment, into equal
    partitions, and saves each without the part of that padding it holds: the padding sits on
    the last rank(s) only, so the saved partitions of a group differ in size and, laid end to
    end, are the group's parameters and their alignment paddings exactly."""
    if len(rank_numel) != len(param_shapes):
        raise CheckpointError(
            f"{where}: {len(param_shapes)} param groups in param_shapes but "
            f"{len(rank_numel)} flat fp32 partitions per rank"
        )
    places: dict[str, ParamPlace] = {}
    for g, shapes in enumerate(param_shapes):
        starts = [0]
        for n in rank_numel[g]:
            starts.append(starts[-1] + n)
        total = starts[-1]
        paddings = alignment_paddings[g] if alignment_paddings else [0] * len(shapes)
        if len(paddings) != len(shapes):
            raise CheckpointError(
                f"{where}: group {g} has {len(shapes)} parameters but {len(paddings)} "
                "alignment paddings"
            )
        offset = 0
        for (name, shape), pad in zip(shapes.items(), paddings, strict=True):
            numel = math.prod(shape)
            if offset + numel > total:
                raise CheckpointError(
                    f"{where}: parameter {name} ends at element {offset + numel} of group {g}, "
                    f"beyond the {total} elements its ranks' partitions hold; the checkpoint "
                    "does not match its param_shapes"
                )
            spans = []
            at = offset
            rank = bisect.bisect_right(starts, at) - 1
            while at < offset + numel:
                while starts[rank + 1] <= at:  # skip empty partitions
                    rank += 1
                end = min(offset + numel, starts[rank + 1])
                spans.append(Span(at - offset, end - offset, rank, at - starts[rank]))
                at = end
            _add(places, name, ParamPlace(g, tuple(shape), tuple(spans)), where)
            offset += numel + pad
        if offset != total:
            raise CheckpointError(
                f"{where}: the parameters of group {g} and their alignment padding are "
                f"{offset} elements, its ranks' partitions hold {total}; the checkpoint does "
                "not match its param_shapes"
            )
    return places


def zero3_places(
    param_shapes: list[dict[str, tuple[int, ...]]], flat_numel: int, world_size: int, where: str
) -> dict[str, ParamPlace]:
    """Stage 3: ``flat_numel`` is the size of each rank's flat tensors together."""
    places: dict[str, ParamPlace] = {}
    offset = 0
    for g, shapes in enumerate(param_shapes):
        for name, shape in shapes.items():
            numel = math.prod(shape)
            part = -(-numel // world_size)
            spans = tuple(
                Span(r * part, min(numel, (r + 1) * part), r, offset)
                for r in range(world_size)
                if r * part < numel
            )
            _add(places, name, ParamPlace(g, tuple(shape), spans), where)
            offset += part
    if offset != flat_numel:
        raise CheckpointError(
            f"{where}: the parameters need {offset} elements per rank, each rank's flat fp32 "
            f"groups hold {flat_numel}; the checkpoint does not match its param_shapes"
        )
    return places


def _add(places: dict[str, ParamPlace], name: str, place: ParamPlace, where: str) -> None:
    if name in places:
        raise CheckpointError(f"{where}: parameter {name} is listed twice in param_shapes")
    places[name] = place
