"""How many threads each rank's OpenMP (and so torch's CPU ops) uses when the user did not say.

Left unset, every rank of a node starts one thread per core, so N ranks on a node run N times
as many threads as it has cores and wait on each other (a CPU job ran 2-5x slower than under
torchrun, which sets 1 when it starts several processes per node). The default here is the
node's usable cores (its agent's ``os.sched_getaffinity``, said in its hello) divided by the
ranks on that node, at least 1. Whatever the user set wins: in the controller's environment
(forwarded to the ranks), in ``--env`` or in an env file, ``OMP_NUM_THREADS`` is theirs.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["THREADS_ENV", "default_threads", "thread_env", "threads_words"]

THREADS_ENV = "OMP_NUM_THREADS"


def default_threads(cpus: int, local_ranks: int) -> int:
    """Threads per rank: the node's usable cores shared out among its ranks, at least 1."""
    return max(1, cpus // max(1, local_ranks))


def thread_env(user_env: Mapping[str, str], cpus: int | None, local_ranks: int) -> dict[str, str]:
    """``{OMP_NUM_THREADS: n}`` for a node's ranks, or nothing where the user set it or the
    node's cores are unknown (an agent too old to say them)."""
    if THREADS_ENV in user_env or not cpus:
        return {}
    return {THREADS_ENV: str(default_threads(cpus, local_ranks))}


def threads_words(per_node: Sequence[tuple[str, int, int, str | None]]) -> str:
    """The start line's words on threads, from (host, cores, local ranks, value set or None)
    per node; "" when zlaunch set nothing (the user chose, or the cores are unknown)."""
    chosen = [(host, cpus, ranks, value) for host, cpus, ranks, value in per_node if value]
    if not chosen:
        return ""
    shapes = {(cpus, ranks, value) for _host, cpus, ranks, value in chosen}
    if len(shapes) == 1:
        cpus, ranks, value = shapes.pop()
        where = f"{cpus} cores / {ranks} rank{'s' if ranks != 1 else ''}"
    else:
        value = ", ".join(f"{v} on {host}" for host, _c, _r, v in chosen)
        where = "cores / ranks per node"
    return f"{THREADS_ENV}={value} ({where}; set it to choose)"
