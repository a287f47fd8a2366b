"""Fixtures shared by the whole test suite."""

from __future__ import annotations

import pytest

from tests.cluster import Cluster, unavailable_reason


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
