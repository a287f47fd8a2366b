"""What the end-to-end launcher tests share: a `zlaunch` job started in the background whose
ranks are the fake worker, process liveness read from /proc, and the idle-cluster check.

Whether a process is gone is read from /proc (or the cluster's process listing), never taken
from zlaunch's word.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

__all__ = ["Job", "alive", "idle_cluster", "jobs", "seconds_until"]


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def seconds_until(done: Callable[[], bool], timeout: float) -> float | None:
    """Seconds until ``done()`` holds (polled every 20 ms), None after ``timeout``."""
    start = time.monotonic()
    while not done():
        if time.monotonic() - start > timeout:
            return None
        time.sleep(0.02)
    return time.monotonic() - start


class Job:
    """A running ``zlaunch`` command; each rank writes ``records/rank-N.json`` when it starts."""

    def __init__(
        self,
        argv: list[str],
        cwd: Path,
        *,
        records: Path,
        runs: Path,
        ranks: int,
        timeout: float,
        ready_timeout: float,
    ):
        self.records = records
        self.runs = runs
        self.ranks = ranks
        self.timeout = timeout
        self.ready_timeout = ready_timeout
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd)

    def communicate(self, timeout: float | None = None) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=self.timeout if timeout is None else timeout)
        return self.proc.returncode, out.decode("utf-8", "replace"), err.decode()

    def records_ready(self, n: int | None = None, timeout: float | None = None) -> list[dict]:
        """The records of ranks 0..n-1 (all ranks by default) once every one has written it."""
        n = self.ranks if n is None else n
        paths = [self.records / f"rank-{r}.json" for r in range(n)]
        deadline = time.monotonic() + (self.ready_timeout if timeout is None else timeout)
        while not all(p.exists() for p in paths):
            assert time.monotonic() < deadline, "not every rank started"
            if self.proc.poll() is not None:
                raise AssertionError(f"zlaunch ended early: {self.communicate()}")
            time.sleep(0.02)
        return [json.loads(p.read_text()) for p in paths]

    def run_dir(self) -> Path:
        return self.runs / os.readlink(self.runs / "latest")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def jobs():
    """The jobs a test started (append to it); any still running at the end are killed."""
    started: list[Job] = []
    yield started
    for job in started:
        job.kill()


@pytest.fixture(autouse=True)
def idle_cluster(cluster):
    """Each test starts and ends with no process on any host; leftovers fail the test."""
    cluster.kill_all()
    yield cluster
    left = cluster.wait_idle(timeout=10.0)
    cluster.kill_all()
    assert not left, f"processes left on the cluster: {left}"
