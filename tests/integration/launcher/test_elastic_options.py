"""The arithmetic of a restart on fewer hosts: which hosts, which batch."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "args, message",
    [
        (["--min-nodes", "1"], "--min-nodes only matters when the job restarts"),
        (["--min-nodes", "3", "--max-restarts", "1"], "--min-nodes must be between 1 and the 1"),
    ],
)
def test_min_nodes_checked_before_launch(tmp_path, args, message):
    import subprocess
    import sys

    from tests.cluster.faults.common import REPO, WORKER

    proc = subprocess.run(
        [sys.executable, "-m", "zlaunch", "--log-dir", str(tmp_path), *args, WORKER],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
