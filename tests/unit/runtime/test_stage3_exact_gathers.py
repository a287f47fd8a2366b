"""Which stage-3 units qwZ leaves exact, said once (`stage3.fetch.exact_gathers_note`), on
units planned from torch's own layers exactly as `stage3.build` plans them (no ranks)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from runtime.zero.param_offload import ShardStore
from runtime.zero.stage3.fetch import UnitFetch, exact_gathers_note
from runtime.zero.stage3.units import Unit, plan_frozen_units, plan_units

THRESHOLD = int(1e5)  # stage3_param_persistence_threshold's default


class Encoder(torch.nn.Module):
    """Four torch encoder layers of width 128 between an embedding and a head."""

    def __init__(self, feedforward: int):
        super().__init__()
        self.emb = torch.nn.Embedding(256, 128)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(128, 4, feedforward, dropout=0.0, batch_first=True)
            for _ in range(4)
        )
        self.head = torch.nn.Linear(128, 256)


def _units(model, world_size: int, threshold: int = THRESHOLD) -> list[Unit]:
    trained = [p for p in model.parameters() if p.requires_grad]
    layout, plans = plan_units(model, [trained], world_size, threshold)
    store = ShardStore(layout, 0, torch.float32, torch.device("cpu"))
    units = [
        Unit(g, plan.params, plan.persistent, store, plan.leaf)
        for g, plan in zip(layout.groups, plans, strict=True)
    ]
    frozen = plan_frozen_units(model, {id(p) for p in trained}, world_size, threshold)
    for group, plan in frozen:
        own = ShardStore(type(layout)((group,), world_size), 0, torch.float32, "cpu")
        units.append(Unit(group, plan.params, False, own, plan.leaf))
    return units


def _fetch(world_size: int, **flags) -> UnitFetch:
    return UnitFetch(SimpleNamespace(world_size=world_size), **flags)


def test_a_model_of_persistent_parameters_only_says_qwz_quantizes_nothing():
    # Every parameter (in_proj 49,152, the 512-wide feed-forward 65,536, embedding and head
    # 32,768) is at most the default threshold: one persistent unit, gathered exactly.
    units = _units(Encoder(feedforward=512), world_size=4)
    assert [u.persistent for u in units] == [True]
    note = exact_gathers_note(
        units, _fetch(4, quantize_trained=True, quantize_frozen=True), THRESHOLD
    )
    assert note.level == logging.WARNING
    assert note.message == (
        "zero_quantized_weights quantizes nothing in this model: all 858,880 parameter "
        "elements are persistent; persistent parameters (each of at most "
        "stage3_param_persistence_threshold = 100,000 elements) are gathered once after every "
        "optimizer step and never quantized, as DeepSpeed does. To quantize their gathers set "
        "stage3_param_persistence_threshold below 65,536 (the largest parameter), or to 0"
    )


def test_a_minority_left_exact_is_named_with_its_share():
    # Width 2048: the feed-forward weights (262,144 each) are partitioned and quantized; the
    # attention, norms, biases, embedding and head stay persistent, about 14% of the model.
    units = _units(Encoder(feedforward=2048), world_size=4)
    note = exact_gathers_note(
        units, _fetch(4, quantize_trained=True, quantize_frozen=True), THRESHOLD
    )
    assert note.level == logging.INFO
    assert note.message.startswith(
        "zero_quantized_weights: 8 unit(s) quantized; 340,736 of 2,437,888 parameter elements "
        "(14%) stay exact: persistent parameters"
    )


def test_nothing_to_say_when_every_unit_is_quantized_or_qwz_is_off():
    units = _units(Encoder(feedforward=512), world_size=4, threshold=0)
    assert not any(u.persistent for u in units)
    assert (
        exact_gathers_note(units, _fetch(4, quantize_trained=True, quantize_frozen=True), 0) is None
    )
    assert exact_gathers_note(units, _fetch(4), 0) is None


def test_one_rank_has_nothing_to_quantize():
    units = _units(Encoder(feedforward=2048), world_size=1)
    note = exact_gathers_note(
        units, _fetch(1, quantize_trained=True, quantize_frozen=True), THRESHOLD
    )
    assert note.level == logging.WARNING
    assert "quantizes nothing at 1 data-parallel rank" in note.message


@pytest.mark.parametrize("frozen_width", [2048, 512])
def test_nontrainable_quantization_covers_frozen_units_only(frozen_width):
    model = Encoder(feedforward=frozen_width)
    model.layers[0].requires_grad_(False)
    units = _units(model, world_size=4)
    note = exact_gathers_note(units, _fetch(4, quantize_frozen=True), THRESHOLD)
    if frozen_width == 2048:  # the frozen layer's two feed-forward weights are units
        assert note is None
    else:  # every frozen parameter is small: stays whole, never gathered
        assert note.level == logging.WARNING
        assert note.message.startswith(
            "zero_quantized_nontrainable_weights quantizes nothing: no frozen parameter of "
            "more than stage3_param_persistence_threshold = 100,000 elements is partitioned"
        )
