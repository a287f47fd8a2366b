"""The config key of async saves: ``checkpoint.async_save`` (pure, no process group)."""

from __future__ import annotations

import pytest

from runtime.checkpoint.async_save import async_save_default
from runtime.config import ConfigError, load_config


def raw(block):
    return load_config({"train_batch_size": 4, **block}).raw


def test_default_off_and_on_when_set():
    assert async_save_default(raw({})) is False
    assert async_save_default(raw({"checkpoint": {"tag_validation": "Warn"}})) is False
    assert async_save_default(raw({"checkpoint": {"async_save": True}})) is True


def test_a_value_that_is_not_a_bool_names_the_key():
    with pytest.raises(
        ConfigError, match=r"checkpoint\.async_save must be true or false, got 'yes'"
    ):
        async_save_default(raw({"checkpoint": {"async_save": "yes"}}))
