"""`zlaunch [OPTIONS] SCRIPT [ARGS]`: option parsing, checks before launch, --dry-run.

Everything here stops before any host is contacted: either at a usage/config error (exit 2)
or at the plan (--dry-run). The hand-off to the launcher is checked with a stand-in module
that records the options it receives.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.unit.commands.test_cli_run import job  # noqa: F401 - fixtures, shared with the unit half

# ---- --dry-run --------------------------------------------------------------------------------


# ---- --config ---------------------------------------------------------------------------------


# ---- usage errors: exit 2, clear message, nothing started ------------------------------------


# ---- hand-off to the launcher -----------------------------------------------------------------


def test_real_entry_point_dry_run_and_error(job):
    env = {**os.environ, "HOME": str(job.home)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "zlaunch",
            "--dry-run",
            "-H",
            "hosts",
            "train.py",
            "--config",
            "ds.json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    # 6 workers do not fit a 4-sample batch of micro 1 x accumulation 2: caught before launch.
    assert out.returncode == 2, out
    assert "world size 6" in out.stderr
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "zlaunch",
            "--dry-run",
            "-H",
            "hosts",
            "-i",
            "node2",
            "train.py",
            "--config",
            "ds.json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "node 0: node2  ranks 0-1  slots 0,1" in out.stdout
