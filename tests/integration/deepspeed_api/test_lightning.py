"""PyTorch Lightning's DeepSpeed strategy on the bundled runtime: `lightning_fit.py` under
``zlaunch --num-gpus 2 --runtime bundled`` at ZeRO stages 2 and 3 gives, per step, the losses
real DeepSpeed 0.19.8 gave on the same script (lightning_reference.json, recorded with the
command it names; fp32 on CPU, so equal to float rounding of the gradient sums' order).

Lightning refuses the DeepSpeed strategy on CPU whatever serves ``import deepspeed``; the
script skips that check itself (README.md, "Lightning"), the product does not.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from .cases import ROOT

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "lightning_fit.py")
with open(os.path.join(HERE, "lightning_reference.json")) as _f:
    REFERENCE = json.load(_f)["cases"]

pytestmark = [
    pytest.mark.multirank,
    pytest.mark.skipif(
        importlib.util.find_spec("pytorch_lightning") is None,
        reason="pytorch-lightning is not installed (the test extra)",
    ),
]


@pytest.mark.parametrize("strategy", ["deepspeed_stage_2", "deepspeed_stage_3"])
def test_lightning_deepspeed_strategy_trains_with_deepspeeds_losses(strategy, tmp_path):
    out = tmp_path / "losses.json"
    command = [
        sys.executable, "-m", "zlaunch", "--num-gpus", "2", "--runtime", "bundled",
        "--no-color", "--log-dir", str(tmp_path / "runs"), SCRIPT, strategy, str(out),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    # The bundled runtime's engine trained, not an installed DeepSpeed's.
    assert "DeepSpeed API: zlaunch's bundled runtime" in done.stderr
    assert "zlaunch: step 1" in done.stderr
    got, want = json.loads(out.read_text()), REFERENCE[strategy]
    assert got["global_step"] == want["global_step"] == 8
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-6)
