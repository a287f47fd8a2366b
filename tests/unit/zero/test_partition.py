"""Partition arithmetic: groups, padding, shards and per-parameter slices (pure, fast)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.zero.partition import ParamSpec, plan_layout, shard_owner_ranges


def specs(*shapes, group=0):
    return [ParamSpec(f"p{i}", tuple(s), group) for i, s in enumerate(shapes)]


def test_groups_fill_up_to_the_bucket_size_in_the_given_order():
    layout = plan_layout(specs((10,), (20,), (5, 2), (30,)), world_size=1, bucket_numel=30)
    assert [[s.name for s in g.slots] for g in layout.groups] == [["p0", "p1"], ["p2"], ["p3"]]
    assert [(s.offset, s.numel) for s in layout.groups[0].slots] == [(0, 10), (10, 20)]
    assert [g.start for g in layout.groups] == [0, 30, 40]
    assert layout.total_numel == 70 and layout.param_numel == 70


def test_a_parameter_larger_than_the_bucket_gets_its_own_group():
    layout = plan_layout(specs((4,), (100,), (4,)), world_size=1, bucket_numel=8)
    assert [[s.name for s in g.slots] for g in layout.groups] == [["p0"], ["p1"], ["p2"]]
    assert layout.max_group_numel == 100


def test_param_groups_never_share_a_group():
    params = specs((3,), (3,)) + [ParamSpec("q", (3,), 1)]
    layout = plan_layout(params, world_size=1, bucket_numel=100)
    assert [(g.param_group, [s.name for s in g.slots]) for g in layout.groups] == [
        (0, ["p0", "p1"]),
        (1, ["q"]),
    ]


def test_padding_makes_every_group_split_into_aligned_equal_shards():
    layout = plan_layout(specs((10,), (7,)), world_size=4, bucket_numel=100, align=16)
    (g,) = layout.groups
    assert g.numel == 17
    assert g.padded_numel == 64  # next multiple of 4 * 16
    assert g.shard_numel == 16
    assert [g.shard_range(r) for r in range(4)] == [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert shard_owner_ranges(layout, 2) == [(32, 48)]
    with pytest.raises(ValueError):
        g.shard_range(4)


def test_shard_slices_name_each_parameter_piece():
    layout = plan_layout(specs((6,), (6,)), world_size=3, bucket_numel=100)
    (g,) = layout.groups
    assert g.padded_numel == 12 and g.shard_numel == 4
    got = {
        r: [(s.name, s.param_offset, s.shard_offset, s.numel) for s in g.shard_slices(r)]
        for r in range(3)
    }
    assert got == {
        0: [("p0", 0, 0, 4)],
        1: [("p0", 4, 0, 2), ("p1", 0, 2, 2)],
        2: [("p1", 2, 0, 4)],
    }


def test_locate_and_manifest_description():
    layout = plan_layout(specs((2, 3), (4,)), world_size=2, bucket_numel=6)
    group, slot = layout.locate("p1")
    assert (group.index, slot.offset, slot.numel, slot.shape) == (1, 0, 4, (4,))
    desc = layout.to_dict()
    assert desc["world_size"] == 2
    assert desc["groups"][0]["params"] == [{"name": "p0", "offset": 0, "numel": 6, "shape": [2, 3]}]
    assert desc["groups"][1]["start"] == 6


def test_invalid_arguments_are_rejected():
    with pytest.raises(ValueError):
        plan_layout(specs((2,)), world_size=0, bucket_numel=10)
    with pytest.raises(ValueError):
        plan_layout(specs((2,)), world_size=1, bucket_numel=0)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=12),
    world=st.integers(1, 8),
    bucket=st.integers(1, 120),
    align=st.sampled_from([1, 4, 16]),
)
def test_shards_cover_every_parameter_element_exactly_once(sizes, world, bucket, align):
    layout = plan_layout(specs(*[(n,) for n in sizes]), world, bucket, align)
    assert layout.param_numel == sum(sizes)
    covered = {f"p{i}": [0] * n for i, n in enumerate(sizes)}
    previous_end = 0
    for g in layout.groups:
        assert g.start == previous_end
        previous_end = g.start + g.padded_numel
        assert g.padded_numel % (world * align) == 0
        assert g.numel <= max(bucket, max(s.numel for s in g.slots))
        for r in range(world):
            for piece in g.shard_slices(r):
                assert 0 <= piece.shard_offset and piece.shard_offset + piece.numel <= g.shard_numel
                for k in range(piece.numel):
                    covered[piece.name][piece.param_offset + k] += 1
    assert all(c == 1 for counts in covered.values() for c in counts)
