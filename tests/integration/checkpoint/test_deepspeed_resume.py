"""Resuming DeepSpeed 0.19.8 checkpoints (the committed fixture) with this runtime, on real
gloo ranks, at other world sizes and stages: the losses of the next steps must be the ones
DeepSpeed's own continuation gave (tests/fixtures/deepspeed/checkpoints/expected.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.engine.mp_utils import RankFailed, run_ranks

pytestmark = pytest.mark.multirank

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "deepspeed" / "checkpoints"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
WORKER = "tests/integration/checkpoint/ds_resume_worker.py"
STEPS = 3
# fp32: float reduction order only. bf16: the forward runs in bf16, so another world size
# rounds other partial sums; DeepSpeed's own losses move ~1e-2 over these steps.
TOLERANCE = {"fp32": 2e-6, "bf16": 2e-4}


def resume(world: int, saved: str, config_case: str | None = None, **kwargs) -> dict:
    out = run_ranks(
        world,
        f"{WORKER}:resume",
        {"load_dir": str(FIXTURE / saved), "case": config_case or saved, "steps": STEPS, **kwargs},
    )
    return out[0]


@pytest.mark.parametrize(
    "saved, world, config_case",
    [
        ("zero1_fp32", 2, "zero3_fp32"),  # stage 1 -> stage 3
        ("zero3_bf16", 3, None),
        ("zero3_fp32", 4, "zero2_fp32"),  # stage 3 -> stage 2, 4 ranks
        ("zero3_fp32_tied", 1, "zero1_fp32_tied"),  # tied embedding and head
    ],
)
def test_losses_continue_as_deepspeeds_own(saved, world, config_case):
    got = resume(world, saved, config_case)
    expected = EXPECTED["cases"][saved]["after"]
    tol = TOLERANCE[saved.split("_")[1]]
    assert max(abs(a - b) for a, b in zip(got["losses"], expected, strict=True)) < tol, (
        got["losses"],
        expected,
    )
    assert got["global_steps"] == 3 and got["global_samples"] == 36
    assert got["client_state"] == EXPECTED["client_state"]
    assert got["path"].endswith("global_step3")


def test_without_the_optimizer_state_the_losses_differ():
    """The comparison above can fail: Adam's moments and step change the continuation by far
    more than its tolerance."""
    got = resume(1, "zero2_fp32", load_optimizer_states=False)
    expected = EXPECTED["cases"]["zero2_fp32"]["after"]
    assert max(abs(a - b) for a, b in zip(got["losses"], expected, strict=True)) > 1e-4


def test_a_checkpoint_of_another_model_is_refused_before_any_change(tmp_path):
    """A checkpoint whose names match but whose shapes do not (another vocabulary size)."""
    with pytest.raises(RankFailed) as failure:
        run_ranks(
            1,
            f"{WORKER}:load_other_model",
            {"load_dir": str(FIXTURE / "zero2_fp32")},
        )
    assert "weight has shape [64, 16] but the model's is [80, 16]" in str(failure.value)


def test_zlaunch_resume_from_a_deepspeed_checkpoint_dir(tmp_path):
    """``zlaunch --resume --checkpoint-dir`` with DeepSpeed's save folder: the ranks resume
    from it by themselves (runtime.initialize) and continue as DeepSpeed did."""
    import shutil
    import subprocess
    import sys

    ckpt = tmp_path / "ds_ckpt"
    shutil.copytree(FIXTURE / "zero2_fp32", ckpt)
    out = tmp_path / "losses.json"
    repo = Path(__file__).resolve().parents[3]
    proc = subprocess.run(
        [
            sys.executable, "-m", "zlaunch", "--num-gpus", "2", "--no-color",
            "--log-dir", str(tmp_path / "runs"), "--resume", "--checkpoint-dir", str(ckpt),
            str(repo / WORKER), "--case", "zero2_fp32", "--out", str(out),
        ],
        cwd=str(repo),
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(out.read_text())
    expected = EXPECTED["cases"]["zero2_fp32"]["after"]
    assert got["global_steps"] == 3 + STEPS
    assert max(abs(a - b) for a, b in zip(got["losses"], expected, strict=True)) < 2e-6
