"""Process-group setup from the launcher's environment, whichever launcher started the process.

Where the world comes from, first match wins (:func:`discover_world`, pure, over an env mapping):

1. ``RANK`` / ``WORLD_SIZE`` (zlaunch, torchrun, DeepSpeed's launcher), with ``MASTER_ADDR``,
   ``MASTER_PORT`` and ``LOCAL_RANK``.
2. Open MPI's ``mpirun``: ``OMPI_COMM_WORLD_RANK`` / ``_SIZE`` / ``_LOCAL_RANK``.
3. MPICH / Intel MPI (PMI): ``PMI_RANK`` / ``PMI_SIZE``, local rank ``MPI_LOCALRANKID`` —
   unless a Slurm step with the same task count says the same thing (``srun --mpi=pmi2`` sets
   both; Slurm's variables then give more).
4. Slurm's ``srun``: ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID``; rank 0's host is
   the first of ``SLURM_STEP_NODELIST`` (else ``SLURM_JOB_NODELIST``); the port is derived
   from the job and step ids (:func:`slurm_port`) unless ``MASTER_PORT`` is set.

MPI comes before Slurm because ``mpirun`` inside an allocation starts its daemons with ``srun``:
every rank then inherits ``SLURM_PROCID`` of its node's daemon, which is not its rank. For the
MPI launchers ``MASTER_ADDR`` names rank 0's host; without it, ranks all on one node use
127.0.0.1, and ranks on several nodes ask mpi4py (when installed) for rank 0's host name.

When a launcher says the world is larger than one but this process's rank (or rank 0's address)
cannot be found, :class:`DistInitError` names what is missing: N copies silently training alone
is the failure this module exists to prevent. Only with no launcher at all is the process a
world of one (in-process store), and it says so in one log line. ``WORLD_SIZE=1`` asks for a
world of one on purpose, inside an allocation too.

Backend: NCCL and ``cuda:LOCAL_RANK`` when CUDA is available, gloo and CPU otherwise.
"""

from __future__ import annotations

import datetime
import enum
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from runtime.errors import UsageError

from . import teardown as group_teardown
from .collective_timeout import CollectiveTimeoutError, collective_timeout_seconds

__all__ = [
    "DistEnv",
    "DistInitError",
    "Launcher",
    "World",
    "discover_world",
    "init_distributed",
    "shutdown_distributed",
    "slurm_port",
]

log = logging.getLogger("runtime.distributed.launch_env")

#: Ports derived from a job id fall in [PORT_BASE, PORT_BASE + PORT_SPAN): above the usual
#: service ports, below Linux's ephemeral range (32768-60999).
PORT_BASE, PORT_SPAN = 15000, 17000
DEFAULT_PORT = 29500


class DistInitError(UsageError):
    """The distributed environment is missing or inconsistent."""


class Launcher(enum.Enum):
    """What started this process, as far as its environment tells."""

    NONE = "no launcher"
    ENV = "RANK/WORLD_SIZE (zlaunch, torchrun)"
    OPENMPI = "Open MPI (mpirun)"
    PMI = "MPICH/PMI (mpiexec)"
    SLURM = "Slurm (srun)"


@dataclass(frozen=True)
class World:
    """Where this process stands, read from the environment by :func:`discover_world`."""

    launcher: Launcher
    rank: int
    world_size: int
    local_rank: int
    master_addr: str | None = None
    """Rank 0's host; None for a world of one (no store to reach)."""
    master_port: int | None = None
    note: str = ""
    """One line saying where the numbers came from, for the log."""


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str
    group: object = None
    """The data-parallel process group for runtime.distributed.comm.Communicator; None is the default
    (world) group, deliberately not held as an object: see runtime.distributed.teardown."""


# -- discovery (pure) -------------------------------------------------------------------------


def discover_world(
    env: Mapping[str, str], mpi_master: Callable[[], str | None] | None = None
) -> World:
    """This process's place in the job from ``env``; DistInitError when it cannot be known.

    ``mpi_master`` is asked for rank 0's host when MPI ranks span several nodes and
    ``MASTER_ADDR`` is not set (:func:`init_distributed` passes one that uses mpi4py).
    """
    if _present(env, "RANK", "WORLD_SIZE"):
        return _from_env(env)
    if _present(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        return _from_mpi(env, _OPENMPI, mpi_master)
    if _present(env, "PMI_RANK", "PMI_SIZE") and not _slurm_agrees_with_pmi(env):
        return _from_mpi(env, _PMI, mpi_master)
    if _present(env, "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_PROCID", "SLURM_NTASKS"):
        return _from_slurm(env)
    return World(
        Launcher.NONE,
        0,
        1,
        0,
        note="no launcher found (no RANK/WORLD_SIZE, SLURM_*, OMPI_COMM_WORLD_* or PMI_* "
        "variables): running as a world of one process",
    )


def slurm_port(job_id: int, step_id: int = 0) -> int:
    """The rendezvous port of a Slurm step: the same on every task of the step, different for
    steps of one job running side by side (up to 16), spread over PORT_SPAN ports by job id."""
    return PORT_BASE + (job_id * 16 + step_id % 16) % PORT_SPAN


def _from_env(env: Mapping[str, str]) -> World:
    world_size = _int(env, "WORLD_SIZE")
    rank = _int(env, "RANK")
    local_rank = _count(env, "LOCAL_RANK", 0)
    if (
        world_size == 1
        and rank in (None, 0)
        and not (env.get("MASTER_ADDR") and env.get("MASTER_PORT"))
    ):
        return World(Launcher.ENV, 0, 1, local_rank, note="WORLD_SIZE=1: a world of one process")
    missing = [n for n in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not env.get(n)]
    if missing:
        raise DistInitError(
            f"distributed environment incomplete: {', '.join(missing)} not set (start the "
            "script with zlaunch, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)"
        )
    assert rank is not None and world_size is not None
    _check_rank(rank, world_size, "RANK", "WORLD_SIZE")
    return World(
        Launcher.ENV,
        rank,
        world_size,
        local_rank,
        env["MASTER_ADDR"],
        _master_port(env),
        note=f"rank {rank} of {world_size} from RANK/WORLD_SIZE",
    )


@dataclass(frozen=True)
class _MpiVars:
    """Where an MPI launcher puts a process's place in the job."""

    launcher: Launcher
    program: str
    rank: str
    size: str
    local_rank: str
    local_size: str
    job: str | None
    """A job id the rendezvous port is derived from, when the launcher sets one."""
    local_rank_optional: bool
    """Without a local rank, ranks all on one node use their rank (MPICH leaves it out)."""


_OPENMPI = _MpiVars(
    Launcher.OPENMPI,
    "mpirun",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    job="OMPI_MCA_ess_base_jobid",
    local_rank_optional=False,
)
_PMI = _MpiVars(
    Launcher.PMI,
    "mpiexec",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    job=None,
    local_rank_optional=True,
)


def _from_mpi(
    env: Mapping[str, str], names: _MpiVars, mpi_master: Callable[[], str | None] | None
) -> World:
    what = names.launcher.value
    size, rank = _int(env, names.size), _int(env, names.rank)
    local_rank = _count(env, names.local_rank)
    if size is None:
        raise DistInitError(
            f"{what}: {names.rank} is set but {names.size} is not, so the world size is "
            f"unknown; start the script with {names.program}, or set RANK and WORLD_SIZE"
        )
    if size == 1 and rank in (None, 0):
        return World(names.launcher, 0, 1, 0, note=f"{what}: one process")
    _require(what, size, names.size, rank=(names.rank, rank))
    if not names.local_rank_optional:
        _require(what, size, names.size, rank=(names.local_rank, local_rank))
    assert rank is not None
    _check_rank(rank, size, names.rank, names.size)
    one_node = _int(env, names.local_size) == size
    if local_rank is None:
        if not one_node:
            raise DistInitError(
                f"{what}: {names.rank}={rank} of {names.size}={size} but {names.local_rank} is "
                "not set, so this rank's device on its node is unknown; set LOCAL_RANK (or use "
                f"mpiexec from MPICH/Intel MPI, which sets {names.local_rank})"
            )
        local_rank = rank
    addr = _mpi_master_addr(env, what, one_node, names.local_size, mpi_master)
    port, port_from = _port(env, names.job)
    return World(
        names.launcher,
        rank,
        size,
        local_rank,
        addr,
        port,
        note=f"{what}: rank {rank} of {size}, local rank {local_rank}, master {addr}:{port} "
        f"({port_from})",
    )


def _from_slurm(env: Mapping[str, str]) -> World:
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "?"
    what = f"Slurm job {job}"
    size_var = next(
        (n for n in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS") if env.get(n)), None
    )
    size = _int(env, size_var) if size_var else None
    rank = _int(env, "SLURM_PROCID")
    if not _present(env, "SLURM_STEP_ID", "SLURM_STEPID"):
        return _slurm_outside_a_step(env, what, size_var, size, rank)
    if size is None:
        raise DistInitError(
            f"{what}: SLURM_STEP_NUM_TASKS and SLURM_NTASKS are not set, so the number of "
            "tasks is unknown; start the script with srun, or set RANK and WORLD_SIZE"
        )
    if size == 1 and rank in (None, 0):
        return World(Launcher.SLURM, 0, 1, 0, note=f"{what}: one task")
    size_var = size_var or "SLURM_NTASKS"
    _require(what, size, size_var, rank=("SLURM_PROCID", rank))
    local_rank = _count(env, "SLURM_LOCALID")
    _require(what, size, size_var, rank=("SLURM_LOCALID", local_rank))
    assert rank is not None and local_rank is not None
    _check_rank(rank, size, "SLURM_PROCID", size_var)
    addr, addr_from = _slurm_master_addr(env, what, f"task {rank} of {size}")
    port, port_from = _slurm_master_port(env, what)
    return World(
        Launcher.SLURM,
        rank,
        size,
        local_rank,
        addr,
        port,
        note=f"{what}: task {rank} of {size}, local {local_rank}; master {addr} ({addr_from}), "
        f"port {port} ({port_from})",
    )


def _slurm_outside_a_step(
    env: Mapping[str, str], what: str, size_var: str | None, size: int | None, rank: int | None
) -> World:
    """A salloc shell or a batch script: one process, whatever the allocation holds, and an
    error when the allocation holds more (N copies would each train alone)."""
    nodes = (
        _int(env, "SLURM_STEP_NUM_NODES")
        or _int(env, "SLURM_JOB_NUM_NODES")
        or _int(env, "SLURM_NNODES")
    )
    if (size or 1) > 1 or (nodes or 1) > 1:
        held = f"{size_var}={size}" if size_var and (size or 1) > 1 else f"{nodes} nodes"
        raise DistInitError(
            f"{what} holds {held}, but this process is not a task of srun (no SLURM_STEP_ID"
            f"{'' if rank is not None else ', no SLURM_PROCID'}), so its rank is unknown: "
            "this is the allocation's shell or batch script, which runs one copy. Start "
            "the script with `srun python ...` (one task per rank) or with `zlaunch`; to "
            "run one process here on purpose, set WORLD_SIZE=1"
        )
    return World(Launcher.SLURM, 0, 1, 0, note=f"{what}: allocation shell, not a step: one process")


def _slurm_master_addr(env: Mapping[str, str], what: str, task: str) -> tuple[str, str]:
    """Rank 0's host (MASTER_ADDR, else the first host of the step's node list) and where it
    came from."""
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"], "MASTER_ADDR"
    names = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    list_var = next((n for n in names if env.get(n)), None)
    if list_var is None:
        raise DistInitError(
            f"{what}: {task}, but SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are not set, so "
            "rank 0's host is unknown; set MASTER_ADDR"
        )
    from zlaunch.wire import HostlistError, first_host

    try:
        return first_host(env[list_var]), f"first host of {list_var}"
    except HostlistError as exc:
        raise DistInitError(f"{what}: {list_var}: {exc}; set MASTER_ADDR") from None


def _slurm_master_port(env: Mapping[str, str], what: str) -> tuple[int, str]:
    """MASTER_PORT, else `slurm_port` of the job and step ids."""
    port = _master_port(env)
    if port is not None:
        return port, "MASTER_PORT"
    job_id = _int(env, "SLURM_JOB_ID" if env.get("SLURM_JOB_ID") else "SLURM_JOBID")
    if job_id is None:
        raise DistInitError(
            f"{what}: SLURM_JOB_ID is not set, so no port can be derived from it; set MASTER_PORT"
        )
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "0"
    # "batch" and "extern" steps have names, not numbers: they count as step 0
    step_id = int(step) if _DECIMAL.fullmatch(step) else 0
    return slurm_port(job_id, step_id), "from SLURM_JOB_ID and SLURM_STEP_ID"


def _slurm_agrees_with_pmi(env: Mapping[str, str]) -> bool:
    """``srun --mpi=pmi2`` sets PMI_RANK/PMI_SIZE equal to Slurm's own; ``mpiexec`` inside an
    allocation starts its proxies with srun, whose step counts nodes, not ranks."""
    if not _present(env, "SLURM_STEP_ID", "SLURM_STEPID"):
        return False
    steps = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS")
    return steps == env.get("PMI_SIZE") and env.get("SLURM_PROCID") == env.get("PMI_RANK")


def _mpi_master_addr(
    env: Mapping[str, str],
    what: str,
    one_node: bool,
    local_size_var: str,
    mpi_master: Callable[[], str | None] | None,
) -> str:
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"]
    if one_node:
        return "127.0.0.1"
    addr = mpi_master() if mpi_master is not None else None
    if addr:
        return addr
    raise DistInitError(
        f"{what}: the ranks run on several nodes ({local_size_var} is smaller than the world) "
        "and MASTER_ADDR is not set, so rank 0's host is unknown; pass it to every rank "
        "(mpirun -x MASTER_ADDR=<rank 0's host>), or install mpi4py so the ranks can ask"
    )


def _port(env: Mapping[str, str], job_var: str | None) -> tuple[int, str]:
    port = _master_port(env)
    if port is not None:
        return port, "MASTER_PORT"
    job = _int(env, job_var) if job_var else None
    if job is not None:
        return PORT_BASE + job % PORT_SPAN, f"from {job_var}"
    return DEFAULT_PORT, "default"


def _require(what: str, size: int, size_var: str, rank: tuple[str, int | None]) -> None:
    name, value = rank
    if value is None:
        raise DistInitError(
            f"{what}: {size_var}={size} but {name} is not set, so this process's place in the "
            f"job is unknown; start the script through the launcher itself (a wrapper that "
            f"drops {name} breaks it), or set RANK, LOCAL_RANK and WORLD_SIZE"
        )


def _check_rank(rank: int, size: int, rank_var: str, size_var: str) -> None:
    if size < 1:
        raise DistInitError(f"{size_var} must be at least 1, got {size}")
    if not 0 <= rank < size:
        raise DistInitError(f"{rank_var}={rank} is outside 0..{size - 1} ({size_var}={size})")


def _present(env: Mapping[str, str], *names: str) -> bool:
    return any(env.get(n) not in (None, "") for n in names)


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    """An integer variable: ASCII digits (``²`` or 5,000 digits are not a rank), else None
    for unset or blank, else DistInitError naming it."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip()
    if not _INTEGER.fullmatch(text):
        raise DistInitError(
            f"environment variable {name} must be an integer, got {raw[:40]!r}"
        ) from None
    return int(text)


def _count(env: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    """A rank or index variable: an integer >= 0."""
    value = _int(env, name, default)
    if value is not None and value < 0:
        raise DistInitError(f"environment variable {name} must be 0 or more, got {value}")
    return value


def _master_port(env: Mapping[str, str]) -> int | None:
    """MASTER_PORT as a TCP port (1-65535), None when unset or blank."""
    port = _int(env, "MASTER_PORT")
    if port is not None and not 1 <= port <= 65535:
        raise DistInitError(f"MASTER_PORT must be a TCP port (1-65535), got {port}")
    return port


_INTEGER = re.compile(r"[-+]?[0-9]{1,18}")
_DECIMAL = re.compile(r"[0-9]{1,18}")


def _env_int(name: str, default: int | None = None) -> int | None:
    return _int(os.environ, name, default)


def _mpi4py_master() -> str | None:
    """Rank 0's host name broadcast over MPI, or None without mpi4py."""
    try:
        from mpi4py import MPI  # type: ignore[import-not-found]
    except ImportError:
        return None
    import socket

    return MPI.COMM_WORLD.bcast(socket.gethostname(), root=0)


def cuda_index(local_rank: int, device_count: int) -> int:
    """The CUDA device of a local rank. When the launcher gave each task its own GPU (Slurm's
    ``--gpus-per-task``: one visible device), that one; otherwise the local rank's."""
    if device_count == 1:
        return 0
    if local_rank >= device_count:
        raise DistInitError(
            f"local rank {local_rank} has no GPU: this process sees {device_count} "
            "(CUDA_VISIBLE_DEVICES); start at most one rank per visible GPU on each node"
        )
    return local_rank


# -- process group --------------------------------------------------------------------------


def init_distributed(
    dist_init_required: bool | None = None, timeout_s: float | None = None
) -> DistEnv:
    """Initialise the default process group if needed and describe this rank."""
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    local_rank = _env_int("LOCAL_RANK", 0) or 0
    if not dist.is_initialized():
        group_teardown.import_before_init()
        if dist_init_required is False:
            raise DistInitError(
                "dist_init_required=False but torch.distributed is not initialised; call "
                "torch.distributed.init_process_group first or pass dist_init_required=None"
            )
        world = discover_world(os.environ, _mpi4py_master)
        local_rank = world.local_rank
        try:
            seconds = timeout_s or collective_timeout_seconds(os.environ)
        except CollectiveTimeoutError as err:
            raise DistInitError(str(err)) from None
        timeout = datetime.timedelta(seconds=seconds)
        # NCCL's rules: the device is chosen before the group exists, and named to it
        # (``device_id``), so the communicator is created now, bound to this rank's GPU,
        # instead of lazily at the first collective on whatever device is current then (and
        # a barrier does not have to guess the device).
        bound = {}
        if use_cuda:
            local_rank = cuda_index(local_rank, torch.cuda.device_count())
            torch.cuda.set_device(local_rank)
            bound = {"device_id": torch.device("cuda", local_rank)}
        if world.master_addr is None:  # a world of one: no store to reach
            if world.launcher is Launcher.NONE:
                log.warning("%s", world.note)
            else:
                log.info("%s", world.note)
            dist.init_process_group(
                backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, **bound
            )
        else:
            if world.launcher is not Launcher.ENV:
                log.info("%s", world.note)
                # What zlaunch would have set, for the script (LOCAL_RANK for its device) and
                # for env:// below; values the user set win.
                for name, value in (
                    ("RANK", world.rank),
                    ("WORLD_SIZE", world.world_size),
                    ("LOCAL_RANK", world.local_rank),
                    ("MASTER_ADDR", world.master_addr),
                    ("MASTER_PORT", world.master_port),
                ):
                    os.environ.setdefault(name, str(value))
            dist.init_process_group(backend, init_method="env://", timeout=timeout, **bound)
    group_teardown.tear_down_at_exit()
    backend = str(dist.get_backend()).lower()
    if backend == "nccl":
        # A group the script made itself: LOCAL_RANK's device, or the only one visible.
        local_rank = cuda_index(local_rank, torch.cuda.device_count())
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return DistEnv(
        rank=dist.get_rank(),
        local_rank=local_rank,
        world_size=dist.get_world_size(),
        device=device,
        backend=backend,
    )


def shutdown_distributed() -> None:
    """Leave the job cleanly before the process exits early (e.g. after a preemption save).

    Every rank waits for the others, then the process group is destroyed: exiting with the
    group's background threads still alive can abort the interpreter at shutdown.
    """
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
