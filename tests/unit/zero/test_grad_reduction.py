"""`communication_data_type`, `prescale_gradients`, `gradient_predivide_factor`: what the config
accepts (DeepSpeed's spellings), what it refuses or notes where DeepSpeed asserts or ignores,
and what the reduction does with them (runtime.zero.reduction)."""

from __future__ import annotations

import warnings

import pytest
import torch

from runtime.config import ConfigError, load_config
from runtime.config.load import ConfigWarning
from runtime.zero.reduction import GradReduction
from tests.unit.config.test_fidelity_config import deepspeed_config_class

BASE = {"train_micro_batch_size_per_gpu": 2}


def load(**top):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = load_config({**BASE, **top}, origin="ds.json")
    return config, [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


def error(**top) -> str:
    with pytest.raises(ConfigError) as info:
        load_config({**BASE, **top}, origin="ds.json")
    return str(info.value)


@pytest.mark.parametrize(
    "given, read",
    [("fp16", "fp16"), ("BF16", "bf16"), ("Fp32", "fp32"), (None, None)],
)
def test_communication_data_type_spellings_deepspeed_reads(given, read):
    config, notes = load(communication_data_type=given)
    assert config.communication_data_type == read
    assert notes == []


def test_communication_data_type_reads_as_deepspeed_where_installed():
    if deepspeed_config_class() is None:
        pytest.skip("deepspeed is not installed")
    from deepspeed.runtime.config import get_communication_data_type

    for given in ("fp16", "BF16", "fp32"):
        config, _ = load(communication_data_type=given)
        ours = GradReduction.from_config(config, torch.float32, 2).wire_dtype
        assert ours == get_communication_data_type({"communication_data_type": given})
    with pytest.raises(ValueError):
        get_communication_data_type({"communication_data_type": "bfloat16"})


@pytest.mark.parametrize(
    "value, expected",
    [
        (
            "bfloat16",
            'ds.json: communication_data_type must be "fp32", "fp16" or "bf16" (or null: the '
            "training dtype), got 'bfloat16' (write \"bf16\", as DeepSpeed reads it)",
        ),
        (
            "int8",
            'ds.json: communication_data_type must be "fp32", "fp16" or "bf16" (or null: the '
            "training dtype), got 'int8'",
        ),
        (
            16,
            'ds.json: communication_data_type must be "fp32", "fp16" or "bf16" (or null: the '
            "training dtype), got 16",
        ),
    ],
)
def test_bad_communication_data_type_is_refused_by_name(value, expected):
    assert error(communication_data_type=value) == expected


def test_bad_scaling_values_are_refused():
    assert error(prescale_gradients="yes") == (
        "ds.json: prescale_gradients must be true or false, got 'yes'"
    )
    assert (
        error(gradient_predivide_factor=0)
        == "ds.json: gradient_predivide_factor must be > 0, got 0"
    )
    assert "must be a number" in error(gradient_predivide_factor="2")


@pytest.mark.parametrize(
    "zero, fix",
    [
        ({"stage": 2}, 'set "zero_optimization": {"reduce_scatter": false}'),
        ({"stage": 3}, "remove it (stage 3 always reduce-scatters)"),
    ],
)
def test_scaling_keys_refused_where_deepspeed_asserts(zero, fix):
    stage = zero["stage"]
    message = error(gradient_predivide_factor=2.0, zero_optimization=zero)
    assert message.startswith(
        f"ds.json: gradient_predivide_factor = 2 is not supported at ZeRO stage {stage} with "
        "reduce-scatter (DeepSpeed asserts the same"
    )
    assert message.endswith(fix)
    message = error(prescale_gradients=True, zero_optimization=zero)
    assert message.startswith("ds.json: prescale_gradients = true is not supported")


def test_stage1_with_reduce_scatter_notes_that_the_keys_do_nothing():
    config, notes = load(gradient_predivide_factor=4, zero_optimization={"stage": 1})
    assert notes == [
        "ds.json: gradient_predivide_factor = 4 has no effect at ZeRO stage 1 with "
        "reduce_scatter (as in DeepSpeed, gradients are divided by the world size before the "
        "reduce-scatter)"
    ]
    assert GradReduction.from_config(config, torch.float32, 4) == GradReduction(
        torch.float32, 4.0, 1.0
    )


def test_prescale_wins_over_the_factor_with_a_note():
    config, notes = load(prescale_gradients=True, gradient_predivide_factor=2)
    assert len(notes) == 1 and "gradient_predivide_factor = 2 has no effect" in notes[0]
    assert GradReduction.from_config(config, torch.float32, 8) == GradReduction(
        torch.float32, 8.0, 1.0
    )


@pytest.mark.parametrize(
    "top, zero, world, expected",
    [
        # the defaults: the mean's 1/N before the reduction, nothing after
        ({}, {"stage": 0}, 4, (4.0, 1.0)),
        ({}, {"stage": 2}, 4, (4.0, 1.0)),
        # DeepSpeed's meaning: /f before the all-reduce, x f/N after
        ({"gradient_predivide_factor": 2.0}, {"stage": 0}, 8, (2.0, 0.25)),
        (
            {"gradient_predivide_factor": 3.0},
            {"stage": 2, "reduce_scatter": False},
            2,
            (3.0, 1.5),
        ),
        ({"prescale_gradients": True}, {"stage": 0}, 8, (8.0, 1.0)),
    ],
)
def test_where_the_division_happens(top, zero, world, expected):
    config, _ = load(zero_optimization=zero, **top)
    reduction = GradReduction.from_config(config, torch.float32, world)
    assert (reduction.pre_divisor, reduction.post_factor) == expected
    # pre x post^-1 is always the world size: the result is the mean
    assert reduction.pre_divisor / reduction.post_factor == world


@pytest.mark.parametrize(
    "precision, wire, expected",
    [
        ("fp32", None, torch.float32),
        ("fp32", "bf16", torch.bfloat16),
        ("fp32", "fp16", torch.float16),
        ("bf16", None, torch.bfloat16),
        ("bf16", "fp32", torch.float32),
        ("fp16", None, torch.float16),
    ],
)
def test_wire_dtype_defaults_to_the_training_dtype(precision, wire, expected):
    top = {"communication_data_type": wire}
    if precision != "fp32":
        top[precision] = {"enabled": True}
    config, _ = load(**top)
    grad_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    reduction = GradReduction.from_config(config, grad_dtype, 2)
    assert reduction.wire_dtype == expected
    assert reduction.wire_for(grad_dtype) == (None if expected == grad_dtype else expected)
