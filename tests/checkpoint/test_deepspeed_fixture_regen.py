"""The committed DeepSpeed fixture is what real DeepSpeed writes: regenerate one case with the
installed DeepSpeed (the bench extra) and compare. Skipped where DeepSpeed is not installed."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from runtime.checkpoint.formats.deepspeed import DeepSpeedReader
from tests.runtime.mp_utils import run_ranks

pytestmark = [
    pytest.mark.multirank,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="DeepSpeed is not installed (pip install -e .[bench] to regenerate the fixture)",
    ),
]

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "deepspeed" / "checkpoints"
SCRIPT = "tests/fixtures/deepspeed/make_deepspeed_checkpoints.py"


def test_deepspeed_writes_what_the_fixture_holds(tmp_path, monkeypatch):
    import deepspeed

    expected = json.loads((FIXTURE / "expected.json").read_text())
    if deepspeed.__version__ != expected["deepspeed"]:
        pytest.skip(
            f"fixture written by DeepSpeed {expected['deepspeed']}, {deepspeed.__version__} installed"
        )
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    case = "zero2_bf16"
    got = run_ranks(2, f"{SCRIPT}:train_and_save", {"case": case, "out": str(tmp_path)}, 600)[0]
    want = expected["cases"][case]
    assert got["before"] == want["before"] and got["after"] == want["after"]
    with DeepSpeedReader(str(tmp_path / "global_step3")) as reader:
        for name, (total, _) in want["fp32_fingerprint"].items():
            assert math.isclose(float(reader.read_full(name).double().sum()), total, rel_tol=1e-12)
