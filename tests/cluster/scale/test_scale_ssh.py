"""64 ranks over real SSH from one controller: 4 loopback hosts x 16 slots, one sshd of the
test's own (tests/cluster/scale/farm.py), workers that import no torch
(tests/cluster/scale/worker.py). The small version of benchmarks/scale_ssh.py, kept as tests:

- every line of every rank arrives: each rank log is byte for byte what its worker printed;
- one failing rank stops all 64: zlaunch exits with its code, names it as the root cause
  (console and failure.json), and no process of the job is left (listed in /proc).

Skipped, with the reason, where the farm cannot run (not root, no sshd).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.scale import farm as farm_mod
from tests.cluster.scale import worker as worker_mod

pytestmark = pytest.mark.cluster

HOSTS = 4
SLOTS = 16
WORLD = HOSTS * SLOTS
LINES = 200
LINE_BYTES = 120


@pytest.fixture(scope="module")
def farm():
    reason = farm_mod.unavailable_reason()
    if reason:
        pytest.skip(reason)
    with farm_mod.LoopbackFarm.start(HOSTS) as started:
        yield started


@pytest.fixture(autouse=True)
def nothing_left(farm):
    yield
    left = farm.processes()
    farm.kill_sessions()
    assert left == [], f"processes of the job left after the test: {left}"


def _zlaunch(farm, tmp_path: Path, *worker_args: str) -> subprocess.Popen:
    argv = [
        sys.executable, "-m", "zlaunch", "--hostfile", farm.hostfile(SLOTS), "--ssh-config",
        farm.ssh_config, "--log-dir", str(tmp_path / "runs"), "--grace-period", "3",
        worker_mod.__file__, "--records", str(tmp_path), "--lines", str(LINES),
        "--line-bytes", str(LINE_BYTES), *worker_args,
    ]  # fmt: skip
    return subprocess.Popen(
        argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _run_dir(tmp_path: Path) -> Path:
    runs = (tmp_path / "runs").iterdir()
    (run,) = [p for p in runs if not p.is_symlink() and (p / "run.json").exists()]
    return run


def _wait_gone(farm, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = farm.processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = farm.processes()
    return left


def test_every_line_of_64_ranks_arrives_byte_exact(farm, tmp_path):
    job = _zlaunch(farm, tmp_path)
    _, err = job.communicate(timeout=600)
    assert job.returncode == 0, err[-3000:]
    logs = {int(p.stem.split("-")[1]): p for p in _run_dir(tmp_path).glob("attempt-0/*/rank-*.log")}
    assert sorted(logs) == list(range(WORLD))
    wrong = [
        rank
        for rank, path in logs.items()
        if path.read_bytes() != worker_mod.expected_log(rank, LINES, LINE_BYTES)
    ]
    assert wrong == []
    assert "no heartbeat" not in err and "no word from the agent" not in err
    assert _wait_gone(farm, 30) == []


def test_one_failing_rank_stops_all_64_and_is_named(farm, tmp_path):
    fail_rank = 2 * SLOTS + 5  # third host, mid-host: not the host's first rank
    job = _zlaunch(farm, tmp_path, "--hold", "--fail-rank", str(fail_rank))
    try:
        deadline = time.monotonic() + 300
        while len(list(tmp_path.glob("ready-*"))) < WORLD:
            assert job.poll() is None, job.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "not every rank got ready"
            time.sleep(0.2)
        (tmp_path / "go").touch()
        _, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == worker_mod.FAIL_CODE, err[-3000:]
    assert f"rank {fail_rank} on {farm.hosts[2]} exited with code 3" in err
    failure = json.loads((_run_dir(tmp_path) / "failure.json").read_text())
    assert failure["root_cause"]["rank"] == fail_rank
    assert len(failure["failures"]) == 1  # the others were stopped, not failed
    assert failure["stopped_ranks"] == [r for r in range(WORLD) if r != fail_rank]
    assert _wait_gone(farm, 30) == []
