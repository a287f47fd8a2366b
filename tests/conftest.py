"""Fixtures shared by the whole test suite."""

from __future__ import annotations

import os

import pytest

from tests.cluster import Cluster, unavailable_reason


@pytest.fixture(scope="session", autouse=True)
def runs_in_a_temporary_directory(tmp_path_factory):
    """Runs the tests start (without --log-dir) and the per-user index of runs go to a
    temporary directory, not the user's ./zlaunch_runs and ~/.local/state."""
    root = tmp_path_factory.mktemp("zlaunch-state")
    saved = {name: os.environ.get(name) for name in ("ZLAUNCH_LOG_DIR", "XDG_STATE_HOME")}
    os.environ["ZLAUNCH_LOG_DIR"] = str(root / "zlaunch_runs")
    os.environ["XDG_STATE_HOME"] = str(root / "state")
    yield root
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def cluster():
    """A 3-host cluster (node1..node3), one per test session; see ``tests/cluster``.

    Skips where the machine cannot host it (not root, no sshd/ip/unshare); any other bring-up
    failure is an error, not a skip, so CI (root) always runs cluster tests.
    """
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    c = Cluster.start(n=3)
    try:
        yield c
    finally:
        c.close()
