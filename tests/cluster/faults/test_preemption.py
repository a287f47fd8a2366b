"""Preemption notices on the real SSH test cluster, one job that checks both kinds.

A job on node1..node3 (one rank each, train batch 6) that never saves on its own
(``--save-interval 0``): any resume it makes is from a save a notice asked for. With
``--max-restarts 1 --min-nodes 1``:

1. SIGTERM to node2's agent (what a spot instance's shutdown or Slurm's --signal sends): every
   rank saves at its next step, the job goes on on node1 and node3 (world 2, batch 6,1,3) from
   that step, spending no restart;
2. node3's ``--preemption-check`` (a script that exits 0 once a file appears) turns to exit 0:
   the same, on node1 alone (world 1, batch 6,1,6).

No step is lost or repeated: each attempt starts at the step after the one the previous
attempt saved at, and every step 1..STEPS runs. The losses of the world-2 attempt equal those
of an uninterrupted 2-rank run from the same checkpoint (1e-6 relative: the same data in the
same order; a wrong batch, step or optimizer state moves them by 1e-3 or more).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from tests.cluster.faults.common import (
    REPO,
    WORKER,
    attempts,
    config,
    elastic_job,
    losses,
    step_means,
)
from tests.integration.launcher.helpers import idle_cluster, seconds_until  # noqa: F401 - autouse fixture

pytestmark = [pytest.mark.cluster, pytest.mark.faults]

STEPS = 16


def _steps_of(rows: list[dict], attempt: int) -> list[int]:
    return sorted({r["step"] for r in rows if r["attempt"] == attempt})


def test_a_sigterm_and_a_preemption_check_each_save_at_the_next_step_and_lose_none(
    cluster, tmp_path
):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    check = f"test -e {tmp_path}/going-$(hostname)"
    cmd = elastic_job(
        cluster, tmp_path, "--max-restarts", "1", "--min-nodes", "1",
        "--preemption-check", check, "--preemption-check-interval", "0.5", steps=STEPS,
    )  # fmt: skip
    cmd += ["--save-interval", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert seconds_until(lambda: len(_steps_of(losses(out), 0)) >= 4, 120) is not None
        (agent,) = [pid for pid, line in cluster.pids("node2") if "zlaunch.agent" in line]
        os.kill(agent, signal.SIGTERM)
        assert seconds_until(lambda: len(_steps_of(losses(out), 1)) >= 3, 120) is not None
        (tmp_path / "going-node3").touch()
        text, _ = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, text[-4000:]
    assert "node2: preemption notice (the agent received SIGTERM); it goes in 30 s" in text
    assert f"node3: preemption notice (--preemption-check {check!r} exited 0)" in text
    assert "failed rank" not in text  # neither is a crash
    assert "going on on node1, node3 without it (world 2, global batch kept)" in text
    assert "going on on node1 without it (world 1, global batch kept)" in text
    assert "no restart spent" in text

    runs = attempts(tmp_path)
    assert [(a["hosts"], a["world_size"], a["batch"]) for a in runs] == [
        (["node1", "node2", "node3"], 3, None),
        (["node1", "node3"], 2, "6,1,3"),
        (["node1"], 1, "6,1,6"),
    ]
    assert "node2 preempted: saved at step" in runs[1]["reason"]
    assert "node3 preempted: saved at step" in runs[2]["reason"]
    assert [a["change"]["steps_lost"] for a in runs[1:]] == [0, 0]
    status = subprocess.run(
        [sys.executable, "-m", "zlaunch", "status", "--log-dir", str(tmp_path / "runs"),
         "--no-color"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert "preempted node2; saved at step" in status.stdout
    assert "0 step(s) lost" in status.stdout

    rows = losses(out)
    by_attempt = [_steps_of(rows, a) for a in range(3)]
    assert by_attempt[0][0] == 1 and by_attempt[-1][-1] == STEPS
    for before, after in zip(by_attempt, by_attempt[1:], strict=False):
        # The notice's save is at the step the attempt stopped in: the next starts after it.
        assert after[0] == before[-1] + 1, by_attempt
        assert before == list(range(before[0], before[-1] + 1))
    saved_at = by_attempt[0][-1]
    assert (ckpt / f"global_step{saved_at}").is_dir()

    # The world-2 attempt against an uninterrupted 2-rank run from the same checkpoint.
    ref_ckpt = tmp_path / "ref-ckpt"
    shutil.copytree(ckpt / f"global_step{saved_at}", ref_ckpt / f"global_step{saved_at}")
    (ref_ckpt / "latest").write_text(f"global_step{saved_at}")
    ref_out = tmp_path / "ref-out"
    until = by_attempt[1][-1]
    ref = subprocess.run(
        [sys.executable, "-m", "zlaunch", "--no-color", "--num-gpus", "2",
         "--log-dir", str(tmp_path / "runs-ref"), "--checkpoint-dir", str(ref_ckpt), "--resume",
         "--config", config(tmp_path, 3),
         WORKER, "--steps", str(until), "--save-interval", "0", "--out", str(ref_out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert ref.returncode == 0, ref.stderr[-3000:]
    resumed, uninterrupted = step_means(rows, 1), step_means(losses(ref_out), 0)
    assert sorted(resumed) == sorted(uninterrupted) == list(range(saved_at + 1, until + 1))
    for step in range(saved_at + 1, until):  # the last step's final micro-step is the save's
        assert abs(resumed[step] - uninterrupted[step]) <= 1e-6 * abs(uninterrupted[step]), step
