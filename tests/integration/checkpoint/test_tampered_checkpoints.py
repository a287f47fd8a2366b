"""Crafted checkpoints. Every tampering of a manifest is one CheckpointError,
raised before the first tensor is written into the engine (which trains on as it was), and
every allocation is bounded by the manifest's declared sizes. One gloo rank in a fresh
process for the engine loads; the reader alone needs none."""

from __future__ import annotations

import pytest

from tests.integration.checkpoint.tampered_ckpt_worker import TAMPERED
from tests.integration.engine.mp_utils import run_ranks

WORKER = "tests/integration/checkpoint/tampered_ckpt_worker.py"


@pytest.fixture(scope="module")
def loads(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("tampered"))
    return run_ranks(1, f"{WORKER}:tampered_loads", {"tmp": tmp})[0]


@pytest.mark.parametrize("name", sorted(TAMPERED))
def test_a_tampered_manifest_is_one_checkpoint_error_and_changes_nothing(loads, name):
    error, unchanged = loads[name]
    assert error is not None, f"{name}: the tampered checkpoint loaded"
    assert not error.startswith("FOREIGN"), error
    assert "manifest.json" in error, error
    assert unchanged, f"{name}: the engine changed before the load failed"


def test_the_engine_trains_on_and_the_intact_checkpoint_still_loads(loads):
    assert isinstance(loads["trains on"], float)
    assert loads["good"] == {"epoch": 1}
