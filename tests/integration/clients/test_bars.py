"""A bar that a log line interrupts, through the real `zlaunch` and `zlaunch logs --follow`:
the bar ends at its final state on its own line and the log line follows on its own."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from tests.integration.clients.launch import HERE, clean_env

BAR_END = "[localhost:0] train: 100%|##########| 10/10"
LOGGED = "[localhost:0] saving checkpoint"


def test_console_and_follow_show_the_bar_and_the_line_apart(tmp_path):
    runs = tmp_path / "runs"
    env = clean_env(ZLAUNCH_LIVE="0")
    job = subprocess.Popen(
        [sys.executable, "-m", "zlaunch", "--log-dir", str(runs), "--nproc_per_node", "1",
         str(HERE / "bar_then_log.py")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (runs / "latest").exists():
            assert time.monotonic() < deadline and job.poll() is None, job.communicate()
            time.sleep(0.05)
        follow = subprocess.Popen(
            [sys.executable, "-m", "zlaunch", "logs", "--follow", "--log-dir", str(runs)],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        followed: list[str] = []
        reader = threading.Thread(
            target=lambda: followed.extend(line.rstrip("\n") for line in follow.stdout)
        )
        reader.start()
        # The log line comes once the follower has seen the bar at its end: the reads then
        # tell where the bar stopped, whatever the machine's load.
        while not any("10/10" in line for line in followed):
            assert time.monotonic() < deadline + 60 and follow.poll() is None, followed
            time.sleep(0.05)
        (tmp_path / "go").touch()
        follow.wait(timeout=60)
        reader.join(10)
        out, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0 and follow.returncode == 0, (err, follow.stderr.read())
    for shown in (
        followed,
        [line.replace("]! ", "] ") for line in out.splitlines()],
    ):
        assert LOGGED in shown, shown
        at = shown.index(LOGGED)
        assert shown[at - 1] == BAR_END, shown  # the bar's last state, on its own line
        assert not any("10/10saving" in line for line in shown)
