"""The collectives a training script calls, as ``deepspeed.comm`` offers them.

Ported scripts write ``import deepspeed.comm as dist`` and call ``dist.get_rank()``,
``dist.barrier()`` or ``dist.all_reduce(t)``; here that is ``import runtime.dist as dist``.
``group=None`` is the runtime's data-parallel group (the world group, as in DeepSpeed). The
engine's own collectives go through runtime.distributed.comm (explicit group, byte
accounting); these are for the script's own tensors and are not counted in the step metrics.

Before the process group exists every function raises, naming the call that creates it.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as torch_dist

from runtime.errors import InvalidValueError, UsageError

__all__ = [
    "ReduceOp",
    "all_reduce",
    "barrier",
    "broadcast",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "is_initialized",
]

ReduceOp = torch_dist.ReduceOp


def _require() -> None:
    if not torch_dist.is_initialized():
        raise UsageError(
            "the process group is not initialised; call runtime.init_distributed() or "
            "runtime.initialize(...) first"
        )


def init_distributed(
    dist_backend: str | None = None,
    auto_mpi_discovery: bool = True,  # noqa: ARG001 - DeepSpeed's signature; zlaunch sets env
    distributed_port: int | None = None,  # noqa: ARG001 - MASTER_PORT comes from the launcher
    verbose: bool = True,  # noqa: ARG001
    timeout: Any = None,
    init_method: str | None = None,
    dist_init_required: bool | None = None,
    config: Any = None,  # noqa: ARG001
    rank: int = -1,
    world_size: int = -1,
) -> None:
    """Create the process group from the launcher's environment, as
    ``deepspeed.init_distributed()`` does; nothing happens when it already exists.

    The backend is NCCL with CUDA and gloo without; asking for another one is an error (not a
    silent substitution). Rank, world size and address come from the environment zlaunch (or
    torchrun, or DeepSpeed's launcher) sets; explicit ``rank``/``world_size``/``init_method``
    are refused for the same reason. ``timeout`` is a ``datetime.timedelta`` or seconds.
    """
    from runtime.distributed.launch_env import init_distributed as init

    if torch_dist.is_initialized():
        return
    expected = "nccl" if torch.cuda.is_available() else "gloo"
    if dist_backend is not None and str(dist_backend).lower() != expected:
        raise InvalidValueError(
            f"dist_backend={dist_backend!r}: this runtime uses {expected!r} on this machine; "
            "leave dist_backend out"
        )
    if init_method is not None or rank != -1 or world_size != -1:
        raise InvalidValueError(
            "init_method, rank and world_size come from the launcher's environment (RANK, "
            "WORLD_SIZE, MASTER_ADDR, MASTER_PORT); leave them out"
        )
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
    init(dist_init_required, seconds)


def is_initialized() -> bool:
    return torch_dist.is_initialized()


def get_rank(group=None) -> int:
    """This process's rank in `group` (default: the runtime's group)."""
    _require()
    return torch_dist.get_rank(group)


def get_world_size(group=None) -> int:
    """The number of ranks in `group` (default: the runtime's group)."""
    _require()
    return torch_dist.get_world_size(group)


def get_local_rank() -> int:
    """This process's rank on its node (LOCAL_RANK, set by the launcher; 0 without one)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def barrier(group=None) -> None:
    """Wait until every rank of `group` has called barrier."""
    _require()
    torch_dist.barrier(group=group)


def all_reduce(tensor: torch.Tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce `tensor` over `group` in place (SUM by default, as DeepSpeed). AVG works on gloo
    too (gloo has no AVG: sum, then divide). Returns the work handle when `async_op`."""
    _require()
    if op == ReduceOp.AVG and torch_dist.get_backend(group) == "gloo":
        work = torch_dist.all_reduce(tensor, op=ReduceOp.SUM, group=group, async_op=async_op)
        if async_op:
            work.wait()  # the division needs the sum; the caller still gets a finished handle
        tensor.div_(torch_dist.get_world_size(group))
        return work
    return torch_dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def broadcast(tensor: torch.Tensor, src: int, group=None, async_op: bool = False):
    """Copy rank `src`'s `tensor` to every rank of `group`, in place."""
    _require()
    return torch_dist.broadcast(tensor, src=src, group=group, async_op=async_op)
