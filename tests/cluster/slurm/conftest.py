"""The session's Slurm test cluster (see tests/cluster/slurm/cluster.py)."""

from __future__ import annotations

import pytest

from tests.cluster.slurm.cluster import SlurmCluster, unavailable_reason


@pytest.fixture(scope="session")
def slurm():
    """slurmctld + slurmd on node1..node3 (with sshd), one per test session.

    Skips where the machine cannot host it (not root, Slurm or munge not installed); any other
    bring-up failure is an error, so CI (root, packages from .ci/run) always runs these tests.
    """
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    c = SlurmCluster.start(n=3)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def idle_slurm(slurm):
    """The cluster with no job and no task left by the previous test (killed if there are)."""
    yield slurm
    left = slurm.wait_no_jobs(timeout=20)
    if left:
        slurm.run(["scancel", *left])
    if slurm.wait_no_tasks(timeout=10):
        slurm.kill_tasks()
