"""--launcher k8s's view of its pods (transport/k8s.py), from made-up watch events: which pod a
lost agent's failure record names, and why a pod that ended is said to have ended. Nothing here
talks to an API server (the cluster tier does: tests/cluster/k8s)."""

from __future__ import annotations

import threading

import pytest

kubernetes = pytest.importorskip("kubernetes", reason="the Kubernetes client (in the test extra)")

from kubernetes.client import (  # noqa: E402
    V1ContainerState,
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1ContainerStatus,
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


def _container(waiting=None, terminated=None) -> V1ContainerStatus:
    state = V1ContainerState(waiting=waiting, terminated=terminated)
    return V1ContainerStatus(
        name="agent", image="img:1", image_id="", ready=False, restart_count=0, state=state
    )


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (_pod(0), None),
        (_pod(0, "Pending"), None),
        (_pod(0, "Succeeded"), None),
        (  # the kubelet's first failed pull: it retries at once
            _pod(0, "Pending", container=_container(waiting=V1ContainerStateWaiting(
                reason="ErrImagePull", message="not found"))),
            None,
        ),
        (
            _pod(0, "Pending", container=_container(waiting=V1ContainerStateWaiting(
                reason="ImagePullBackOff", message='Back-off pulling image "img:1"'))),
            "pod zlaunch-0a1b2c3d-0-x0y cannot start container agent: ImagePullBackOff "
            '(Back-off pulling image "img:1")',
        ),
        (
            _pod(0, "Pending", container=_container(waiting=V1ContainerStateWaiting(
                reason="CreateContainerConfigError"))),
            "pod zlaunch-0a1b2c3d-0-x0y cannot start container agent: CreateContainerConfigError",
        ),
        (
            _pod(0, "Failed", container=_container(terminated=V1ContainerStateTerminated(
                exit_code=128, reason="StartError", message='exec: "py": not found'))),
            "pod zlaunch-0a1b2c3d-0-x0y failed: container agent StartError, exit code 128 "
            '(exec: "py": not found)',
        ),
        (
            _pod(0, "Failed", container=_container(terminated=V1ContainerStateTerminated(
                exit_code=1, reason="Error"))),
            "pod zlaunch-0a1b2c3d-0-x0y failed: container agent Error, exit code 1",
        ),
        (_pod(0, "Failed"), "pod zlaunch-0a1b2c3d-0-x0y failed"),
    ],
)  # fmt: skip
def test_why_a_pod_ended_or_will_never_start(pod, why):
    assert k8s.pod_end("MODIFIED", pod) == why


def test_a_pod_that_cannot_start_before_its_agent_dialed_in_ends_the_wait():
    placement = _placement()
    _joined(placement, 0)
    assert placement.failed() is None
    placement._seen("MODIFIED", _pod(1, "Pending", container=_container(
        waiting=V1ContainerStateWaiting(reason="InvalidImageName"))))  # fmt: skip
    assert placement.failed() == (
        "pod zlaunch-0a1b2c3d-1-x1y cannot start container agent: InvalidImageName"
    )


class _Unreachable:
    class api_client:  # noqa: N801 - shaped as the client's
        class configuration:  # noqa: N801
            host = "https://10.0.0.1:6443"

    def __getattr__(self, name):
        def call(*args, **kwargs):
            raise OSError("Read timed out. (read timeout=15)")

        return call


def test_an_api_server_that_does_not_answer_is_said_once_and_its_return_too():
    said = []
    placement = _placement()
    placement.warn = said.append
    real = placement.core
    placement.core = _Unreachable()
    placement._probe("zlaunch/job=zlaunch-0a1b2c3d")
    placement._probe("zlaunch/job=zlaunch-0a1b2c3d")
    assert said == [
        "--launcher k8s: the API server at https://10.0.0.1:6443 does not answer (Read timed "
        "out. (read timeout=15)); the job goes on, but a pod evicted or deleted meanwhile is "
        "seen only when its agent's connection ends"
    ]
    placement.core = real
    placement._answered()
    assert len(said) == 2 and said[1].startswith(
        f"--launcher k8s: the API server at {real.api_client.configuration.host} answers again"
    )


def test_what_the_cleanup_could_not_delete_is_named_with_the_command_that_does():
    said = []
    placement = _placement()
    placement.warn = said.append
    placement.core = placement.batch = _Unreachable()
    placement.remove()
    (line,) = said
    assert line == (
        "--launcher k8s: could not delete job.batch/zlaunch-0a1b2c3d, pods -l "
        "zlaunch/job=zlaunch-0a1b2c3d, secret/zlaunch-0a1b2c3d, service/zlaunch-0a1b2c3d in "
        "namespace ml: the API server at https://10.0.0.1:6443 did not answer (Read timed out. "
        "(read timeout=15)). Delete them with:\n  kubectl delete "
        "job,pod,secret,service -n ml -l zlaunch/job=zlaunch-0a1b2c3d"
    )
    placement.remove()  # once only
    assert len(said) == 1


def test_the_clients_errors_are_said_in_their_own_words():
    import urllib3

    try:
        urllib3.PoolManager(retries=0).request("GET", "http://127.0.0.1:1/")
    except urllib3.exceptions.HTTPError as err:
        refused = err
    assert k8s._short(refused).startswith("Failed to establish a new connection: ")
    pool = urllib3.HTTPConnectionPool("10.0.0.1", 6443)
    timed_out = urllib3.exceptions.MaxRetryError(
        pool, "/api", urllib3.exceptions.ReadTimeoutError(pool, "/api", "Read timed out.")
    )
    assert k8s._short(timed_out) == "Read timed out."
