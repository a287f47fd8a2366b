"""Growing back on the real SSH test cluster: a host lost and back joins at a step boundary.

A job on node1..node3 (one rank each, train batch 6) with ``--nnodes 2:3 --max-restarts 1``
saves every 2 steps. Mid-run node2's link goes down: the controller takes node2 as lost and
the job restarts on node1 and node3 (world 2, batch 6,1,3) from the latest checkpoint. The
link comes back; the prober's SSH login to node2 answers, and once ``--grow-interval`` has
passed every rank saves at its next step and the job restarts on all three (world 3, the
config's batch again) from that checkpoint, spending no restart.

Every step 1..STEPS runs; the grow loses none and repeats none (the world-3 attempt starts at
the step after the one the grow saved at). The losses of each attempt equal, micro-step by
micro-step on every rank, those of an uninterrupted run at its world size from the checkpoint
it started from (1e-6 relative: the same rows in the same order; a wrong batch, step or
optimizer state moves them by 1e-3 or more).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.faults.common import REPO, WORKER, attempts, config, elastic_job, losses
from tests.integration.launcher.helpers import idle_cluster, seconds_until  # noqa: F401 - autouse fixture

pytestmark = [pytest.mark.cluster, pytest.mark.faults]

STEPS = 60
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _ns(cluster, host: str, *cmd: str) -> None:
    subprocess.run(["ip", "netns", "exec", cluster.namespace(host), *cmd], check=True)


def _by_rank(out: Path, attempt: int) -> dict[int, list[dict]]:
    """Each rank's rows of ``attempt``, in the order it wrote them (micro-step by micro-step)."""
    ranks = {}
    for path in sorted(out.glob("losses-*.jsonl")):
        rank = int(path.stem.split("-")[1])
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if mine := [r for r in rows if r["attempt"] == attempt]:
            ranks[rank] = mine
    return ranks


def _steps(out: Path, attempt: int) -> list[int]:
    return sorted({r["step"] for r in losses(out) if r["attempt"] == attempt})


def _uninterrupted(tmp: Path, name: str, world: int, start: int, until: int) -> Path:
    """An uninterrupted ``world``-rank local run from a copy of global_step``start`` (0: from
    scratch) to step ``until``; its output folder."""
    ckpt = tmp / f"{name}-ckpt"
    flags = []
    if start:
        shutil.copytree(tmp / "ckpt" / f"global_step{start}", ckpt / f"global_step{start}")
        (ckpt / "latest").write_text(f"global_step{start}")
        flags = ["--resume"]
    out = tmp / name
    ref = subprocess.run(
        [sys.executable, "-m", "zlaunch", "--no-color", "--num-gpus", str(world),
         "--log-dir", str(tmp / f"runs-{name}"), "--checkpoint-dir", str(ckpt), *flags,
         "--config", config(tmp, 6 // world),
         WORKER, "--steps", str(until), "--save-interval", "0", "--out", str(out)],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ref.returncode == 0, ref.stderr[-3000:]
    return out


def _same_losses(got: dict[int, list[dict]], want: dict[int, list[dict]], world: int) -> None:
    """Rank by rank, micro-step by micro-step; a rank may lack the last micro-steps of the
    attempt's last step (it exited inside that step's save, or was cut off in it)."""
    assert sorted(got) == sorted(want) == list(range(world)), (sorted(got), sorted(want))
    per_step = 6 // world
    for rank, rows in got.items():
        assert 0 <= len(want[rank]) - len(rows) <= per_step, (rank, len(rows), len(want[rank]))
        for mine, theirs in zip(rows, want[rank], strict=False):
            assert mine["step"] == theirs["step"] and mine["world"] == world
            assert abs(mine["loss"] - theirs["loss"]) <= 1e-6 * abs(theirs["loss"]), (
                rank,
                mine,
                theirs,
            )


def test_a_host_whose_link_comes_back_rejoins_at_a_checkpoint_boundary(cluster, tmp_path):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    cmd = elastic_job(
        cluster, tmp_path, "--nnodes", "2:3", "--max-restarts", "1", "--grow-interval", "3",
        steps=STEPS,
    )  # fmt: skip
    job = subprocess.Popen(
        cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    down = False
    try:
        reached = seconds_until(
            lambda: (ckpt / "latest").exists() and len(_steps(out, 0)) >= 5, 120
        )
        assert reached is not None, "the job never reached step 5"
        _ns(cluster, "node2", "ip", "link", "set", "eth0", "down")
        down = True
        assert seconds_until(lambda: len(_steps(out, 1)) >= 2, 180) is not None, "no world 2"
        _ns(cluster, "node2", "ip", "link", "set", "eth0", "up")
        down = False
        text, _ = job.communicate(timeout=400)
    finally:
        if down:
            _ns(cluster, "node2", "ip", "link", "set", "eth0", "up")
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, text[-4000:]
    assert "node2 can join: every rank saves at its next step, then the job grows" in text
    assert (
        "node2 joined: saved at step" in text
        and "growing onto node1, node2, node3 (world 3, global batch kept)" in text
    ), text[-4000:]

    runs = attempts(tmp_path)
    assert [(a["hosts"], a["world_size"], a["batch"]) for a in runs] == [
        (["node1", "node2", "node3"], 3, None),
        (["node1", "node3"], 2, "6,1,3"),
        (["node1", "node2", "node3"], 3, None),
    ], runs
    change = runs[2]["change"]
    assert change["kind"] == "joined" and change["hosts"] == ["node2"]
    assert change["steps_lost"] == 0 and 0 < change["save_to_restart_s"] < 120
    status = subprocess.run(
        [sys.executable, "-m", "zlaunch", "status", "--log-dir", str(tmp_path / "runs"),
         "--no-color"],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert f"node2 joined; saved at step {change['saved_step']}; 0 step(s) lost" in status.stdout

    by_attempt = [_steps(out, a) for a in range(3)]
    for steps in by_attempt:
        assert steps == list(range(steps[0], steps[-1] + 1)), by_attempt
    assert by_attempt[0][0] == 1 and by_attempt[2][-1] == STEPS
    resumed = by_attempt[1][0] - 1  # the job's own checkpoint the world-2 attempt loaded
    assert resumed % 2 == 0 and resumed <= by_attempt[0][-1]
    grown = change["saved_step"]
    assert by_attempt[1][-1] == grown and by_attempt[2][0] == grown + 1  # none lost or repeated
    assert (ckpt / f"global_step{grown}").is_dir()

    # Each attempt against an uninterrupted run at its world size from where it started.
    ref0 = _uninterrupted(tmp_path, "ref0", 3, 0, by_attempt[0][-1])
    _same_losses(_by_rank(out, 0), _by_rank(ref0, 0), 3)
    ref1 = _uninterrupted(tmp_path, "ref1", 2, resumed, grown)
    _same_losses(_by_rank(out, 1), _by_rank(ref1, 0), 2)
    ref2 = _uninterrupted(tmp_path, "ref2", 3, grown, STEPS)
    _same_losses(_by_rank(out, 2), _by_rank(ref2, 0), 3)
