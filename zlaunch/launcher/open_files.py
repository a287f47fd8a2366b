"""The controller's open-file limit, raised to what a job needs before it starts.

The controller holds a log file per rank and a connection (a socket, or a process's pipes) per
host, all at once. Many login shells start with a soft limit of 1,024 open files: a 1,024-rank
job would then lose rank logs (each said once, the job going on). The soft limit is raised
up to the hard one when the job needs more; when even the hard limit is too low, the job is
refused before anything starts, with the command that raises it.
"""

from __future__ import annotations

import resource

from zlaunch.errors import LaunchError

__all__ = ["open_files_needed", "ensure_open_files"]

PER_HOST = 3
"""Descriptors a host's connection takes: an ssh socket, or a local, srun or mpirun process's
three pipes."""
SPARE = 256
"""The run directory, the console, the controller lock, Python's own: asked for."""
MIN_SPARE = 64
"""What must be left beside the logs and connections, at least."""


def open_files_needed(ranks: int, hosts: int) -> int:
    return ranks + PER_HOST * hosts + SPARE


def ensure_open_files(ranks: int, hosts: int) -> None:
    """Raise the soft RLIMIT_NOFILE towards what ``ranks`` rank logs on ``hosts`` hosts need
    (no higher: the processes started here inherit it, and never above the hard limit);
    LaunchError if the hard limit cannot hold the logs and connections at all."""
    needed = open_files_needed(ranks, hosts)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed - SPARE + MIN_SPARE:
        raise LaunchError(
            f"this job needs about {needed} open files (a log per rank, {ranks} ranks, and "
            f"a connection per host, {hosts} hosts), more than this shell allows ({hard})",
            hint=f"raise the limit (ulimit -n {needed}; the hard limit is in "
            "/etc/security/limits.conf or the systemd unit) and run again",
        )
    if hard != resource.RLIM_INFINITY:
        needed = min(needed, hard)
    if needed > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
