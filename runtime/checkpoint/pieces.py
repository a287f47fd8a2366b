"""Which pieces of which parameters a rank writes and reads: its owned ranges as pieces.

A strategy's master tensors each hold a range of a flat group (`zero.optimizer.OwnedRange`);
the parameters inside that range are pieces (`storage.Piece`). On save every rank writes its
shard's pieces (stages 1-3); where every rank holds everything (stage 0) each writes an even
1/N of every group, so all ranks share the writing. On load each rank reads the pieces the
*new* layout gives it, from whichever old shards hold them.

Per piece the kinds are ``param`` (fp32 master weights) and every optimizer state tensor the
size of the master (``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``, ...).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .storage import Piece

__all__ = [
    "PARAM",
    "element_kinds",
    "is_element_state",
    "pieces_in",
    "rank_pieces",
    "stage_pieces",
    "StagedRange",
]

PARAM = "param"


def pieces_in(group, lo: int, hi: int) -> list[tuple[Piece, int]]:
    """Pieces of parameters inside group range [lo, hi), with their position in that range."""
    out = []
    for slot in group.slots:
        a, b = max(lo, slot.offset), min(hi, slot.end)
        if a < b:
            out.append((Piece(slot.name, a - slot.offset, b - a), a - lo))
    return out


def is_element_state(value, master: torch.Tensor) -> bool:
    """Whether an optimizer state value holds one value per element of ``master``."""
    return torch.is_tensor(value) and value.numel() == master.numel() and value.numel() > 1


def element_kinds(state: dict, master: torch.Tensor) -> dict[str, torch.Tensor]:
    """The optimizer state tensors of ``master`` that hold one value per element."""
    return {k: v for k, v in state.get(master, {}).items() if is_element_state(v, master)}


def rank_pieces(
    sharding, optimizer_state: dict, rank: int, world_size: int
) -> list[tuple[Piece, dict[str, torch.Tensor]]]:
    """What this rank writes: its pieces with a view per kind."""
    out = []
    for owned in sharding.owned_ranges():
        g, lo, hi, master = owned.group, owned.lo, owned.hi, owned.master
        base = lo
        if sharding.replicated:
            # Every rank holds the whole group: write only an even 1/N of it.
            chunk = -(-g.numel // world_size)
            lo, hi = min(g.numel, rank * chunk), min(g.numel, (rank + 1) * chunk)
            base = 0
        kinds = {PARAM: master, **element_kinds(optimizer_state, master)}
        for piece, at in pieces_in(g, lo, hi):
            start = at + (lo - base)
            out.append((piece, {k: t.narrow(0, start, piece.numel) for k, t in kinds.items()}))
    return out


StagedRange = tuple[torch.Tensor, dict[str, list[tuple[int, torch.Tensor]]]]
"""A master tensor and, per kind, (position in the master, values read) for its pieces."""


def stage_pieces(reader, owned_ranges: Iterable, names: set[str], kinds: list[str]):
    """Everything this rank's masters need, read into new tensors (nothing is changed yet)."""
    staged: list[StagedRange] = []
    for owned in owned_ranges:
        master = owned.master
        per_kind: dict[str, list[tuple[int, torch.Tensor]]] = {k: [] for k in kinds}
        for piece, at in pieces_in(owned.group, owned.lo, owned.hi):
            if piece.name not in names:
                continue
            for kind in kinds:
                t = reader.read(piece.name, kind, piece.offset, piece.end)
                per_kind[kind].append((at, t.to(master.dtype if kind == PARAM else torch.float32)))
        staged.append((master, per_kind))
    return staged
