"""``zlaunch k8s manifest``: the Kubernetes objects of a job whose agents dial in, as YAML.

For users who apply objects with their own tooling (``kubectl apply -f -``, Argo, Flux): the
same Secret, headless Service and Indexed Job as ``--launcher k8s`` creates through the API,
less the owner references (no uid exists before the objects are applied; each carries the label
``zlaunch/job: NAME``, and ``kubectl delete -f`` of the same file removes them all).
"""

from __future__ import annotations

import os
import secrets

import click

from zlaunch.errors import UsageError
from zlaunch.transport import k8s_manifest

__all__ = ["command"]

TOKEN_MIN, TOKEN_MAX = 32, 1024


def read_token(path: str) -> str:
    """The job's token from ``path``: one line, not empty (a trailing newline is dropped)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(TOKEN_MAX + 3)
    except OSError as err:
        raise UsageError(
            f"--token-file {path}: cannot read it ({err.strerror or err})",
            hint="write the job's token there first, e.g. "
            "python -c 'import secrets; print(secrets.token_hex(32))' > token; chmod 600 token",
        ) from None
    except UnicodeDecodeError:
        raise UsageError(f"--token-file {path}: not text", hint="the token is one line") from None
    token = text.rstrip("\r\n")
    # what the agent accepts from its --token-file: one line of printable characters
    if not TOKEN_MIN <= len(token) <= TOKEN_MAX or not all(33 <= ord(c) < 127 for c in token):
        raise UsageError(
            f"--token-file {path}: expected one line of {TOKEN_MIN}-{TOKEN_MAX} printable "
            "characters without spaces",
            hint="python -c 'import secrets; print(secrets.token_hex(32))' > token",
        )
    return token


def resource_options(fn):
    """What each pod asks for (shared with ``--launcher k8s``)."""
    fn = click.option(
        "--k8s-gpus", type=int, default=0, show_default=True, help="GPUs (nvidia.com/gpu) per pod."
    )(fn)
    fn = click.option(
        "--k8s-memory", default=None, help="Memory per pod, as Kubernetes writes it (64Gi)."
    )(fn)
    fn = click.option(
        "--k8s-cpu", default=None, help="CPUs per pod, as Kubernetes writes it (8, 500m)."
    )(fn)
    return fn


@click.group("k8s")
def command() -> None:
    """Kubernetes: the objects of a job whose agents dial in from pods."""


@command.command("manifest")
@click.option("--nodes", type=int, required=True, help="Pods: one agent (one node) each.")
@click.option("--image", required=True, help="The pods' image; it must have zlaunch installed.")
@click.option(
    "--connect",
    "address",
    required=True,
    metavar="HOST:PORT",
    help="Where the pods reach the controller's dial-in listener.",
)
@click.option(
    "--token-file",
    required=True,
    type=click.Path(dir_okay=False),
    help="The job's token (one line); the controller must be given the same file.",
)
@click.option("--namespace", default="default", show_default=True, help="The namespace.")
@click.option(
    "--k8s-name",
    default=None,
    help="Name of the Job, Secret and Service (pods are NAME-0, NAME-1, ...). "
    "Default: zlaunch- and 8 random hex digits.",
)
@click.option(
    "--k8s-python",
    default="python",
    show_default=True,
    help="The interpreter in the image that runs the agent.",
)
@resource_options
def manifest(
    nodes: int,
    image: str,
    address: str,
    token_file: str,
    namespace: str,
    k8s_name: str | None,
    k8s_python: str,
    k8s_cpu: str | None,
    k8s_memory: str | None,
    k8s_gpus: int,
) -> None:
    """Print the Secret, headless Service and Indexed Job as YAML (kubectl apply -f - reads it).

    \b
    zlaunch k8s manifest --nodes 4 --image reg/train:1 --connect 10.0.0.5:29400 \\
        --token-file token | kubectl apply -f -
    """
    job = k8s_manifest.K8sJob(
        name=k8s_name or f"zlaunch-{secrets.token_hex(4)}",
        namespace=namespace,
        image=image,
        nodes=nodes,
        address=address,
        resources=k8s_manifest.PodResources(cpu=k8s_cpu, memory=k8s_memory, gpus=k8s_gpus),
        python=k8s_python,
    )
    job.check()  # the options' own errors before the token file's
    token = read_token(os.path.expanduser(token_file))
    click.echo(k8s_manifest.to_yaml(k8s_manifest.job_objects(job, token)), nl=False)
