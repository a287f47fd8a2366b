"""OMP_NUM_THREADS as the ranks really get it from a local launch (fake workers record their env).

The default is this machine's usable cores divided by the ranks; the user's value, from the
controller's environment, --env or an env file in the job's directory, reaches them unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.launcher import fake_worker

CPUS = len(os.sched_getaffinity(0))


def _launch(tmp_path: Path, ranks: int, *options: str, omp: str | None = None):
    records, runs = tmp_path / "records", tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["HOME"] = str(tmp_path)  # no env file of the person running the tests
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    argv = [
        sys.executable, "-m", "zlaunch", "--log-dir", str(runs), "--num-gpus", str(ranks),
        *options, fake_worker.__file__, "--record-dir", str(records),
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    values = [
        json.loads((records / f"rank-{r}.json").read_text())["env"].get("OMP_NUM_THREADS")
        for r in range(ranks)
    ]
    return values, done.stderr


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_unset_means_the_cores_divided_by_the_ranks_and_the_start_line_says_so(tmp_path, ranks):
    values, err = _launch(tmp_path, ranks)
    expected = str(max(1, CPUS // ranks))
    assert values == [expected] * ranks
    start = [line for line in err.splitlines() if line.startswith("zlaunch: run ")]
    assert len(start) == 1
    assert f"threads OMP_NUM_THREADS={expected} ({CPUS} cores / {ranks} rank" in start[0]
    assert err.count("OMP_NUM_THREADS") == 1


def test_the_controller_s_value_wins(tmp_path):
    values, err = _launch(tmp_path, 2, omp="5")
    assert values == ["5", "5"]
    assert "OMP_NUM_THREADS" not in err


def test_an_env_option_wins(tmp_path):
    values, err = _launch(tmp_path, 2, "--env", "OMP_NUM_THREADS=7")
    assert values == ["7", "7"]
    assert "OMP_NUM_THREADS" not in err


def test_a_deepspeed_env_file_wins(tmp_path):
    (tmp_path / ".deepspeed_env").write_text("OMP_NUM_THREADS=6\n")
    values, err = _launch(tmp_path, 2)
    assert values == ["6", "6"]
    assert "OMP_NUM_THREADS" not in err
