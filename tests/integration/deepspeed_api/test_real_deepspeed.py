"""Where DeepSpeed is installed (the bench extra): zlaunch's default keeps it, and the same
Trainer script under zlaunch with real DeepSpeed still gives the numbers reference.json recorded
(the recording is current, and the real-DeepSpeed path through zlaunch keeps working)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from .cases import CASES, REFERENCE, ROOT, outcome

# The script runs behind this, so DeepSpeed builds no C++ op (tests/fixtures/deepspeed/no_jit.py).
NO_JIT = os.path.join(ROOT, "tests", "fixtures", "deepspeed", "no_jit.py")

pytestmark = [
    pytest.mark.multirank,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed"
    ),
]


def test_default_runtime_is_the_installed_deepspeed_with_the_recorded_numbers(tmp_path):
    case = CASES["zero2"]
    command = [
        sys.executable, "-m", "zlaunch", "--num-gpus", str(case.ranks), "--no-color",
        "--log-dir", str(tmp_path / "runs"), NO_JIT, case.script, *case.args(str(tmp_path)),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONPATH=ROOT)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "DeepSpeed API: installed DeepSpeed " in done.stderr
    assert "zlaunch: step 1" not in done.stderr  # DeepSpeed's engine trained, not the runtime's
    with open(REFERENCE) as f:
        want = json.load(f)["cases"]["zero2"]
    got = outcome(case, str(tmp_path))
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-6)
    assert got["eval_losses"] == pytest.approx(want["eval_losses"], rel=1e-6)
    flat = [v for row in got["logits"] for v in row]
    assert flat == pytest.approx([v for row in want["logits"] for v in row], abs=1e-5)
