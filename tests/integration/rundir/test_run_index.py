"""Runs are found from any directory, through the real `zlaunch` command.

Two jobs started in two project directories (each with its default ./zlaunch_runs) announce
their id and log directory at once, piped; from a third directory `zlaunch ls` lists both, a
bare `zlaunch stop` refuses to guess (exit 2, naming both and how to choose), and the run named
is the one stopped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.commands.helpers import wait_for

TICKER = str(Path(__file__).parents[1] / "commands" / "ticker.py")


def cli(cwd: Path, env: dict, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zlaunch", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.multirank
def test_two_jobs_found_from_another_directory_and_stop_refuses_to_guess(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ZLAUNCH_LOG_DIR"}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env["ZLAUNCH_LIVE"] = "0"
    jobs, ids = [], []
    try:
        for name in ("a", "b"):
            project = tmp_path / name
            project.mkdir()
            err = open(project / "stderr.txt", "wb")
            jobs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "zlaunch",
                        "--grace-period",
                        "1",
                        TICKER,
                        "--count",
                        "1",
                        "--hang",
                    ],
                    cwd=project,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )  # fmt: skip
            )
            err.close()
            line = wait_for(
                lambda p=project: re.search(
                    r"^zlaunch: run (\S+)  logs (\S+)(?:  threads .*)?$",
                    (p / "stderr.txt").read_text(),
                    re.M,
                ),
                60,
                f"job {name} to announce its run",
            )
            assert line.group(2) == str(project / "zlaunch_runs" / line.group(1))
            ids.append(line.group(1))
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        wait_for(
            lambda: cli(elsewhere, env, "ls", "--no-color").stdout.count("running") == 2,
            60,
            "both runs listed as running",
        )
        listing = cli(elsewhere, env, "ls", "--no-color").stdout
        assert all(run_id in listing for run_id in ids), listing
        assert str(tmp_path / "a" / "zlaunch_runs") in listing

        bare = cli(elsewhere, env, "stop")
        assert bare.returncode == 2, bare
        assert "2 runs are running; zlaunch stop will not guess which" in bare.stderr
        assert all(run_id in bare.stderr for run_id in ids) and "Traceback" not in bare.stderr
        assert f"hint: name one: zlaunch stop {ids[1]}" in bare.stderr
        assert all(job.poll() is None for job in jobs)
        assert cli(elsewhere, env, "status", ids[0]).returncode == 0

        first = cli(elsewhere, env, "stop", ids[0][:-2])  # a unique prefix names it
        assert first.returncode == 0, first.stderr
        assert jobs[0].wait(timeout=30) == 143 and jobs[1].poll() is None
        # Now one is running: a bare stop is no guess.
        second = cli(elsewhere, env, "stop")
        assert second.returncode == 0, second.stderr
        assert f"run {ids[1]} interrupted" in second.stdout
        assert jobs[1].wait(timeout=30) == 143
        # The index lives in the state directory, one link per run.
        links = sorted(os.listdir(tmp_path / "state" / "zlaunch" / "runs"))
        assert links == sorted(ids)
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.wait()
