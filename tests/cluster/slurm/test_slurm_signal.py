"""Slurm's ``--signal`` is a preemption notice, on the real Slurm test cluster.

Before a job's time limit Slurm signals every process of every step (``--signal=USR2@120``);
a job can be signalled so at any time with ``scancel --signal=USR2 JOB``, which is what this
test does: the salloc shell that runs zlaunch is not signalled, every process on the nodes is,
the agents and the ranks alike. With ``--preemption-signal USR2`` the ranks start with it
ignored, and each node's agent takes it as its host's preemption notice: every rank saves at
its next step boundary, and with no host left the job ends (exit 1) saying where it saved and
that the same command with --resume continues; the steps run are exactly 1..the saved step.
(``--signal=TERM`` cannot work so: SIGTERM is how the agent stops its ranks, so they cannot
ignore it, and Slurm's ends them before they save; docs/fleet-changes.md says so.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.slurm.cluster import unavailable_reason

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or ""),
]

REPO = Path(__file__).resolve().parents[3]
WORKER = str(REPO / "tests" / "cluster" / "faults" / "elastic_worker.py")


def _config(tmp: Path) -> str:
    path = tmp / "config.json"
    path.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": 2,
                "steps_per_print": 1,
                "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
                "zero_optimization": {"stage": 2},
            }
        )
    )
    return str(path)


def _steps(out: Path) -> list[int]:
    path = out / "losses-0.jsonl"
    if not path.exists():
        return []
    return sorted({json.loads(line)["step"] for line in path.read_text().splitlines() if line})


def _wait(predicate, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("mode", ["step-per-node", "one-step"])
def test_slurm_signal_to_the_job_saves_at_the_next_step(idle_slurm, tmp_path, mode):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    argv = [
        "salloc", "-N3", "--ntasks-per-node=1", "--chdir", str(REPO),
        sys.executable, "-m", "zlaunch", "--no-color", "--slurm-mode", mode,
        "--preemption-signal", "USR2",
        "--log-dir", str(tmp_path / "runs"), "--checkpoint-dir", str(ckpt),
        "--config", _config(tmp_path),
        WORKER, "--steps", "500", "--step-sleep", "0.3", "--save-interval", "0", "--out", str(out),
    ]  # fmt: skip
    env = {**idle_slurm.env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        assert _wait(lambda: len(_steps(out)) >= 4, 180), "the job never reached step 4"
        (job,) = idle_slurm.jobs()
        signalled = idle_slurm.run(["scancel", "--signal=USR2", job])
        assert signalled.returncode == 0, signalled.stderr
        text, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, text[-4000:]
    for node in ("node1", "node2", "node3"):
        assert f"{node}: preemption notice (the agent received SIGUSR2)" in text, text[-4000:]
    assert "failed rank" not in text and "killed by" not in text  # not a crash
    assert (ckpt / "latest").exists(), text[-4000:]
    latest = (ckpt / "latest").read_text().strip()
    saved = int(latest.removeprefix("global_step"))
    assert f"preempted: saved at step {saved}" in text, text[-4000:]
    assert "--resume" in text
    assert _steps(out) == list(range(1, saved + 1))  # saved at the step it stopped at
