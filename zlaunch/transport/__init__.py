"""How a process is started on a host and talked to: local subprocess, SSH channel, or a
Slurm step / mpirun process relaying its stdin and stdout (``--launcher slurm|mpi``), or an
agent that connects back over TCP (one srun for the whole allocation: ``--slurm-mode one-step``;
agents any scheduler places, dialing in: ``--launcher dialin``).
``k8s_manifest`` is the Kubernetes objects (Secret, headless Service, Indexed Job) of agents
that dial in from pods, pure.

A :class:`Link` is a running remote (or local) process with a byte stream each way plus its
stderr: the agent runs over one, ``zlaunch check`` runs its probe over one. Both transports
return the same kind of object, so the launcher has one code path for every host.
"""

from __future__ import annotations

from zlaunch.transport import k8s_manifest
from zlaunch.transport.dialin import (
    DIALIN_TIMEOUT,
    Placement,
    Rendezvous,
    Scheduler,
    dialin_hosts,
    open_dialin,
)
from zlaunch.transport.link import Link
from zlaunch.transport.mpi import mpirun_argv
from zlaunch.transport.slurm import allocation_hosts, in_allocation, job_id, srun_argv
from zlaunch.transport.slurm_one_step import ONE_STEP_ABOVE_NODES, one_step_argv
from zlaunch.transport.ssh import reachable
from zlaunch.transport.start import MAX_PARALLEL_CONNECTS, agent_argv, open_link, open_links

__all__ = [
    "DIALIN_TIMEOUT",
    "Link",
    "MAX_PARALLEL_CONNECTS",
    "ONE_STEP_ABOVE_NODES",
    "agent_argv",
    "k8s_manifest",
    "allocation_hosts",
    "in_allocation",
    "job_id",
    "mpirun_argv",
    "one_step_argv",
    "Placement",
    "Rendezvous",
    "Scheduler",
    "dialin_hosts",
    "open_dialin",
    "open_link",
    "open_links",
    "reachable",
    "srun_argv",
]
