"""The Slurm test cluster cleans up after itself: daemons, namespaces, files, escaped tasks."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from tests.cluster import netns
from tests.cluster.slurm.cluster import SlurmCluster, reap_stale, unavailable_reason

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or ""),
]


def _pids_with(marker: str) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and marker in netns.cmdline(int(p))]


def test_close_removes_daemons_namespaces_files_and_escaped_tasks():
    marker = f"zl-escaped-{uuid.uuid4().hex[:8]}"
    c = SlurmCluster.start(n=2)
    try:
        daemons = [p.pid for p in c._daemons.values()]
        # A double-forked task leaves Slurm's tracking (no cgroups): scancel would miss it.
        escape = f"setsid sh -c 'sleep 300; echo {marker}' </dev/null >/dev/null 2>&1 &"
        out = c.run(["srun", "-N2", "sh", "-c", escape])
        assert out.returncode == 0, out.stderr
        assert len(_pids_with(f"echo {marker}")) == 2  # one per node, outliving the step
    finally:
        c.close()
    assert not [pid for pid in daemons if os.path.exists(f"/proc/{pid}")]
    assert not any(name.startswith(c.net.prefix) for name in netns.list_netns())
    assert not os.path.exists(c.dir)
    assert not _pids_with(c.net.state_dir)
    assert not _pids_with(f"echo {marker}")


def test_reap_stale_finds_nothing_of_live_owners(slurm):
    assert reap_stale() == []
    out = subprocess.run(["ps", "-eo", "cmd"], capture_output=True, text=True)
    assert slurm.dir in out.stdout  # its daemons are still running
