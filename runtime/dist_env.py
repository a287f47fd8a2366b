"""Process-group setup from the launcher's environment.

RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT / LOCAL_RANK come from zlaunch (or torchrun, or
the DeepSpeed launcher). NCCL and ``cuda:LOCAL_RANK`` when CUDA is available, gloo and CPU
otherwise. A plain ``python train.py`` (none of those variables) becomes a world of one with an
in-process store, so single-process runs need no launcher.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import group_teardown

__all__ = ["DistEnv", "DistInitError", "init_distributed", "shutdown_distributed"]


class DistInitError(RuntimeError):
    """The distributed environment is missing or inconsistent."""


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str
    group: object = None
    """The data-parallel process group for runtime.comm.Communicator; None is the default
    (world) group, deliberately not held as an object: see runtime.group_teardown."""


def _env_int(name: str, default: int | None = None) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise DistInitError(
            f"environment variable {name} must be an integer, got {raw!r}"
        ) from None


def init_distributed(
    dist_init_required: bool | None = None, timeout_s: float | None = None
) -> DistEnv:
    """Initialise the default process group if needed and describe this rank."""
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    local_rank = _env_int("LOCAL_RANK", 0)
    if not dist.is_initialized():
        group_teardown.import_before_init()
        if dist_init_required is False:
            raise DistInitError(
                "dist_init_required=False but torch.distributed is not initialised; call "
                "torch.distributed.init_process_group first or pass dist_init_required=None"
            )
        rank = _env_int("RANK")
        world_size = _env_int("WORLD_SIZE")
        timeout = datetime.timedelta(seconds=timeout_s or 1800)
        if use_cuda:
            torch.cuda.set_device(local_rank)
        if rank is None and world_size is None:
            dist.init_process_group(
                backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
            )
        else:
            missing = [
                n
                for n in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                if not os.environ.get(n)
            ]
            if missing:
                raise DistInitError(
                    f"distributed environment incomplete: {', '.join(missing)} not set (start the "
                    "script with zlaunch, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)"
                )
            dist.init_process_group(backend, init_method="env://", timeout=timeout)
    group_teardown.tear_down_at_exit()
    backend = str(dist.get_backend()).lower()
    if backend == "nccl":
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
