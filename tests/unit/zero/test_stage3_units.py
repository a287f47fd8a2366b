"""Stage-3 arithmetic without ranks: how parameters become units, sub-group tiling, zero.Init
class patching and restoring."""

from __future__ import annotations

import torch

from runtime.zero.stage3.optimizer import plan_sub_groups
from runtime.zero.stage3.units import plan_units


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.proj = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight


def test_units_follow_modules_tied_weight_belongs_to_first_owner():
    model = Tied()
    params = list(model.parameters())
    layout, plan = plan_units(model, [params], world_size=2, persistence_threshold=8)
    names = [[s.name for s in g.slots] for g in layout.groups]
    # emb (80), proj weight (64); the 8-element norm and bias params are persistent, last
    assert names == [["emb.weight"], ["proj.weight"], ["norm.weight", "norm.bias", "proj.bias"]]
    assert [u.persistent for u in plan] == [False, False, True]
    # the head owns no unit: its weight is the embedding's, in the embedding's unit
    assert len(plan[0].params) == 1 and plan[0].params[0] is model.emb.weight is model.head.weight
    # padded to 2 ranks x 16-element alignment, groups back to back
    assert [g.padded_numel for g in layout.groups] == [96, 64, 32]
    assert [g.start for g in layout.groups] == [0, 96, 160]
    assert layout.shard_numel == (96 + 64 + 32) // 2


def test_units_split_by_optimizer_param_group():
    model = torch.nn.Linear(16, 16)
    groups = [[model.weight], [model.bias]]
    layout, plan = plan_units(model, groups, world_size=4, persistence_threshold=0)
    assert [(g.param_group, g.slots[0].name) for g in layout.groups] == [
        (0, "weight"),
        (1, "bias"),
    ]
    assert [u.persistent for u in plan] == [False, False]


def test_sub_groups_tile_the_step():
    assert plan_sub_groups([4, 4, 4, 10, 1], 8) == [[0, 1], [2], [3], [4]]
    assert plan_sub_groups([4, 4, 4], 10**9) == [[0, 1, 2]]
    assert plan_sub_groups([], 8) == []


def test_zero_init_patches_and_restores_module_classes():
    import runtime.zero.init_context as zinit

    before = torch.nn.Linear.__init__
    init = zinit.Init(enabled=True)
    init._comm = object()  # never used: nothing is partitioned below
    init.partition_module = lambda module: None
    with init:
        assert torch.nn.Linear.__init__ is not before
        assert getattr(torch.nn.Linear.__init__, "_zero_wrapped", False)

        class Local(torch.nn.Module):
            def __init__(self):
                super().__init__()

        assert getattr(Local.__init__, "_zero_wrapped", False)  # classes defined inside too
    assert torch.nn.Linear.__init__ is before
    assert "__init_subclass__" not in torch.nn.Module.__dict__
