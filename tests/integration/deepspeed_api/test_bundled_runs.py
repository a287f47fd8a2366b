"""Unmodified Hugging Face scripts on the bundled runtime, against real DeepSpeed.

Each case of `cases.CASES` runs once under ``zlaunch --num-gpus 2 --runtime bundled`` (the
compatibility package serves ``import deepspeed``, even where DeepSpeed is installed) and is
compared with the same script under torchrun with DeepSpeed 0.19.8, whose numbers
`make_reference.py` recorded in reference.json: per-step losses and gradient norms, and the
saved model's logits after ``from_pretrained`` (the LoRA adapter's tensors for TRL). A Trainer
checkpoint written at 2 ranks then resumes at 4 and must continue with the same losses.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest

from .cases import CASES, REFERENCE, ROOT, SAVE_STEPS, outcome, probe_logits

pytestmark = [pytest.mark.multirank, pytest.mark.slow]

with open(REFERENCE) as _f:
    EXPECTED = json.load(_f)["cases"]

# fp32 runs: the bundled runtime and DeepSpeed sum gradients in different orders, nothing more.
# The TRL run is bf16: rounding shows from the fourth digit of the gradient norm on.
LOSS_RTOL = {"sft_lora_zero3": 1e-3}
NORM_RTOL = {"sft_lora_zero3": 2e-3}


def launch(case, out: str, ranks: int | None = None) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "zlaunch", "--num-gpus", str(ranks or case.ranks),
        "--runtime", "bundled", "--no-color", "--log-dir", os.path.join(out, "runs"),
        case.script, *case.args(out),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (output directory, zlaunch's stderr, outcome); one run per case."""
    results = {}
    for name, case in CASES.items():
        out = str(tmp_path_factory.mktemp(name))
        done = launch(case, out)
        results[name] = (out, done.stderr, outcome(case, out))
    return results


def test_the_bundled_runtime_served_every_run(runs):
    for _, stderr, _ in runs.values():
        assert "DeepSpeed API: zlaunch's bundled runtime (--runtime bundled;" in stderr
        # The runtime's own step line: its engine, not DeepSpeed's, trained.
        assert "zlaunch: step 1" in stderr


@pytest.mark.parametrize("name", list(CASES))
def test_per_step_losses_equal_deepspeeds(runs, name):
    got, want = runs[name][2], EXPECTED[name]
    assert list(got["losses"]) == list(want["losses"])  # the same steps logged
    rtol = LOSS_RTOL.get(name, 2e-5)
    assert got["losses"] == pytest.approx(want["losses"], rel=rtol)
    assert got["grad_norms"] == pytest.approx(want["grad_norms"], rel=NORM_RTOL.get(name, 1e-4))
    assert got.get("eval_losses", {}) == pytest.approx(want.get("eval_losses", {}), rel=rtol)
    if name == "zero2":
        assert list(want["eval_losses"]) == ["3", "6"]


@pytest.mark.parametrize("name", ["zero2", "zero3", "accelerate_zero2"])
def test_saved_model_loads_with_deepspeeds_logits(runs, name):
    got, want = runs[name][2]["logits"], EXPECTED[name]["logits"]
    assert len(got) == 16 and len(got[0]) == 128
    flat_got = [v for row in got for v in row]
    flat_want = [v for row in want for v in row]
    assert flat_got == pytest.approx(flat_want, abs=2e-4)


def test_lora_adapter_at_zero3_equals_deepspeeds(runs):
    got, want = runs["sft_lora_zero3"][2]["adapter"], EXPECTED["sft_lora_zero3"]["adapter"]
    assert sorted(got) == sorted(want) and len(got) == 8  # q_proj, v_proj x A, B x 2 layers
    for key in want:
        assert len(got[key]) == len(want[key]) > 0  # whole tensors, not ZeRO-3 shards
        if "lora_B" in key:  # initialised to zero: trained
            assert any(v != 0 for v in got[key])
        # bf16: Adam turns the last bit of a near-zero gradient into a whole step, so single
        # elements drift; the tensor as a whole agrees to 2% (its 3 effective updates make up
        # ~30% of it: a wrong learning rate, scale or reduction is off by far more).
        assert math.dist(got[key], want[key]) <= 0.02 * math.hypot(*want[key]), key


def test_checkpoint_from_2_ranks_resumes_at_4(runs, tmp_path):
    """The zero2 run saved checkpoint-3 at 2 ranks (2 per rank x 2 accumulated); at 4 ranks
    with no accumulation the global batch and the data order are the same, so steps 4-6 must
    repeat the uninterrupted run's losses and end at the same weights."""
    out, _, uninterrupted = runs["zero2"]
    checkpoint = os.path.join(out, "trainer", f"checkpoint-{SAVE_STEPS}")
    assert os.path.isdir(os.path.join(checkpoint, f"global_step{SAVE_STEPS}"))
    case = dataclasses.replace(
        CASES["zero2"],
        grad_accum=1,
        save_steps=None,
        extra=("--resume_from_checkpoint", checkpoint),
    )
    launch(case, str(tmp_path), ranks=4)
    resumed = outcome(case, str(tmp_path))
    # The log history continues the checkpoint's (steps 1-3, as saved) with steps 4-6.
    assert list(resumed["losses"]) == list(uninterrupted["losses"])
    later = [str(step) for step in range(SAVE_STEPS + 1, 7)]
    assert {k: resumed["losses"][k] for k in later} == pytest.approx(
        {k: uninterrupted["losses"][k] for k in later}, rel=1e-5
    )
    flat = [v for row in probe_logits(os.path.join(str(tmp_path), "model")) for v in row]
    assert flat == pytest.approx([v for row in uninterrupted["logits"] for v in row], abs=1e-4)
