"""``--launcher k8s``: the scheduler that places the dial-in agents as pods of an Indexed Job,
through the official ``kubernetes`` client (``pip install 'zlaunch[k8s]'``; imported only here).

It creates the job's objects (transport/k8s_manifest.py: Secret, headless Service, Job), then
points the Secret and the Service at the created Job (owner references), so that deleting the
Job with propagation removes every pod, the Secret and the Service; it removes them all itself
as well (explicitly, so a cluster whose garbage collector is slow leaves nothing either). A
thread watches the job's pods: a pod that fails, is evicted or deleted (its node lost) cuts
its agent's link, which the controller takes as that node lost at once; a pod that fails before
its agent dialed in ends the wait with the pod's reason.
"""

from __future__ import annotations

import secrets
import threading

from zlaunch.errors import LaunchError, UsageError
from zlaunch.job import K8sOptions
from zlaunch.transport.k8s_manifest import (
    JOB_LABEL,
    K8sJob,
    PodResources,
    job_objects,
    owned_by,
)

__all__ = ["K8sPlacement", "K8sScheduler"]

API_SECONDS = 15
"""Seconds one create or delete may take (an API server that does not answer must not hold
the controller's start or its ending)."""
WATCH_SECONDS = 30
"""Seconds one watch request lasts before the thread asks again (and sees a stop)."""
END_WAIT = 2.0
"""Seconds a lost agent's failure record waits for the watch to say how its pod ended (the
connection of a killed pod's agent may end before the API server's event arrives)."""


def _client(context: str | None):
    try:
        import kubernetes
    except ImportError:
        raise UsageError(
            "--launcher k8s needs the kubernetes client, which is not installed",
            hint="pip install 'zlaunch[k8s]'",
        ) from None
    try:
        kubernetes.config.load_kube_config(context=context)
    except Exception as err:  # noqa: BLE001 - the client's own: no kubeconfig, no such context
        try:
            if context is not None:
                raise
            kubernetes.config.load_incluster_config()
        except Exception:  # noqa: BLE001
            raise UsageError(
                f"--launcher k8s: cannot load the Kubernetes configuration: {err}",
                hint="set KUBECONFIG (or ~/.kube/config), or pass --k8s-context NAME",
            ) from None
    return kubernetes


class K8sScheduler:
    """Places one agent per node as the pods of an Indexed Job (``options``: where and as
    what)."""

    def __init__(self, options: K8sOptions):
        self.options = options
        self.name = f"zlaunch-{secrets.token_hex(4)}"

    def place(self, rendezvous) -> K8sPlacement:
        o = self.options
        job = K8sJob(
            name=self.name,
            namespace=o.namespace,
            image=o.image,
            nodes=rendezvous.nodes,
            address=rendezvous.address,
            resources=PodResources(o.cpu, o.memory, o.gpus),
            python=o.python,
        )
        objects = job_objects(job, rendezvous.token)
        kubernetes = _client(o.context)
        placement = K8sPlacement(kubernetes, job)
        placement.create(objects)
        return placement


class K8sPlacement:
    """The job's objects once created; the controller's links to its pods' agents."""

    def __init__(self, kubernetes, job: K8sJob):
        self.k = kubernetes
        self.job = job
        self.core = kubernetes.client.CoreV1Api()
        self.batch = kubernetes.client.BatchV1Api()
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)  # notified when a pod's end is known
        self._links: dict[str, object] = {}  # pod host name -> its agent's link
        self._released: set[int] = set()
        self._ends: dict[str, str] = {}  # pod host name -> why it ended
        self._failed: str | None = None
        self._removed = False
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # -- creating and removing ---------------------------------------------------------------

    def create(self, objects: list[dict]) -> None:
        secret, service, job = objects
        ns = self.job.namespace
        try:
            created = self.batch.create_namespaced_job(ns, job, _request_timeout=API_SECONDS)
            owner = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": created.metadata.name, "uid": created.metadata.uid},
            }
            self.core.create_namespaced_secret(
                ns, owned_by(secret, owner), _request_timeout=API_SECONDS
            )
            self.core.create_namespaced_service(
                ns, owned_by(service, owner), _request_timeout=API_SECONDS
            )
        except self.k.client.exceptions.ApiException as err:
            self.remove()
            raise LaunchError(
                f"--launcher k8s: the API server refused the job's objects in namespace {ns}: "
                f"{err.status} {err.reason}: {_message(err)}",
                hint="check the namespace exists and that your context may create Jobs, "
                "Secrets and Services there",
            ) from None
        except ValueError as err:  # an API server that gave the Job no uid
            self.remove()
            raise LaunchError(f"--launcher k8s: {err}") from None
        except Exception as err:  # noqa: BLE001 - the client's own: the server unreachable
            self.remove()
            raise LaunchError(
                f"--launcher k8s: cannot reach the API server: {err}",
                hint="check the kubeconfig's server (kubectl cluster-info) or --k8s-context",
            ) from None
        self._watcher = threading.Thread(target=self._watch, name="k8s-pods", daemon=True)
        self._watcher.start()

    def remove(self) -> None:
        """Delete the Job (its pods with it: Foreground propagation), the Secret and the
        Service; a 404 is something already gone."""
        with self._lock:
            if self._removed:
                return
            self._removed = True
            self._ended.notify_all()
        self._stop.set()
        ns, name = self.job.namespace, self.job.name
        body = self.k.client.V1DeleteOptions(propagation_policy="Foreground")
        for delete in (
            lambda: self.batch.delete_namespaced_job(
                name, ns, body=body, _request_timeout=API_SECONDS
            ),
            lambda: self.core.delete_collection_namespaced_pod(
                ns, label_selector=f"{JOB_LABEL}={name}", _request_timeout=API_SECONDS
            ),
            lambda: self.core.delete_namespaced_secret(name, ns, _request_timeout=API_SECONDS),
            lambda: self.core.delete_namespaced_service(name, ns, _request_timeout=API_SECONDS),
        ):
            try:
                delete()
            except self.k.client.exceptions.ApiException as err:
                if err.status != 404:
                    self._ends.setdefault("", f"cleanup: {err.status} {err.reason}")
            except Exception as err:  # noqa: BLE001 - unreachable: the others are still tried
                self._ends.setdefault("", f"cleanup: {err}")

    # -- the Starter and Placement of transport/dialin.py ------------------------------------

    def joined(self, link, answer, peer: str) -> None:
        with self._lock:
            self._links[answer.node] = link
            why = self._ends.get(answer.node)
        if why is not None:
            link.cut()

    def failed(self) -> str | None:
        return self._failed

    def stderr_tail(self, task: int | None, link=None) -> list[str]:
        """How ``link``'s pod ended, as the watch saw it (a line naming the pod): a lost
        agent's failure record says why its pod went, and only its own. Its agent's
        connection may end before the watch hears of the pod: the watch is given a moment
        (END_WAIT seconds). ``link`` None, or one no pod dialed in on: every pod that ended."""
        with self._ended:
            pod = next((host for host, mine in self._links.items() if mine is link), None)
            if pod is None:
                return [why for host, why in self._ends.items() if host]
            self._ended.wait_for(lambda: pod in self._ends or self._removed, END_WAIT)
            return [self._ends[pod]] if pod in self._ends else []

    def wait(self, timeout: float | None = None) -> int | None:
        return None

    def end_reason(self, wait: float = 2.0) -> str | None:
        """None: a pod failed, evicted or deleted is its agent lost, a failure as over SSH
        (recorded in failure.json, restarted under --max-restarts), not a job the scheduler
        ended on purpose as Slurm's scancel or time limit is."""
        return None

    def release(self, link) -> None:
        with self._lock:
            self._released.add(id(link))
            every = len(self._released) >= self.job.nodes
        if every:
            self.remove()

    # -- the pods' fates ---------------------------------------------------------------------

    def _watch(self) -> None:
        selector = f"{JOB_LABEL}={self.job.name}"
        while not self._stop.is_set():
            watch = self.k.watch.Watch()
            try:
                for event in watch.stream(
                    self.core.list_namespaced_pod,
                    self.job.namespace,
                    label_selector=selector,
                    timeout_seconds=WATCH_SECONDS,
                ):
                    if self._stop.is_set():
                        watch.stop()
                        break
                    self._seen(event["type"], event["object"])
            except Exception:  # noqa: BLE001 - a dropped watch is asked again
                if self._stop.wait(1.0):
                    return

    def _seen(self, kind: str, pod) -> None:
        host = pod.spec.hostname or pod.metadata.name
        status = pod.status
        why = None
        if kind == "DELETED":
            why = f"pod {pod.metadata.name} deleted (its node lost, or removed by someone)"
        elif status is not None and status.phase == "Failed":
            why = f"pod {pod.metadata.name} failed" + (
                f": {status.reason}" if status.reason else ""
            )
            if status.message:
                why += f" ({status.message})"
        if why is None:
            return
        with self._lock:
            self._ends.setdefault(host, why)
            self._ended.notify_all()
            link = self._links.get(host)
            if link is None and self._failed is None and not self._removed:
                self._failed = why  # it never dialed in: no more agents will come
        if link is not None:
            link.cut()


def _message(err) -> str:
    import json

    try:
        return json.loads(err.body).get("message") or ""
    except (TypeError, ValueError):
        return str(err.body or "")[:200]
