"""A checkpoint directory that fills up during a save, through the real ``zlaunch``: the job
stops with an error that says so, ``latest`` still names the last complete checkpoint, no
partial folder is left and no process either."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cluster.faults.common import REPO, WORKER, config
from tests.integration.launcher.helpers import alive, seconds_until

FAKE_WORKER = str(REPO / "tests" / "integration" / "launcher" / "fake_worker.py")

pytestmark = pytest.mark.faults


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    # mode 0700: a log root must be the user's alone (zlaunch/rundir/root.py); tmpfs is 1777
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=400k,mode=0700", "tmpfs", str(mount)], check=True
    )
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_save_on_a_full_disk_keeps_latest(small_disk, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "zlaunch", "--no-color", "--num-gpus", "2",
         "--log-dir", str(tmp_path / "runs"), "--checkpoint-dir", str(small_disk),
         "--config", config(tmp_path, 3),
         WORKER, "--steps", "40", "--save-interval", "1", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    # the failing save is named on the console (root cause) and in the rank logs
    assert "CheckpointError" in proc.stderr
    logs = "".join(p.read_text() for p in (tmp_path / "runs").rglob("rank-*.log"))
    assert "No space left on device" in logs
    latest = (small_disk / "latest").read_text().strip()
    tags = sorted(p.name for p in small_disk.iterdir() if p.name.startswith("global_step"))
    assert latest in tags and (small_disk / latest / "manifest.json").exists()
    assert not [p for p in small_disk.iterdir() if "partial" in p.name]
    assert seconds_until(lambda: not _job_processes(out), 5.0) is not None


def _job_processes(out) -> list[int]:
    mine = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if str(out).encode() in cmd and alive(int(entry)):
                mine.append(int(entry))
    return mine


def test_a_full_log_directory_never_stops_the_job(small_disk, tmp_path):
    """--log-dir on a 400 KiB file system and ranks that print 2 MiB: the rank logs fill it.
    The job still ends with the script's exit code, every rank ran to its end, and the console
    says once per file what could not be written."""
    record = tmp_path / "record"
    proc = subprocess.run(
        [sys.executable, "-m", "zlaunch", "--no-color", "--num-gpus", "2",
         "--log-dir", str(small_disk), FAKE_WORKER, "--record-dir", str(record),
         "--lines", "12000"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in record.glob("rank-*.json")) == ["rank-0.json", "rank-1.json"]
    full = [line for line in proc.stderr.splitlines() if "No space left on device" in line]
    assert full and all("the job goes on" in line for line in full), proc.stderr[-3000:]
    said = [line.split(" in ")[0] for line in full]
    assert len(said) == len(set(said)), "each file's failure is said once"
    # every line still reached the console
    assert proc.stdout.count("seq=") + proc.stderr.count("seq=") == 2 * 12000
