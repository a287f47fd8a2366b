"""MPI transport: the agent of each node is started with Open MPI's ``mpirun`` (one process on
one host), for sites where mpirun is how jobs reach compute nodes.

For every node the controller runs, as a local subprocess::

    mpirun -np 1 --host NODE --bind-to none python -u -m zlaunch.agent

mpirun relays the agent's stdin (to its rank 0: the only one) and stdout, EOF included, so the
agent speaks the same frames as over SSH. How mpirun reaches the node is mpirun's business: its
daemons start through Slurm inside an allocation and over ssh otherwise, and the site's
``OMPI_MCA_*`` settings (interfaces, ssh agent, ``--allow-run-as-root``) apply as they do to
any mpirun. Hosts come from ``--hostfile``, or from the Slurm allocation zlaunch runs in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from zlaunch.job import Host
from zlaunch.transport.local import LocalLink, require_program

__all__ = ["MpiLink", "mpirun_argv"]


def mpirun_argv(
    host: str, argv: Sequence[str], extra: Sequence[str] = (), mpirun: str = "mpirun"
) -> list[str]:
    """The mpirun command line that starts ``argv`` (the agent) once on ``host``.

    ``--bind-to none``: Open MPI would pin the one process (and so every worker the agent
    starts) to one core.
    """
    return [mpirun, "-np", "1", "--host", host, "--bind-to", "none", *extra, *argv]


class MpiLink(LocalLink):
    """An agent started by mpirun on one node; the mpirun process is the controller's child."""

    @classmethod
    def start_on(
        cls,
        host: Host,
        argv: Sequence[str],
        environ: Mapping[str, str] | None = None,
        extra: Sequence[str] = (),
    ) -> MpiLink:
        environ = os.environ if environ is None else environ
        mpirun = require_program(
            "mpirun",
            environ,
            "mpi",
            "load Open MPI (module load openmpi), or use --hostfile over SSH",
        )
        return cls.start(host, mpirun_argv(host.name, argv, extra, mpirun=mpirun))
