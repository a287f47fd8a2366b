"""Run-directory commands on local jobs: stop from another process, follow a live job, and
the clear messages (missing matplotlib, no runs, bad --rank)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.commands.helpers import ranks_state, wait_for, zlaunch

TICKER = str(Path(__file__).with_name("ticker.py"))


@pytest.mark.multirank
def test_stop_signals_the_controller_and_every_rank_stops_as_on_ctrl_c(tmp_path):
    runs = tmp_path / "runs"
    job = subprocess.Popen(
        [sys.executable, "-m", "zlaunch", "--num-gpus", "2", "--log-dir", str(runs),
         "--grace-period", "2", TICKER, "--count", "2", "--interval", "0.05", "--hang"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        rows = wait_for(
            lambda: (r := ranks_state(runs)) and all(x["state"] == "running" for x in r) and r,
            60,
            "both ranks running",
        )
        pids = [row["pid"] for row in rows]
        # A follower started now must end by itself when the stop ends the run.
        follower = subprocess.Popen(
            [sys.executable, "-m", "zlaunch", "logs", "--log-dir", str(runs), "-f"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        stop = zlaunch("stop", "--log-dir", str(runs))
        assert stop.returncode == 0, stop.stderr
        run_id = os.readlink(runs / "latest")
        assert f"sent SIGTERM to the controller of run {run_id}" in stop.stdout
        assert f"run {run_id} interrupted (exit code 143)" in stop.stdout
        assert job.wait(timeout=30) == 128 + signal.SIGTERM
        err = job.stderr.read().decode()
        assert "SIGTERM: stopping all ranks" in err
        for pid in pids:
            assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)
        state = {r["rank"]: (r["state"], r["signal_name"]) for r in ranks_state(runs)}
        assert state == {0: ("exited", "SIGTERM"), 1: ("exited", "SIGTERM")}
        out, _ = follower.communicate(timeout=15)
        assert follower.returncode == 0
        assert sorted(out.splitlines()) == sorted(
            line for r in (0, 1) for line in _ticker_lines(runs, r)
        )
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def _ticker_lines(runs: Path, rank: int) -> list[str]:
    path = next((runs / "latest").glob(f"attempt-0/*/rank-{rank}.log"))
    return [f"[localhost:{rank}] {line}" for line in path.read_text().splitlines()]


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_plot_without_matplotlib_names_the_extra(tmp_path):
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from zlaunch.cli import main\n"
        f"main(['plot', '--log-dir', {str(tmp_path)!r}])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 2
    assert "zlaunch plot needs matplotlib" in result.stderr
    assert "pip install 'zlaunch[plot]'" in result.stderr


def test_commands_on_an_empty_log_dir_say_so(tmp_path):
    assert zlaunch("ls", "--log-dir", str(tmp_path)).stdout.strip() == f"no runs in {tmp_path}"
    for name in ("logs", "status", "stop"):
        result = zlaunch(name, "--log-dir", str(tmp_path))
        assert result.returncode == 2, (name, result.stderr)
        assert f"error: no runs in {tmp_path}" in result.stderr
        assert "hint: give the run id (see `zlaunch ls`)" in result.stderr
