"""Values written "auto" (runtime/config/auto_values.py): the ones the Hugging Face Trainer
and accelerate fill in are left to the script and named, a block that needs them is checked
without them, and any other "auto" is checked like any value."""

from __future__ import annotations

import json

import pytest

from runtime.config import ConfigError, ConfigWarning, filled_by_integrations, load_leaving_autos


def _write(tmp_path, data):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_the_integrations_values_are_left_and_named(tmp_path):
    path = _write(
        tmp_path,
        {
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
        },
    )
    with pytest.warns(ConfigWarning, match='"auto" for lr'):  # validate_config says it once
        config, autos, unchecked = load_leaving_autos(path)
    assert autos == ["train_micro_batch_size_per_gpu", "optimizer.params.lr"]
    assert unchecked == [] and config is not None


def test_an_auto_nobody_fills_is_checked_like_any_value(tmp_path):
    assert not filled_by_integrations("optimizer.type")
    path = _write(tmp_path, {"train_batch_size": 8, "optimizer": {"type": "auto"}})
    with pytest.raises(ConfigError):
        load_leaving_autos(path)
