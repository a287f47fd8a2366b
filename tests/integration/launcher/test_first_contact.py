"""First contact on localhost, with an interpreter wrapper (--python) that holds up the
agent's start on purpose: an agent slower than a small job's 15 s hello deadline that still
runs is named as slow and waited for, and the job runs with every rank's lines; an agent whose
process ended without a hello (while something it left holds its output open, so no EOF says
so) is named within its deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = "import os; print('line from rank', os.environ['RANK'], flush=True)\n"
SLOW_START = 17.0
"""Beyond a small job's deadline (max(--ssh-timeout, 10) + 5 = 15 s), within its bound."""


def _wrapper(tmp_path: Path, before_agent: str) -> Path:
    """An interpreter that runs ``before_agent`` (shell) before it starts the agent; the
    workers it starts at once."""
    path = tmp_path / "python-wrapper"
    path.write_text(
        "#!/bin/sh\n"
        'case "$*" in *zlaunch.agent*)\n'
        f"{before_agent}\n"
        ";; esac\n"
        f'exec {sys.executable} "$@"\n'
    )
    path.chmod(0o755)
    return path


def _zlaunch(tmp_path: Path, wrapper: Path, timeout: float) -> tuple[int, str, str, float]:
    (tmp_path / "rank.py").write_text(SCRIPT)
    argv = [
        sys.executable, "-m", "zlaunch", "--log-dir", str(tmp_path / "runs"), "--num-gpus", "2",
        "--python", str(wrapper), str(tmp_path / "rank.py"),
    ]  # fmt: skip
    env = {**os.environ, "ZLAUNCH_LIVE": "0"}
    started = time.monotonic()
    done = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
    )
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def test_an_agent_slower_than_the_small_job_deadline_still_starts(tmp_path):
    wrapper = _wrapper(tmp_path, f"sleep {SLOW_START}")
    code, out, err, took = _zlaunch(tmp_path, wrapper, timeout=90)
    assert code == 0, err
    assert took >= SLOW_START
    assert "agent slow to start on localhost: still running, no hello 15s after" in err
    assert "waiting up to 60s" in err
    # progress instead of silence while it starts (every 5 s on a plain console)
    assert "zlaunch: agents: 0/1 answered; starting: localhost" in err
    assert "no answer" not in err
    for rank in (0, 1):
        assert f"line from rank {rank}" in out


def test_an_agent_that_ended_without_a_hello_is_named_within_its_deadline(tmp_path):
    pid_file = tmp_path / "holder.pid"
    # The agent's process ends (exit 3) while a child it left keeps its stdout open: no EOF
    # reaches the controller, only the probe at the deadline finds the process gone.
    wrapper = _wrapper(tmp_path, f"sleep 60 & echo $! > {pid_file}; exit 3")
    try:
        code, out, err, took = _zlaunch(tmp_path, wrapper, timeout=60)
    finally:
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert code != 0
    assert (
        "no answer from the agent on localhost: silent 15s after its connection opened, and "
        "its process is no longer running (exit status 3)"
    ) in err
    assert "Traceback" not in err
    assert 15.0 <= took < 30.0
