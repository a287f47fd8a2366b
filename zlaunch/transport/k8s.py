"""``--launcher k8s``: the scheduler that places the dial-in agents as pods of an Indexed Job,
through the official ``kubernetes`` client (``pip install 'zlaunch[k8s]'``; imported only here).

It creates the job's objects (transport/k8s_manifest.py: Secret, headless Service, Job), then
points the Secret and the Service at the created Job (owner references), so that deleting the
Job with propagation removes every pod, the Secret and the Service; it removes them all itself
as well (explicitly, so a cluster whose garbage collector is slow leaves nothing either). A
thread watches the job's pods: a pod that fails, is evicted or deleted (its node lost) cuts
its agent's link, which the controller takes as that node lost at once; a pod that fails before
its agent dialed in, or whose container cannot start (an image that cannot be pulled, a command
that does not exist), ends the wait with the pod's reason.

An API server that stops answering does not stop the job: its agents' connections are the
controller's own, and a node lost still ends its connection. The user is told (pods evicted
meanwhile are seen only as their agents' connections end), and told again when it answers. What
the cleanup could not delete is named, with the command that deletes it.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable

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
WATCH_SECONDS = 10
"""Seconds one watch request lasts (the API server ends it) before the thread asks again; a
watch silent for WATCH_SECONDS + API_SECONDS more is a server that may have stopped answering,
which a plain list then tells."""
PROBE_SECONDS = 5
"""Seconds the list that tells a silent API server from a quiet watch may take."""
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

    def __init__(self, options: K8sOptions, warn: Callable[[str], None] = lambda _what: None):
        self.options = options
        self.warn = warn
        """Tells the user what happened to the API server or the objects during the job."""
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
        placement = K8sPlacement(kubernetes, job, self.warn)
        placement.create(objects)
        return placement


class K8sPlacement:
    """The job's objects once created; the controller's links to its pods' agents."""

    def __init__(self, kubernetes, job: K8sJob, warn: Callable[[str], None] = lambda _w: None):
        import urllib3  # the kubernetes client's own HTTP library

        self.k = kubernetes
        self.job = job
        self.warn = warn
        config = kubernetes.client.Configuration.get_default_copy()
        # urllib3 retries a request whose answer timed out (three more times by default):
        # each of our calls is bounded by its own timeout, and a silent API server must cost
        # that once, not four times. A refused connection is still tried again.
        config.retries = urllib3.util.Retry(total=2, read=0, redirect=0)
        api = kubernetes.client.ApiClient(config)
        self.core = kubernetes.client.CoreV1Api(api)
        self.batch = kubernetes.client.BatchV1Api(api)
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)  # notified when a pod's end is known
        self._links: dict[str, object] = {}  # pod host name -> its agent's link
        self._released: set[int] = set()
        self._ends: dict[str, str] = {}  # pod host name -> why it ended
        self._failed: str | None = None
        self._removed = False
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._silent_since: float | None = None  # when the API server stopped answering
        self._cleanup: threading.Thread | None = None

    @property
    def server(self) -> str:
        """The API server, as the kubeconfig names it."""
        return self.core.api_client.configuration.host

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
        deletes = (
            (f"job.batch/{name}", lambda: self.batch.delete_namespaced_job(
                name, ns, body=body, _request_timeout=API_SECONDS)),
            (f"pods -l {JOB_LABEL}={name}", lambda: self.core.delete_collection_namespaced_pod(
                ns, label_selector=f"{JOB_LABEL}={name}", _request_timeout=API_SECONDS)),
            (f"secret/{name}", lambda: self.core.delete_namespaced_secret(
                name, ns, _request_timeout=API_SECONDS)),
            (f"service/{name}", lambda: self.core.delete_namespaced_service(
                name, ns, _request_timeout=API_SECONDS)),
        )  # fmt: skip
        left: list[str] = []
        why = ""
        silent = False
        for what, delete in deletes:
            if silent:  # one call that got no answer: the rest would wait as long, in vain
                left.append(what)
                continue
            try:
                delete()
            except self.k.client.exceptions.ApiException as err:
                if err.status != 404:  # 404: gone already
                    left.append(what)
                    why = why or (
                        f"the API server at {self.server} refused: {err.status} {err.reason}"
                        + (f": {_message(err)}" if _message(err) else "")
                    )
            except Exception as err:  # noqa: BLE001 - the client's own: unreachable, timed out
                left.append(what)
                silent = True
                why = f"the API server at {self.server} did not answer ({_short(err)})"
        if left:
            self.warn(
                f"--launcher k8s: could not delete {', '.join(left)} in namespace {ns}: {why}. "
                f"Delete them with:\n  kubectl delete job,pod,secret,service -n {ns} -l "
                f"{JOB_LABEL}={name}"
            )

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
            # Not in this thread: the controller ends its links from daemon threads it waits
            # for a few seconds only, and a process that exits mid-delete leaves objects
            # unnamed. A thread of its own is waited for at exit (its calls are bounded).
            cleanup = threading.Thread(target=self.remove, name="k8s-cleanup", daemon=False)
            with self._lock:
                self._cleanup = cleanup
            cleanup.start()

    def settle(self) -> None:
        """Wait for the deletes the last ``release`` started (each call bounded by
        API_SECONDS; after one that got no answer the rest are not tried)."""
        with self._lock:
            cleanup = self._cleanup
        if cleanup is not None:
            cleanup.join()

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
                    _request_timeout=(API_SECONDS, WATCH_SECONDS + API_SECONDS),
                ):
                    if self._stop.is_set():
                        watch.stop()
                        break
                    self._answered()
                    self._seen(event["type"], event["object"])
            except Exception:  # noqa: BLE001 - a dropped or silent watch: is the server there?
                self._probe(selector)
                if self._stop.wait(1.0):
                    return

    def _probe(self, selector: str) -> None:
        """A plain list of the job's pods: an answer is a server that is there (the watch was
        only quiet) and the pods' states the watch may have missed; none is said, once."""
        try:
            pods = self.core.list_namespaced_pod(
                self.job.namespace, label_selector=selector, _request_timeout=PROBE_SECONDS
            )
        except Exception as err:  # noqa: BLE001 - the client's own: unreachable, timed out
            if self._silent_since is None and not self._stop.is_set():
                self._silent_since = time.monotonic()
                self.warn(
                    f"--launcher k8s: the API server at {self.server} does not answer "
                    f"({_short(err)}); the job goes on, but a pod evicted or deleted meanwhile "
                    "is seen only when its agent's connection ends"
                )
            return
        self._answered()
        for pod in pods.items:
            self._seen("MODIFIED", pod)

    def _answered(self) -> None:
        if self._silent_since is not None:
            silent = time.monotonic() - self._silent_since
            self._silent_since = None
            self.warn(f"--launcher k8s: the API server at {self.server} answers again "
                      f"(after {silent:.0f} s)")  # fmt: skip

    def _seen(self, kind: str, pod) -> None:
        host = pod.spec.hostname or pod.metadata.name
        why = pod_end(kind, pod)
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


CANNOT_START = frozenset({
    "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
    "CreateContainerError", "RunContainerError",
})  # fmt: skip
"""A container's waiting reasons that mean its pod will not start without someone's change
(the kubelet keeps retrying, the pod stays Pending, and its agent would never dial in).
ErrImagePull is not one: the kubelet's first failed pull, retried at once (a registry's hiccup);
ImagePullBackOff is the kubelet giving up for a while after failing again."""


def pod_end(kind: str, pod) -> str | None:
    """Why ``pod`` (a watch event ``kind`` on it) ended, or will never start; None while it
    may still run. Each reason names the pod: it is deleted with the job, and this line is what
    the user has left of it."""
    name = pod.metadata.name
    if kind == "DELETED":
        return f"pod {name} deleted (its node lost, or removed by someone)"
    status = pod.status
    if status is None:
        return None
    containers = status.container_statuses or []
    if status.phase == "Failed":
        why = f"pod {name} failed"
        if status.reason:  # the pod's own: Evicted, DeadlineExceeded, NodeLost
            return why + f": {status.reason}" + (f" ({status.message})" if status.message else "")
        for container in containers:
            ended = container.state.terminated if container.state else None
            if ended is not None:
                why += f": container {container.name} {ended.reason or 'ended'}, exit code "
                why += f"{ended.exit_code}" + (f" ({ended.message})" if ended.message else "")
                break
        return why
    for container in containers:
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason in CANNOT_START:
            return f"pod {name} cannot start container {container.name}: {waiting.reason}" + (
                f" ({waiting.message})" if waiting.message else ""
            )
    return None


def _short(err: BaseException) -> str:
    """The client's error in one line: urllib3's MaxRetryError wraps the cause (a read that
    timed out, a connection refused) in the pool's long repr, which says nothing more."""
    cause = getattr(err, "reason", None)
    if isinstance(cause, BaseException):
        err = cause
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    pool, sep, rest = text.partition("): ")
    if sep and pool.startswith(("HTTPConnection", "HTTPSConnection")):
        text = rest
    if text.startswith("<") and ">: " in text:  # NewConnectionError('<urllib3... object>: why')
        text = text.partition(">: ")[2].rstrip("')")
    return text if len(text) <= 200 else text[:200] + "..."


def _message(err) -> str:
    import json

    try:
        return json.loads(err.body).get("message") or ""
    except (TypeError, ValueError):
        return str(err.body or "")[:200]
