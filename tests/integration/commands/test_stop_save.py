"""Stopping keeps work, through the real `zlaunch` command.

`zlaunch stop --save` and a first Ctrl-C (SIGINT to zlaunch: the ranks run in sessions of
their own, so a terminal's Ctrl-C reaches zlaunch alone) save a checkpoint at the next step and
say where it is; a run without --checkpoint-dir is refused with the way to stop it;
`--resume` with nothing to resume exits 2, `--resume-if-present` starts fresh.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.commands.helpers import ranks_state, wait_for

TRAIN = str(Path(__file__).parents[1] / "observe" / "train_tiny.py")
pytestmark = pytest.mark.multirank


def cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "ZLAUNCH_LIVE": "0"}
    return subprocess.run(
        [sys.executable, "-m", "zlaunch", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def start(tmp: Path, *options: str) -> subprocess.Popen:
    (tmp / "out").mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "zlaunch", "--num-gpus", "2", "--log-dir", str(tmp / "runs"),
         *options, TRAIN, str(tmp / "out"), "--steps", "100000", "--sleep", "0.05"],
        cwd=tmp, env={**os.environ, "ZLAUNCH_LIVE": "0"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def running(tmp: Path, job: subprocess.Popen) -> None:
    def ended() -> bool:
        if job.poll() is None:
            return False
        raise AssertionError(f"the job ended early ({job.returncode}): {job.stderr.read()}")

    wait_for(
        lambda: (
            ended()
            or ((r := ranks_state(tmp / "runs")) and all(x["state"] == "running" for x in r))
        ),
        120,
        "both ranks running",
    )
    # and past runtime.initialize (its save handler installed): the first step's metrics
    metrics = tmp / "runs" / "latest" / "metrics.jsonl"
    wait_for(
        lambda: ended() or (metrics.exists() and metrics.stat().st_size > 0),
        120,
        "the first step",
    )


def test_stop_save_writes_a_checkpoint_and_says_where(tmp_path):
    ckpt = tmp_path / "ckpt"
    job = start(tmp_path, "--checkpoint-dir", str(ckpt))
    try:
        running(tmp_path, job)
        stop = cli("stop", "--save", "--log-dir", str(tmp_path / "runs"), cwd=tmp_path)
        assert stop.returncode == 0, stop.stderr
        assert job.wait(timeout=60) == 0
        tag = (ckpt / "latest").read_text().strip()
        assert f"saved checkpoint {ckpt / tag}; continue with the same command plus --resume" in (
            stop.stdout
        ), stop.stdout
        assert "sent SIGUSR1 to the controller" in stop.stdout
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_first_ctrl_c_saves_then_stops(tmp_path):
    ckpt = tmp_path / "ckpt"
    job = start(tmp_path, "--checkpoint-dir", str(ckpt))
    try:
        running(tmp_path, job)
        job.send_signal(signal.SIGINT)
        assert job.wait(timeout=60) == 0
        err = job.stderr.read()
        assert "Ctrl-C: every rank saves a checkpoint at its next step" in err, err
        tag = (ckpt / "latest").read_text().strip()
        assert f"saved checkpoint {ckpt / tag}" in err, err
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_without_checkpoint_dir_stop_save_is_refused_and_ctrl_c_says_nothing_saved(tmp_path):
    job = start(tmp_path)
    try:
        running(tmp_path, job)
        refused = cli("stop", "--save", "--log-dir", str(tmp_path / "runs"), cwd=tmp_path)
        assert refused.returncode == 2, refused
        assert "was started without --checkpoint-dir: there is nowhere to save" in refused.stderr
        assert "stops it without saving" in refused.stderr and "Traceback" not in refused.stderr
        assert job.poll() is None
        job.send_signal(signal.SIGINT)
        assert job.wait(timeout=60) == 130
        err = job.stderr.read()
        assert "no checkpoint is written (--checkpoint-dir makes Ctrl-C save first)" in err, err
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_resume_with_nothing_to_resume_is_an_error_unless_if_present(tmp_path):
    (tmp_path / "t.py").write_text("print('started')\n")
    (tmp_path / "ckpt").mkdir()
    strict = cli("--checkpoint-dir", "ckpt", "--resume", "t.py", cwd=tmp_path)
    assert strict.returncode == 2, strict
    assert "--resume: no checkpoint to resume from in" in strict.stderr
    assert "--resume-if-present" in strict.stderr and "started" not in strict.stdout
    fresh = cli(
        "--log-dir", "runs", "--checkpoint-dir", "ckpt", "--resume-if-present", "t.py",
        cwd=tmp_path,
    )  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr
    assert "started" in fresh.stdout
