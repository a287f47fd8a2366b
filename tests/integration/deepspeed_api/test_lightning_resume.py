"""Lightning's ``ModelCheckpoint`` and ``trainer.fit(ckpt_path=...)`` on the bundled runtime,
resuming at another world size: `lightning_resume.py` saves at 2 ranks (ZeRO stage 2, the end
of epoch 0, step 4) and resumes at 1 rank to step 8, from the same global batches.

The reference is real DeepSpeed 0.19.8's own resume of the same script
(lightning_resume_reference.json). With real DeepSpeed, too, a resumed Lightning run equals the
uninterrupted run only in its first step: from the second on, both runtimes give the same
losses, which are not the uninterrupted run's (docs/hugging-face.md, "Lightning"). So the test
holds the resumed run to DeepSpeed's resumed run, and to the uninterrupted run where
DeepSpeed's resume equals it (the restored weights' first loss).
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
SCRIPT = os.path.join(HERE, "lightning_resume.py")
with open(os.path.join(HERE, "lightning_resume_reference.json")) as _f:
    REFERENCE = json.load(_f)["stage_2"]

pytestmark = [
    pytest.mark.multirank,
    pytest.mark.skipif(
        importlib.util.find_spec("pytorch_lightning") is None,
        reason="pytorch-lightning is not installed (the test extra)",
    ),
]


def _launch(ranks: int, args: list[str], tmp_path) -> dict:
    out = tmp_path / f"losses-{ranks}.json"
    command = [
        sys.executable, "-m", "zlaunch", "--num-gpus", str(ranks), "--runtime", "bundled",
        "--no-color", "--log-dir", str(tmp_path / "runs"), SCRIPT, "2", str(out), *args,
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "DeepSpeed API: zlaunch's bundled runtime" in done.stderr
    return json.loads(out.read_text())


def test_lightning_checkpoint_at_2_ranks_resumes_at_1_rank_as_deepspeed_does(tmp_path):
    saves = tmp_path / "checkpoints"
    first = _launch(2, ["4", "--save", str(saves)], tmp_path)
    assert first["global_step"] == 4
    # The first four steps are the uninterrupted run's (same global batches, 2 ranks vs 1).
    assert first["losses"] == pytest.approx(REFERENCE["uninterrupted"]["losses"][:4], rel=1e-6)
    checkpoint = saves / "epoch=0-step=4.ckpt"
    assert (checkpoint / "latest").read_text().strip() == "checkpoint"
    assert (checkpoint / "checkpoint" / "manifest.json").is_file()

    resumed = _launch(1, ["8", "--resume", str(checkpoint)], tmp_path)
    assert resumed["global_step"] == REFERENCE["resumed"]["global_step"] == 8
    assert len(resumed["losses"]) == 4
    assert resumed["losses"] == pytest.approx(REFERENCE["resumed"]["losses"], rel=1e-6)
    # The restored weights: the resumed first loss is the uninterrupted run's fifth.
    assert resumed["losses"][0] == pytest.approx(REFERENCE["uninterrupted"]["losses"][4], rel=1e-6)


def test_lightning_resume_at_1_rank_continues_the_uninterrupted_run(tmp_path):
    """With one batch per epoch (the same global batch every step, so Lightning's replay of
    its epoch bookkeeping after a resume cannot change which data a step sees), the run saved
    at 2 ranks and resumed at 1 takes the uninterrupted 1-rank run's steps 5-8: weights,
    AdamW moments and step count all restored across the world-size change."""
    saves = tmp_path / "checkpoints"
    one_batch = ["--epoch-batches", "1"]
    first = _launch(2, ["4", "--save", str(saves), *one_batch], tmp_path)
    resumed = _launch(
        1, ["8", "--resume", str(saves / "epoch=3-step=4.ckpt"), *one_batch], tmp_path
    )
    uninterrupted = _launch(1, ["8", *one_batch], tmp_path)
    assert first["global_step"] == 4
    assert resumed["global_step"] == uninterrupted["global_step"] == 8
    assert first["losses"] == pytest.approx(uninterrupted["losses"][:4], rel=1e-6)
    assert len(resumed["losses"]) == 4
    assert resumed["losses"] == pytest.approx(uninterrupted["losses"][4:], rel=1e-6)
