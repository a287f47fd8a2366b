"""A slow rank named end to end: a 2-rank runtime job under zlaunch on localhost in which rank 1
sleeps 30 ms more per step, and as long again as its step took (so it stays 2x slow however
loaded the machine is). The controller scores every rank's own step time (each rank's
step_busy events, zlaunch/launcher/stragglers.py): the console says it once, after the sustained
window (3 windows of 10 steps) and at the end; metrics.jsonl rows and `zlaunch status` carry it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multirank

TRAIN = str(Path(__file__).parent / "train_tiny.py")
STEPS = 50


def zlaunch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ZLAUNCH_EVENTS_FD"}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "zlaunch", *args], capture_output=True, cwd=cwd, env=env,
        timeout=180, text=True,
    )  # fmt: skip


def test_a_slow_rank_is_said_once_and_shown_in_metrics_and_status(tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    out.mkdir()
    result = zlaunch(
        "--num-gpus", "2", "--log-dir", str(runs), TRAIN, str(out), "--steps", str(STEPS),
        "--print-every", "100", "--slow-rank", "1", "--slow-sleep", "0.03", "--slow-factor", "1",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("zlaunch: slow: ")]
    assert len(said) == 1, result.stderr
    assert said[0].startswith("zlaunch: slow: rank 1 on localhost at "), said
    assert "x the median step" in said[0]
    assert "zlaunch: at the end, slow: rank 1 on localhost at " in result.stderr
    assert "rank 0 " not in " ".join(said)

    run_dir = runs / os.readlink(runs / "latest")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    engine = [r for r in rows if r.get("source", "engine") == "engine"]
    named = [r["step"] for r in engine if r.get("slow")]
    # window 20-29 closes once both ranks sent step 30 (in their batch of steps 21-30): named
    # from then on, every step
    assert named and named[0] <= 42 and named == list(range(named[0], STEPS + 1)), named
    assert all(r["slow"].startswith("slow: rank 1 on localhost") for r in engine if r.get("slow"))
    assert all("slow" not in r for r in engine if r["step"] < named[0])

    status = zlaunch("status", "--log-dir", str(runs), cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert "slow: rank 1 on localhost at " in status.stdout
