"""The census (runtime/deepspeed_api/census.json): every ``deepspeed.X.Y`` module, attribute and
engine attribute that transformers, accelerate, Lightning (and Fabric), TRL, peft, DeepSpeed's
examples and Megatron-DeepSpeed reach resolves against the bundled package: served, or
`NotInBundledRuntime` naming it; never AttributeError or ModuleNotFoundError.

No process group: an entry is resolved by import and attribute lookup alone.
"""

from __future__ import annotations

import importlib
import json
import os

import pytest

from runtime.deepspeed_api import PATH

COMPAT = "runtime.deepspeed_api.deepspeed"
_missing = importlib.import_module(f"{COMPAT}._missing")
NotInBundledRuntime = _missing.NotInBundledRuntime

with open(os.path.join(PATH, "census.json")) as _f:
    CENSUS = json.load(_f)


def resolve(name: str):
    """The object ``name`` (``deepspeed.a.b``) reaches in the bundled package."""
    parts = name.split(".")
    assert parts[0] == "deepspeed", name
    obj = importlib.import_module(COMPAT)
    for part in parts[1:]:
        obj = getattr(obj, part)
    return obj


def test_the_census_lists_its_sources():
    assert set(CENSUS["sources"]) == {
        "DeepSpeedExamples", "Megatron-DeepSpeed", "accelerate", "peft", "pytorch-lightning",
        "transformers", "trl",
    }  # fmt: skip
    for entry in CENSUS["entries"]:
        assert entry["from"] and all(w.split(":")[0] in CENSUS["sources"] for w in entry["from"])
    kinds = {e["kind"] for e in CENSUS["entries"]}
    assert kinds == {"module", "name", "attribute", "engine"}


@pytest.mark.parametrize("entry", CENSUS["entries"], ids=lambda e: f"{e['kind']}:{e['name']}")
def test_each_entry_is_served_or_named(entry):
    kind, name = entry["kind"], entry["name"]
    try:
        if kind == "module":
            importlib.import_module(COMPAT + name[len("deepspeed") :])
        elif kind == "engine":
            # DeepSpeed's engine attribute: served or named on a built engine, checked for
            # every name of the list in tests/integration/deepspeed_api/test_engine_queries.py.
            names = importlib.import_module(f"{COMPAT}.runtime.engine_names")
            assert name.split(".", 1)[1] in names.DEEPSPEED_ENGINE_NAMES, name
        else:
            resolve(name)
    except NotInBundledRuntime as err:
        # Named: the error's text holds the entry (or the part of it that is missing).
        text = str(err)
        assert any(
            ".".join(name.split(".")[:i]) in text for i in range(len(name.split(".")), 1, -1)
        ), (name, text)
