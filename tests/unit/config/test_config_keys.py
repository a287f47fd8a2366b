"""runtime.config.keys: the one check of which keys a config mapping may hold."""

from __future__ import annotations

import pytest

from runtime.config.keys import Setting, check_keys
from runtime.config.values import ConfigError

FIELDS = ("stage", "overlap_comm")


def test_fields_and_aliases_become_settings_in_order():
    settings = check_keys(
        "zero", {"overlap": True, "stage": 2}, FIELDS, aliases={"overlap": "overlap_comm"}
    )
    assert settings == [Setting("overlap", "overlap_comm", True), Setting("stage", "stage", 2)]


def test_alias_and_field_together_are_refused():
    with pytest.raises(ConfigError, match="zero.overlap and zero.overlap_comm both set"):
        check_keys(
            "zero", {"overlap": 1, "overlap_comm": 1}, FIELDS, aliases={"overlap": "overlap_comm"}
        )


def test_accepted_keys_pass_or_are_refused_by_their_check():
    accepted = {"elastic": lambda v: "is enabled but not supported" if v else None}
    assert check_keys(None, {"elastic": False}, FIELDS, accepted) == []
    with pytest.raises(ConfigError, match="^elastic is enabled but not supported$"):
        check_keys(None, {"elastic": True}, FIELDS, accepted)


@pytest.mark.parametrize(
    "where, key, kwargs, message",
    [
        ("zero", "stge", {}, "zero.stge is not a valid key; did you mean 'stage'?"),
        ("zero", "zzz", {}, "zero.zzz is not a valid key; valid keys: overlap_comm, stage"),
        (
            None,
            "zzz",
            {"unknown": "is not a DeepSpeed config key", "otherwise": "remove it"},
            "zzz is not a DeepSpeed config key; remove it",
        ),
    ],
)
def test_unknown_key_names_its_path_and_the_fix(where, key, kwargs, message):
    with pytest.raises(ConfigError) as info:
        check_keys(where, {key: 1}, FIELDS, **kwargs)
    assert str(info.value) == message


def test_accepted_and_alias_names_are_suggested_too():
    with pytest.raises(ConfigError, match="did you mean 'elastic'"):
        check_keys(None, {"elastc": 1}, FIELDS, {"elastic": lambda v: None})
