"""`zlaunch check --perf` with its real probe on this machine: every figure measured, the
checkpoint directory left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_the_probe_measures_compute_and_the_checkpoint_dir_and_leaves_nothing(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    hostfile = tmp_path / "healthy"
    result = subprocess.run(
        [sys.executable, "-m", "zlaunch", "check", "--num-gpus", "2", "--perf", "--json",
         "--checkpoint-dir", str(ckpt), "--write-hostfile", str(hostfile)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (host,) = json.loads(result.stdout)["hosts"]
    perf = host["facts"]["perf"]
    assert perf["device"] == "cpu"
    assert all(perf[k] > 0 for k in ("gflops", "write_mbs", "read_mbs")), perf
    assert list(ckpt.iterdir()) == []  # its test file removed
    assert hostfile.read_text() == "localhost slots=2\n"
