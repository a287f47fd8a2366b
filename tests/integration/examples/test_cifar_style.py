"""A DeepSpeedExamples-style script (examples/cifar_style_deepspeed.py: DeepSpeed's command-line
arguments, ``init_distributed``, ``get_accelerator().set_device``, ``deepspeed.moe.utils``
imported at the top, the engine's data loader, ``bfloat16_enabled()``) on the bundled runtime
under ``zlaunch --num-gpus 2 --runtime bundled`` at ZeRO stages 2 and 3: the per-step losses
real DeepSpeed 0.19.8 gave on the same script (cifar_style_reference.json, recorded with the
command it names; measured equal to the last bit at both stages)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "examples", "cifar_style_deepspeed.py")
with open(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "cifar_style_reference.json")
) as _f:
    REFERENCE = json.load(_f)["stages"]

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("stage", [2, 3])
def test_cifar_style_script_trains_with_deepspeeds_losses(stage, tmp_path):
    out = tmp_path / "losses.json"
    command = [
        sys.executable, "-m", "zlaunch", "--num-gpus", "2", "--runtime", "bundled",
        "--no-color", "--log-dir", str(tmp_path / "runs"), SCRIPT,
        "--stage", str(stage), "--steps", "8", "--out", str(out),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "DeepSpeed API: zlaunch's bundled runtime" in done.stderr
    assert "zlaunch: step 1" in done.stderr  # the runtime's engine trained
    got, want = json.loads(out.read_text()), REFERENCE[str(stage)]
    assert got["global_steps"] == want["global_steps"] == 8
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-6)
