"""Stage 3 when ranks run different modules: reported by name, never an abort, a hang or a
silently wrong step; mixture-of-experts layers trained whole (found, or declared).

The zoo (tests/cluster/zoo) checks that third-party architectures train right; these tests check what
happens when the ranks' executions differ, and the expert-layer detection on its own.
"""

from __future__ import annotations

import pytest
import torch


def test_expert_layers_found_in_both_layouts():
    """A container with forward (Switch's experts ModuleDict) is the leaf itself; a plain
    ModuleList of experts makes its calling parent the leaf; other stacks are left alone."""
    from runtime.zero.leaf_modules import find_expert_leaves, leaf_modules, set_z3_leaf_modules

    class Expert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(4, 4)

    class MoE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = torch.nn.Linear(4, 2)
            self.experts = torch.nn.ModuleList([Expert(), Expert()])

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
            self.moe = MoE()

    net = Net()
    assert list(find_expert_leaves(net)) == ["moe"]
    set_z3_leaf_modules(net, [Expert])
    # a declared leaf inside a found one is part of the outer one
    assert list(leaf_modules(net)) == ["moe"]
    with pytest.raises(ValueError, match="no module of the model is a Conv2d"):
        set_z3_leaf_modules(net, [torch.nn.Conv2d])

    transformers = pytest.importorskip("transformers")
    from tests.cluster.zoo.models import ZOO

    switch = ZOO["switch_moe"].build()
    found = find_expert_leaves(switch)
    assert found and all(n.endswith("mlp.experts") for n in found)
    assert all(type(m).__name__ == "SwitchTransformersExperts" for m in found.values())
    llama = ZOO["llama"].build()
    assert find_expert_leaves(llama) == {}
    del transformers


def test_parameter_reads_reach_the_coordinator_and_copies_stay_plain():
    """Reading ``module.weight`` goes through the lookup stage 3 fetches in; iterating the
    parameters or the state dict does not; a copy of the model carries no coordinator."""
    import copy

    from runtime.zero.stage3.access import FetchingParameters, install, uninstall

    model = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    out_proj_weight = model.self_attn.out_proj.weight
    reads = []
    install(model, reads.append)
    assert type(model.self_attn.out_proj._parameters) is FetchingParameters
    list(model.parameters())
    model.state_dict()
    assert reads == []
    model(torch.randn(1, 3, 8))
    forward_reads = list(reads)
    # MultiheadAttention reads its out_proj's weight without calling out_proj
    assert any(p is out_proj_weight for p in forward_reads)
    clone = copy.deepcopy(model)
    assert type(clone.self_attn.out_proj._parameters) is dict
    uninstall(model)
    assert type(model.self_attn.out_proj._parameters) is dict
