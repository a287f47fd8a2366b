"""Ctrl-C with --checkpoint-dir on scripts that do and do not answer the save request."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.clients.launch import HERE, clean_env

pytestmark = pytest.mark.multirank  # several torch.distributed processes

NOBODY = "no rank answered the save request in 5 s: this script does not handle SIGUSR1"


class Running:
    """zlaunch running save_loop.py on 2 ranks; its stderr gathered as it comes."""

    def __init__(
        self,
        tmp_path: Path,
        *script_args: str,
        script: Path = HERE / "save_loop.py",
        **env_extra: str,
    ):
        argv = [
            sys.executable, "-m", "zlaunch", "--log-dir", str(tmp_path / "runs"),
            "--nproc_per_node", "2", "--checkpoint-dir", str(tmp_path / "ckpt"),
            str(script), *script_args,
        ]  # fmt: skip
        env = clean_env(ZLAUNCH_LIVE="0", **env_extra)
        self.proc = subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.err: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.started = tmp_path / "started"

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.err.append(line.rstrip("\n"))

    def wait_for(self, test, timeout: float) -> float:
        start = time.monotonic()
        while not test():
            assert self.proc.poll() is None or test(), f"ended early: {self.err}"
            assert time.monotonic() - start < timeout, f"not within {timeout} s: {self.err}"
            time.sleep(0.05)
        return time.monotonic() - start

    def said(self, text: str) -> bool:
        return any(text in line for line in self.err)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_a_script_that_ignores_the_save_request_is_named_and_the_second_ctrl_c_stops(tmp_path):
    job = Running(tmp_path)
    try:
        job.wait_for(job.started.exists, 60)
        job.proc.send_signal(signal.SIGINT)
        took = job.wait_for(lambda: job.said(NOBODY), 15)
        assert 4.5 < took < 10
        assert job.proc.poll() is None  # training goes on
        [note] = [line for line in job.err if NOBODY in line]
        assert note.endswith(
            "Ctrl-C again stops every rank without a checkpoint (TERM, then KILL after 5 s)"
        )
        job.proc.send_signal(signal.SIGINT)
        assert job.proc.wait(timeout=30) == 130
    finally:
        job.kill()


def test_a_script_that_answers_saves_and_nothing_is_said(tmp_path):
    job = Running(tmp_path, "--handle")
    try:
        job.wait_for(job.started.exists, 60)
        job.proc.send_signal(signal.SIGINT)
        assert job.proc.wait(timeout=60) == 0, job.err
        job._reader.join(5)
        assert sorted(os.listdir(tmp_path / "ckpt")) == ["rank-0.saved", "rank-1.saved"]
        steps = {(tmp_path / "ckpt" / f).read_text() for f in os.listdir(tmp_path / "ckpt")}
        assert len(steps) == 1  # both ranks saved at the step they agreed on
        assert not job.said("no rank answered")
    finally:
        job.kill()


def test_runtime_ranks_answer_so_a_slow_save_is_not_reported_as_unanswered(tmp_path):
    # The save takes 7 s, beyond the 5 s zlaunch waits for an answer: only the runtime's
    # acknowledgement keeps the note away.
    train = HERE.parent / "observe" / "train_tiny.py"
    out = tmp_path / "out"
    out.mkdir()
    job = Running(
        tmp_path, str(out), "--steps", "100000", "--sleep", "0.05", script=train,
        ZLAUNCH_TEST_SLOW_SAVE="7",
    )  # fmt: skip
    try:
        metrics = tmp_path / "runs" / "latest" / "metrics.jsonl"
        job.wait_for(lambda: metrics.exists() and metrics.stat().st_size > 0, 120)
        job.proc.send_signal(signal.SIGINT)
        assert job.proc.wait(timeout=90) == 0, job.err
        job._reader.join(5)
        assert job.said("saved checkpoint"), job.err
        assert not job.said("no rank answered"), job.err
    finally:
        job.kill()
