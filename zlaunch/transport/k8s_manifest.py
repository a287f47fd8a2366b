"""The Kubernetes objects of a job whose agents dial in, pure (no client, no cluster):

- a **Secret** holding the job's token under the key ``token``;
- a headless **Service** (``clusterIP: None``) whose name is every pod's ``subdomain``, so pod
  ``NAME-I`` is reachable as ``NAME-I.NAME`` inside the namespace (the ranks' addresses by
  name, as Kubeflow's and JobSet's pods have them);
- an **Indexed Job**: one pod per node (``parallelism = completions = nodes``), each pod's only
  container running the agent, which dials the controller and proves the token it reads from
  the Secret mounted as a file. The token is never in the pod spec, its environment or argv.

The Job restarts nothing itself (``backoffLimit: 0``, ``restartPolicy: Never``): a pod that
ends is the controller's to judge (its restart policy, ``--min-nodes``), as a lost SSH agent is.
The Job is the owner: :func:`owned_by` points the Secret and the Service at it once the API
server has given it a uid, so deleting the Job with propagation removes every pod, the Secret
and the Service. ``zlaunch k8s manifest`` prints the objects without owner references (no uid
exists before ``kubectl apply``); every object carries the label ``zlaunch/job: NAME`` instead.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import yaml

from zlaunch.errors import UsageError
from zlaunch.worker import module_argv

__all__ = [
    "JOB_LABEL",
    "TOKEN_KEY",
    "TOKEN_MOUNT",
    "K8sJob",
    "PodResources",
    "agent_command",
    "job_objects",
    "owned_by",
    "to_yaml",
]

JOB_LABEL = "zlaunch/job"
"""The label on every object of one job (and its pods): ``-l zlaunch/job=NAME`` finds them all."""
TOKEN_KEY = "token"
TOKEN_MOUNT = "/var/run/zlaunch"
"""Where the Secret is mounted in each pod; the agent reads ``TOKEN_MOUNT/token``."""
GPU_RESOURCE = "nvidia.com/gpu"

# A DNS-1123 label: what a namespace, a Service and a pod's hostname must be.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_MAX = 63
# Kubernetes' resource quantity: a number, then a binary or decimal suffix or an exponent.
_QUANTITY = re.compile(r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[mkMGTPE]|[eE][-+]?[0-9]+)?$")
_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})$")


@dataclass(frozen=True)
class PodResources:
    """What each pod asks for (requests equal limits: the pod is Guaranteed where all three
    are given, so the node's kubelet never evicts it for another's sake first)."""

    cpu: str | None = None
    memory: str | None = None
    gpus: int = 0

    def check(self) -> None:
        for flag, value in (("--k8s-cpu", self.cpu), ("--k8s-memory", self.memory)):
            if value is not None and not _QUANTITY.match(value):
                raise UsageError(
                    f"{flag} {value!r} is not a Kubernetes quantity",
                    hint="write it as Kubernetes does, e.g. --k8s-cpu 8 or 500m, --k8s-memory 64Gi",
                )
        if self.gpus < 0:
            raise UsageError(f"--k8s-gpus {self.gpus}: expected 0 or more")

    def spec(self) -> dict:
        amounts: dict[str, str] = {}
        if self.cpu is not None:
            amounts["cpu"] = self.cpu
        if self.memory is not None:
            amounts["memory"] = self.memory
        if self.gpus:
            amounts[GPU_RESOURCE] = str(self.gpus)
        if not amounts:
            return {}
        return {"requests": dict(amounts), "limits": dict(amounts)}


@dataclass(frozen=True)
class K8sJob:
    """One job's objects, as the options name them (checked by :meth:`check`)."""

    name: str
    namespace: str
    image: str
    nodes: int
    address: str
    """HOST:PORT of the controller's dial-in listener, as the pods reach it."""
    resources: PodResources = field(default_factory=PodResources)
    python: str = "python"
    """The interpreter in the image that has zlaunch installed."""

    def check(self) -> None:
        """Everything the API server would refuse, refused here first with the option to fix."""
        if not _DNS_LABEL.match(self.namespace) or len(self.namespace) > _LABEL_MAX:
            raise UsageError(
                f"--namespace {self.namespace!r} is not a Kubernetes namespace name",
                hint="lower-case letters, digits and '-', at most 63, starting and ending "
                "with a letter or digit",
            )
        longest = f"{self.name}-{max(self.nodes - 1, 0)}"  # the last pod's hostname
        if not _DNS_LABEL.match(self.name) or len(longest) > _LABEL_MAX:
            raise UsageError(
                f"job name {self.name!r} cannot name the pods ({longest!r} must be a DNS "
                "label: lower-case letters, digits and '-', at most 63)",
                hint="pass a shorter --k8s-name of lower-case letters, digits and '-'",
            )
        if not self.image or any(c.isspace() for c in self.image):
            raise UsageError(
                f"--image {self.image!r}: expected an image reference with zlaunch installed",
                hint="e.g. --image registry.example.com/team/train:1.4",
            )
        if self.nodes < 1:
            raise UsageError(f"--nodes {self.nodes}: expected at least 1")
        match = _ADDRESS.match(self.address)
        if not match or not 0 < int(match.group(2)) < 65536:
            raise UsageError(
                f"--connect {self.address!r}: expected HOST:PORT of the controller",
                hint="the address and port the pods reach the controller's listener at",
            )
        if not self.python or any(c.isspace() for c in self.python):
            raise UsageError(f"--k8s-python {self.python!r}: expected the image's interpreter")
        self.resources.check()

    @property
    def labels(self) -> dict[str, str]:
        return {"app.kubernetes.io/managed-by": "zlaunch", JOB_LABEL: self.name}


def agent_command(python: str, address: str) -> list[str]:
    """The pod's command: the agent dialing ``address``, its token read from the mounted file."""
    return [
        *module_argv(python, "zlaunch.agent"),  # as transport/start.py's agent_argv
        "--connect",
        address,
        "--token-file",
        f"{TOKEN_MOUNT}/{TOKEN_KEY}",
    ]


def job_objects(job: K8sJob, token: str) -> list[dict]:
    """The Secret, the Service and the Job, in the order to create them."""
    job.check()
    if not token:
        raise UsageError("the job's token is empty", hint="a token file must hold the token")
    meta = {"name": job.name, "namespace": job.namespace, "labels": job.labels}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _copy(meta),
        "type": "Opaque",
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode("ascii")},
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _copy(meta),
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_LABEL: job.name},
            # the agents dial out; the names must resolve before a pod is Ready (ranks meet
            # while their pods start)
            "publishNotReadyAddresses": True,
        },
    }
    container = {
        "name": "agent",
        "image": job.image,
        "command": agent_command(job.python, job.address),
        "volumeMounts": [{"name": "zlaunch-token", "mountPath": TOKEN_MOUNT, "readOnly": True}],
    }
    resources = job.resources.spec()
    if resources:
        container["resources"] = resources
    pod = {
        "metadata": {"labels": job.labels},
        "spec": {
            "restartPolicy": "Never",
            "subdomain": job.name,
            # the agent needs no API access, and no variable per Service of the namespace
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "containers": [container],
            "volumes": [
                {
                    "name": "zlaunch-token",
                    "secret": {"secretName": job.name, "defaultMode": 0o400},
                }
            ],
        },
    }
    batch_job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _copy(meta),
        "spec": {
            "completionMode": "Indexed",
            "completions": job.nodes,
            "parallelism": job.nodes,
            "backoffLimit": 0,
            "template": pod,
        },
    }
    return [secret, service, batch_job]


def owned_by(obj: Mapping, owner: Mapping) -> dict:
    """``obj`` with ``owner`` (a created object, uid known) as its controlling owner: deleting
    the owner with propagation deletes it too."""
    uid = owner.get("metadata", {}).get("uid")
    if not uid:
        raise ValueError("an owner needs the uid the API server gave it")
    out = _copy(obj)
    out["metadata"]["ownerReferences"] = [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": owner["metadata"]["name"],
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    return out


def to_yaml(objects: Sequence[Mapping]) -> str:
    """The objects as one multi-document YAML stream, in order (``kubectl apply -f -`` reads it)."""
    return yaml.safe_dump_all([dict(o) for o in objects], sort_keys=False, explicit_start=True)


def _copy(value):
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
