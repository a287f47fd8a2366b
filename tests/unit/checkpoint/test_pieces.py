"""Which pieces a rank writes and reads (runtime.checkpoint.pieces): pure arithmetic on a
layout, with plain tensors standing in for the master weights."""

from __future__ import annotations

import types

import torch

from runtime.checkpoint.pieces import PARAM, element_kinds, pieces_in, rank_pieces, stage_pieces
from runtime.checkpoint.storage import Piece
from runtime.zero.optimizer import OwnedRange
from runtime.zero.partition import ParamSpec, plan_layout

SPECS = [ParamSpec("a", (3,), 0), ParamSpec("b", (2, 2), 0)]  # 7 elements in one group


def _strategy(world: int, rank: int, replicated: bool):
    layout = plan_layout(SPECS, 1 if replicated else world, 1 << 20)
    (group,) = layout.groups
    lo, hi = (0, group.padded_numel) if replicated else group.shard_range(rank)
    master = torch.arange(lo, hi, dtype=torch.float32)
    owned = [OwnedRange(group, lo, hi, master)]
    return types.SimpleNamespace(replicated=replicated, owned_ranges=lambda: owned), master


def test_pieces_in_a_range_cut_parameters_at_its_ends():
    layout = plan_layout(SPECS, 1, 1 << 20)
    (group,) = layout.groups
    assert pieces_in(group, 2, 5) == [(Piece("a", 2, 1), 0), (Piece("b", 0, 2), 1)]


def test_partitioned_ranks_write_their_shards_and_together_every_element_once():
    world = 2
    seen = {}
    for rank in range(world):
        strategy, master = _strategy(world, rank, replicated=False)
        for piece, kinds in rank_pieces(strategy, {}, rank, world):
            assert set(kinds) == {PARAM}
            for i in range(piece.numel):
                seen[(piece.name, piece.offset + i)] = float(kinds[PARAM][i])
    # The value at each element is its position in the flat group (a at 0..2, b at 3..6).
    assert seen == {("a", i): float(i) for i in range(3)} | {
        ("b", i): float(3 + i) for i in range(4)
    }


def test_replicated_ranks_share_the_writing_evenly():
    world = 3
    written = []
    for rank in range(world):
        strategy, _ = _strategy(world, rank, replicated=True)
        written.append(sum(p.numel for p, _ in rank_pieces(strategy, {}, rank, world)))
    assert written == [3, 3, 1]


def test_element_state_travels_as_pieces_and_scalars_do_not():
    strategy, master = _strategy(1, 0, replicated=True)
    state = {master: {"exp_avg": torch.ones_like(master), "step": torch.tensor(3.0)}}
    assert set(element_kinds(state, master)) == {"exp_avg"}
    ((_, kinds), *_) = rank_pieces(strategy, state, 0, 1)
    assert set(kinds) == {PARAM, "exp_avg"}


def test_stage_pieces_reads_only_named_parameters_at_their_positions():
    strategy, master = _strategy(2, 1, replicated=False)
    reads = []

    def read(name, kind, lo, hi):
        reads.append((name, kind, lo, hi))
        return torch.full((hi - lo,), 7.0)

    reader = types.SimpleNamespace(read=read)
    ((staged_master, per_kind),) = stage_pieces(reader, strategy.owned_ranges(), {"b"}, [PARAM])
    assert staged_master is master
    assert [name for name, *_ in reads] == ["b"]
    ((at, values),) = per_kind[PARAM]
    lo = strategy.owned_ranges()[0].lo
    assert at == max(0, 3 - lo) and values.dtype == master.dtype
