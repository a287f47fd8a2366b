"""--launcher k8s's view of its pods (transport/k8s.py), from made-up watch events: which pod a
lost agent's failure record names, and why a pod that ended is said to have ended. Nothing here
talks to an API server (the cluster tier does: tests/cluster/k8s)."""

from __future__ import annotations

import threading

import pytest

kubernetes = pytest.importorskip("kubernetes", reason="the Kubernetes client (in the test extra)")

from kubernetes.client import (  # noqa: E402
    V1ObjectMeta,
    V1Pod,
    V1PodSpec,
    V1PodStatus,
)

from zlaunch.transport import k8s  # noqa: E402
from zlaunch.transport.k8s_manifest import K8sJob  # noqa: E402
from zlaunch.wire import Answer  # noqa: E402


class _Link:
    def __init__(self):
        self.cuts = 0

    def cut(self):
        self.cuts += 1


def _placement() -> k8s.K8sPlacement:
    job = K8sJob(
        name="zlaunch-0a1b2c3d", namespace="ml", image="img:1", nodes=2,
        address="10.0.0.5:29400", python="python",
    )  # fmt: skip
    return k8s.K8sPlacement(kubernetes, job)


def _pod(index: int, phase: str = "Running", reason=None, message=None, container=None) -> V1Pod:
    name = f"zlaunch-0a1b2c3d-{index}"
    return V1Pod(
        metadata=V1ObjectMeta(name=f"{name}-x{index}y", namespace="ml"),
        spec=V1PodSpec(hostname=name, containers=[]),
        status=V1PodStatus(
            phase=phase, reason=reason, message=message,
            container_statuses=[container] if container else None,
        ),
    )  # fmt: skip


def _joined(placement, index: int) -> _Link:
    link = _Link()
    placement.joined(link, Answer(f"zlaunch-0a1b2c3d-{index}", None, "n"), "10.0.0.9")
    return link


def test_a_lost_agent_is_told_of_its_own_pod_only():
    placement = _placement()
    first, second = _joined(placement, 0), _joined(placement, 1)
    placement._seen("MODIFIED", _pod(1, "Failed", "Evicted", "low on memory"))
    placement._seen("DELETED", _pod(0))
    assert (first.cuts, second.cuts) == (1, 1)
    assert placement.stderr_tail(None, link=second) == [
        "pod zlaunch-0a1b2c3d-1-x1y failed: Evicted (low on memory)"
    ]
    assert placement.stderr_tail(None, link=first) == [
        "pod zlaunch-0a1b2c3d-0-x0y deleted (its node lost, or removed by someone)"
    ]
    assert len(placement.stderr_tail(None)) == 2  # no link: every pod that ended


def test_a_lost_agent_waits_a_moment_for_the_watch_to_say_how_its_pod_ended(monkeypatch):
    monkeypatch.setattr(k8s, "END_WAIT", 10.0)
    placement = _placement()
    link = _joined(placement, 1)
    later = threading.Timer(0.2, placement._seen, ("DELETED", _pod(1)))
    later.start()
    try:
        assert placement.stderr_tail(None, link=link) == [
            "pod zlaunch-0a1b2c3d-1-x1y deleted (its node lost, or removed by someone)"
        ]
    finally:
        later.join()
    monkeypatch.setattr(k8s, "END_WAIT", 0.05)
    still_running = _joined(placement, 0)  # its pod never ends: nothing to say of it
    assert placement.stderr_tail(None, link=still_running) == []
